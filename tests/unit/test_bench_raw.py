"""The bench's raw admission ceiling degrades to a reason when the shared script is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import raw

pytestmark = pytest.mark.anyio


async def test_a_checkout_without_the_shared_script_records_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "raw_ceiling.py"
    monkeypatch.setattr(raw, "RAW_CEILING", missing)
    found = await raw.raw_ceiling("postgresql://nowhere/x", seconds=0.1)
    assert found["raw_admission_tx_per_s"] is None
    assert str(missing) in found["error"] and "BENCH_RAW_CEILING" in found["error"]


async def test_a_script_that_fails_is_an_error_not_a_figure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    script = tmp_path / "raw_ceiling.py"
    script.write_text("import sys\nsys.exit('no server')\n")
    monkeypatch.setattr(raw, "RAW_CEILING", script)
    found = await raw.raw_ceiling("postgresql://nowhere/x", seconds=0.1)
    assert found["raw_admission_tx_per_s"] is None
    assert "exited 1" in found["error"] and "no server" in found["error"]


def test_the_peer_ratio_is_writs_runs_over_the_peers_at_32_in_flight() -> None:
    from bench.peers import ratio_lines

    peer = {
        "levels": [
            {"concurrency": 1, "runs_per_s": 30.0, "cpu_ms_per_run": {"total": 20.0}},
            {"concurrency": 32, "runs_per_s": 40.0, "cpu_ms_per_run": {"total": 26.0}},
        ]
    }
    writ = {"run_path_runs_per_s": 64.8, "run_path_cpu_ms_per_run": 13.0}
    [line] = ratio_lines(writ, {"LangGraph": peer})
    assert line.startswith("run path vs LangGraph: 1.62x (64.8 vs 40.0 runs/s at C=32")
    assert "C=1 p50" not in line  # Writ's lone run was not measured
    assert ratio_lines({}, {"DBOS": peer}) == ["run path vs DBOS: not measured"]
    peer["levels"][0]["p50_ms"] = 36.0
    full = {
        "full_path_runs_per_s": 20.0,
        "full_path_cpu_ms_per_run": 52.0,
        "full_path_c1_p50_ms": 61.0,
    }
    [line] = ratio_lines(full, {"LangGraph": peer}, key="full_path", label="full shape")
    assert line == (
        "full shape vs LangGraph: 0.50x (20.0 vs 40.0 runs/s at C=32; CPU per run "
        "52.0 vs 26.0 ms, 2.00x the peer's; C=1 p50 61.0 vs 36.0 ms)"
    )
