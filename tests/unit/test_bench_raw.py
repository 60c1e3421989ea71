"""The bench's raw admission ceiling degrades to a reason when the shared script is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import raw

pytestmark = pytest.mark.anyio


async def test_a_checkout_without_the_shared_script_records_why(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "raw_ceiling.py"
    monkeypatch.setattr(raw, "RAW_CEILING", missing)
    found = await raw.raw_ceiling("postgresql://nowhere/x", seconds=0.1)
    assert found["raw_admission_tx_per_s"] is None
    assert str(missing) in found["error"] and "BENCH_RAW_CEILING" in found["error"]


async def test_a_script_that_fails_is_an_error_not_a_figure(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = tmp_path / "raw_ceiling.py"
    script.write_text("import sys\nsys.exit('no server')\n")
    monkeypatch.setattr(raw, "RAW_CEILING", script)
    found = await raw.raw_ceiling("postgresql://nowhere/x", seconds=0.1)
    assert found["raw_admission_tx_per_s"] is None
    assert "exited 1" in found["error"] and "no server" in found["error"]
