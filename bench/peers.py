"""`make bench-peers`: the peers' `crm` shape beside Writ's run path, in one sitting, and ratios.

The peers (`../shared/bench/peers/`, `BENCH_PEERS` names another folder) are not Writ's: they
run with their own interpreter (`BENCH_PEERS_PYTHON`, default `.tools/peers/bin/python`, which
the Makefile provisions from the peers' lock file), never with Writ's venv. Each writes its JSON
into `BENCH_PEERS_OUT` (default `bench-peers/`); Writ's run path is `python -m bench` with
`BENCH_PHASES=run_path`, written there as `writ-bench.json`. Then the peers' own table
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


def ratio_lines(writ: dict[str, Any], peers: dict[str, dict[str, Any]]) -> list[str]:
    """`run path vs <peer>: 1.62x` for each peer, with CPU per run beside it."""
    lines = []
    rate = writ.get("run_path_runs_per_s")
    cpu = writ.get("run_path_cpu_ms_per_run")
    for name, peer in peers.items():
        top = _top(peer)
        if not rate or not top.get("runs_per_s"):
            lines.append(f"run path vs {name}: not measured")
            continue
        peer_cpu = top["cpu_ms_per_run"]["total"]
        lines.append(f"run path vs {name}: {rate / top['runs_per_s']:.2f}x "
                     f"({rate} vs {top['runs_per_s']} runs/s at C={top['concurrency']}; CPU per "
                     f"run {cpu} vs {peer_cpu} ms, {cpu / peer_cpu:.2f}x the peer's)"
                     if cpu else f"run path vs {name}: {rate / top['runs_per_s']:.2f}x")
    return lines


def main() -> int:
    """Run both peers and Writ's run path, print the table and the ratios."""
    if not (PEERS / "compare.py").is_file():
        print(f"no peers at {PEERS} (set BENCH_PEERS)", file=sys.stderr)
        return 2
    if not PYTHON.is_file():
        print(f"no peers' interpreter at {PYTHON} (make bench-peers provisions it)",
              file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    extra = sys.argv[1:]  # e.g. --smoke, --levels 1,32
    peers: dict[str, dict[str, Any]] = {}
    for script, name in NAMES.items():
        out = OUT / f"{script.removesuffix('.py').removeprefix('peer_')}-crm.json"
        done = subprocess.run([str(PYTHON), str(PEERS / script), "--writ", str(ROOT),
                               "--shape", "crm", "--out", str(out), *extra], check=False)
        if done.returncode == 0 and out.is_file():
            peers[name] = json.loads(out.read_text())
        else:
            print(f"{name} failed ({done.returncode})", file=sys.stderr)
    writ_out = OUT / "writ-bench.json"
    subprocess.run([sys.executable, "-m", "bench"], cwd=ROOT, check=False,
                   env={**os.environ, "BENCH_PHASES": "run_path", "BENCH_OUT": str(writ_out)})
    writ = json.loads(writ_out.read_text()) if writ_out.is_file() else {}
    subprocess.run([str(PYTHON), str(PEERS / "compare.py"), str(OUT), str(writ_out)],
                   check=False)
    for line in ratio_lines(writ, peers):
        print(line, flush=True)
    return 0 if writ.get("run_path_runs_per_s") and len(peers) == len(NAMES) else 1


if __name__ == "__main__":
    sys.exit(main())
