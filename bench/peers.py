"""`make bench-peers`: the peers' `crm` and `full` shapes beside Writ's run path and full shape
(`bench/runs.py`), in one sitting, and ratios.

The peers (`../shared/bench/peers/`, `BENCH_PEERS` names another folder) are not Writ's: they
run with their own interpreter (`BENCH_PEERS_PYTHON`, default `.tools/peers/bin/python`, which
the Makefile provisions from the peers' lock file), never with Writ's venv. Each writes its JSON
into `BENCH_PEERS_OUT` (default `bench-peers/`); Writ's run path is `python -m bench` with
`BENCH_PHASES=run_path,full_path`, written there as `writ-bench.json`. Then the peers' own table
(`compare.py`) and one ratio line per peer: runs/s at 32 in flight, Writ over the peer, and
CPU per run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["main", "ratio_lines"]

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(os.environ.get("BENCH_PEERS", ROOT.parent / "shared" / "bench" / "peers"))
PYTHON = Path(os.environ.get("BENCH_PEERS_PYTHON", ROOT / ".tools" / "peers" / "bin" / "python"))
OUT = Path(os.environ.get("BENCH_PEERS_OUT", ROOT / "bench-peers"))
NAMES = {"peer_langgraph.py": "LangGraph", "peer_dbos.py": "DBOS"}


def _top(peer: dict[str, Any]) -> dict[str, Any]:
    by_c = {lv["concurrency"]: lv for lv in peer["levels"]}
    return by_c.get(32) or peer["levels"][-1]


def ratio_lines(
    writ: dict[str, Any],
    peers: dict[str, dict[str, Any]],
    *,
    key: str = "run_path",
    label: str = "run path",
) -> list[str]:
    """`run path vs <peer>: 1.62x` for each peer, with CPU per run and the latency of a lone
    run (C=1 p50) beside it; `key` is the Writ figures' prefix (`run_path`, `full_path`)."""
    lines = []
    rate = writ.get(f"{key}_runs_per_s")
    cpu = writ.get(f"{key}_cpu_ms_per_run")
    lone = writ.get(f"{key}_c1_p50_ms")
    for name, peer in peers.items():
        top = _top(peer)
        if not rate or not top.get("runs_per_s"):
            lines.append(f"{label} vs {name}: not measured")
            continue
        peer_cpu = top["cpu_ms_per_run"]["total"]
        one = next((lv for lv in peer["levels"] if lv["concurrency"] == 1), None)
        line = f"{label} vs {name}: {rate / top['runs_per_s']:.2f}x"
        if cpu:
            line += (
                f" ({rate} vs {top['runs_per_s']} runs/s at C={top['concurrency']}; CPU "
                f"per run {cpu} vs {peer_cpu} ms, {cpu / peer_cpu:.2f}x the peer's"
            )
            if lone and one is not None and one.get("p50_ms"):
                line += f"; C=1 p50 {lone} vs {one['p50_ms']} ms"
            line += ")"
        lines.append(line)
    return lines


# Each peer shape beside the Writ phase that runs the same work.
SHAPES = {"crm": ("run_path", "run path"), "full": ("full_path", "full shape")}


def main() -> int:
    """Run both peers and Writ's run path, print the table and the ratios."""
    if not (PEERS / "compare.py").is_file():
        print(f"no peers at {PEERS} (set BENCH_PEERS)", file=sys.stderr)
        return 2
    if not PYTHON.is_file():
        print(
            f"no peers' interpreter at {PYTHON} (make bench-peers provisions it)", file=sys.stderr
        )
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    extra = sys.argv[1:]  # e.g. --smoke, --levels 1,32
    peers: dict[str, dict[str, dict[str, Any]]] = {shape: {} for shape in SHAPES}
    for shape in SHAPES:
        for script, name in NAMES.items():
            peer = script.removesuffix(".py").removeprefix("peer_")
            out = OUT / f"{peer}-{shape}.json"
            done = subprocess.run(
                [
                    str(PYTHON),
                    str(PEERS / script),
                    "--writ",
                    str(ROOT),
                    "--shape",
                    shape,
                    "--out",
                    str(out),
                    *extra,
                ],
                check=False,
            )
            if done.returncode == 0 and out.is_file():
                peers[shape][name] = json.loads(out.read_text())
            else:
                print(f"{name} ({shape}) failed ({done.returncode})", file=sys.stderr)
    writ_out = OUT / "writ-bench.json"
    subprocess.run(
        [sys.executable, "-m", "bench"],
        cwd=ROOT,
        check=False,
        env={
            **os.environ,
            "BENCH_PHASES": ",".join(k for k, _ in SHAPES.values()),
            "BENCH_OUT": str(writ_out),
        },
    )
    writ = json.loads(writ_out.read_text()) if writ_out.is_file() else {}
    subprocess.run([str(PYTHON), str(PEERS / "compare.py"), str(OUT), str(writ_out)], check=False)
    for shape, (key, label) in SHAPES.items():
        for line in ratio_lines(writ, peers[shape], key=key, label=label):
            print(line, flush=True)
    complete = all(len(found) == len(NAMES) for found in peers.values())
    return 0 if writ.get("run_path_runs_per_s") and complete else 1


if __name__ == "__main__":
    sys.exit(main())
