"""The raw admission ceiling: the shared `raw_ceiling.py`, run by path against the bench's server.

The script is not Writ's (it lives beside the project, in `../shared/bench/`, and is the
reference every run compares with), so it is neither copied nor imported: it runs in its own
process with this interpreter (it needs only asyncpg) and prints one JSON object. A checkout
that cannot see it (a clean clone, CI) gets None and a message saying where it was looked for;
`BENCH_RAW_CEILING` names another path.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio

__all__ = ["RAW_CEILING", "raw_ceiling"]

RAW_CEILING = Path(
    os.environ.get(
        "BENCH_RAW_CEILING",
        Path(__file__).resolve().parents[1].parent / "shared" / "bench" / "raw_ceiling.py",
    )
)
RAW_CONNS = 8


async def raw_ceiling(dsn: str, *, seconds: float, conns: int = RAW_CONNS) -> dict[str, Any]:
    """One pass of the raw admission statement on `dsn`'s server: its JSON, or `error`."""
    if not await anyio.Path(RAW_CEILING).is_file():
        return {
            "raw_admission_tx_per_s": None,
            "error": f"{RAW_CEILING} not found (set BENCH_RAW_CEILING to raw_ceiling.py)",
        }
    try:
        done = await anyio.run_process(
            [
                sys.executable,
                str(RAW_CEILING),
                "--dsn",
                dsn,
                "--conns",
                str(conns),
                "--seconds",
                str(seconds),
            ],
            check=False,
        )
    except OSError as exc:
        return {"raw_admission_tx_per_s": None, "error": f"{RAW_CEILING}: {exc!r}"}
    if done.returncode != 0:
        return {
            "raw_admission_tx_per_s": None,
            "error": f"{RAW_CEILING} exited {done.returncode}: "
            + done.stderr.decode(errors="replace")[-500:],
        }
    try:
        lines = done.stdout.decode().strip().splitlines()
        return dict(json.loads(lines[-1]))
    except (ValueError, IndexError) as exc:
        return {"raw_admission_tx_per_s": None, "error": f"{RAW_CEILING}: no JSON: {exc!r}"}
