"""`python -m bench.paired A B`: the same phases of `make bench` in two checkouts at once.

Two passes of one tree run minutes apart on a shared machine differ by up to a third in CPU per
run, in every process alike, nats-server and PostgreSQL included (docs/benchmarks.md): a
change smaller than that cannot be read from sequential passes. Run side by side, each
checkout's own deployment (its services, nats-server and Postgres) sees the same machine at the
same moment, so the ratio of their CPU per run holds where the absolute figures drift. Each
counts the other as "other processes"; throughput and latency are shared and not compared.

`A` and `B` are checkouts with a `.venv` (a `git worktree` with `.venv` linked to this one's
works). Environment: `BENCH_PHASES` (default `run_path,full_path`), `BENCH_SCALE` (default
0.7), `PAIRED_ROUNDS` (default 2; the checkouts start in turn first in each round).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

KEYS = ("run_path_cpu_ms_per_run", "full_path_cpu_ms_per_run")


def _round(checkouts: list[Path], out: Path, index: int) -> list[dict[str, Any]]:
    env = {
        **os.environ,
        "BENCH_PHASES": os.environ.get("BENCH_PHASES", "run_path,full_path"),
        "BENCH_SCALE": os.environ.get("BENCH_SCALE", "0.7"),
    }
    procs, files = [], []
    for n, checkout in enumerate(checkouts):
        result = out / f"{index}-{n}.json"
        log = (out / f"{index}-{n}.log").open("wb")
        procs.append(
            subprocess.Popen(
                [str(checkout / ".venv/bin/python"), "-m", "bench"],
                cwd=checkout,
                env={**env, "BENCH_OUT": str(result)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        files.append(result)
    for proc in procs:
        proc.wait()
    return [json.loads(f.read_text()) if f.exists() else {} for f in files]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = (Path(p).resolve() for p in argv)
    out = Path(tempfile.mkdtemp(prefix="writ-paired-"))
    rows: list[tuple[int, str, float, float]] = []
    for index in range(int(os.environ.get("PAIRED_ROUNDS", "2"))):
        order = [a, b] if index % 2 == 0 else [b, a]
        first, second = _round(order, out, index)
        got_a, got_b = (first, second) if order[0] == a else (second, first)
        for key in KEYS:
            if key in got_a and key in got_b:
                rows.append((index, key, float(got_a[key]), float(got_b[key])))
    print(f"A = {a}\nB = {b}\n(logs and figures in {out})")
    for index, key, x, y in rows:
        print(f"  round {index + 1}  {key:34s} A {x:8.2f}  B {y:8.2f}  B/A {y / x:5.2f}")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
