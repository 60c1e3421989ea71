"""`python -m bench`: start a deployment, measure, print, write `$BENCH_OUT`, stop.

Environment: `BENCH_OUT` (default `bench-results.json`), `BENCH_SCALE` (multiplies every
warm-up and window; 1.0 takes three to four minutes), `BENCH_KEEP=1` keeps the deployment's
folder (logs under `<home>/logs`), which is otherwise kept only when something failed.
`BENCH_PHASES` (comma-separated, e.g. `run_path,decide`) measures only those phases: the
deployment still starts whole, and the other phases are skipped (`PHASES` lists them).
`BENCH_CAPS=1` gives every tenant spend caps covering all its runs (`bench/caps.py`), to
compare the run path's cost with caps on and off.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from bench.caps import caps_on, install_caps
from bench.http import http_path
from bench.mcp_read import mcp_read
from bench.phases import SCALE, Bench, BenchError
from bench.report import BenchReport
from bench.sessions import session_path
from bench.verify import journal_verify
from writ.stack import SERVICES, Stack

PHASES = (
    "journal_verify",
    "command_path",
    "run_path",
    "full_path",
    "decide",
    "mcp_read",
    "session_path",
)
_ONLY = frozenset(filter(None, os.environ.get("BENCH_PHASES", "").replace(" ", "").split(",")))


def _phase(report: BenchReport, name: str, phase: Callable[[], Awaitable[None]]) -> None:
    """Run one phase; a failure is recorded and the next phase still runs."""
    if _ONLY and name in PHASES and name not in _ONLY:
        report.data.setdefault("skipped", []).append(name)
        return
    try:
        anyio.run(phase)
    except Exception as exc:
        if not isinstance(exc, BenchError):
            traceback.print_exc()
        print(f"\n  {name} FAILED: {exc}", file=sys.stderr, flush=True)
        report.data.setdefault("errors", {})[name] = str(exc)[:2000]


def _run(stack: Stack, report: BenchReport) -> None:
    bench = Bench(stack, report)
    print("Starting nats-server and PostgreSQL…", flush=True)
    stack.start_infrastructure()
    anyio.run(stack.provision)
    report.data["spend_caps"] = caps_on()
    if caps_on():  # BENCH_CAPS=1: every tenant capped (bench/caps.py)
        print(f"Spend caps on for {', '.join(install_caps(stack))}", flush=True)
    _phase(report, "versions", bench.versions)
    _phase(report, "prepare", bench.prepare)
    # On a quiet machine, before the services start: it measures verify alone.
    _phase(report, "journal_verify", functools.partial(journal_verify, stack, report))
    print("\nStarting the simulated CRM and the six services…", flush=True)
    stack.start_crm()
    stack.start_host()
    stack.start_services()
    anyio.run(stack.wait_ready)
    bench.ports = {name: stack.metrics_port(name) for name in SERVICES}
    # BENCH_PHASES (comma-separated) runs only those: e.g. `BENCH_PHASES=http_path`.
    wanted = set(filter(None, os.environ.get("BENCH_PHASES", "").split(",")))
    for name, phase in (
        ("command_path", bench.command_path),
        ("run_path", bench.run_path),
        ("full_path", bench.full_path),
        ("http_path", lambda: http_path(bench)),
        ("decide", bench.decide),
        ("mcp_read", lambda: mcp_read(bench)),
        ("session_path", lambda: session_path(bench)),
    ):
        if not wanted or name in wanted:
            _phase(report, name, phase)
    bench.warnings()
    bench.conclude()


def main() -> int:
    """Run every measurement once; the deployment is stopped whatever happens."""
    out = Path(os.environ.get("BENCH_OUT", "bench-results.json"))
    home = Path(tempfile.mkdtemp(prefix="writ-bench-"))
    stack = Stack(home=home, database="bench", durable_pg=True)
    report = BenchReport()
    report.data.update(cpu_count=os.cpu_count(), scale=SCALE)
    if unknown := _ONLY - set(PHASES):
        print(
            f"BENCH_PHASES names no such phase: {sorted(unknown)}; phases: {PHASES}",
            file=sys.stderr,
        )
        return 2
    print(f"Writ bench: {os.cpu_count()} CPUs, deployment in {home}", flush=True)
    started = False
    try:
        _run(stack, report)
        started = True
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
    except Exception:  # the deployment itself did not come up
        traceback.print_exc()
        for name in stack.procs:
            tail = stack.log_tail(name, 1500)
            if tail.strip():
                print(f"--- {name} ---\n{tail}", file=sys.stderr)
    finally:
        print("\nStopping…", flush=True)
        stack.stop()
    ok = started and not report.data.get("errors")
    report.data["complete"] = ok
    if ok and os.environ.get("BENCH_KEEP") != "1":
        shutil.rmtree(home, ignore_errors=True)
    else:
        print(f"Deployment folder kept: {home} (logs in {home / 'logs'})", flush=True)
    report.write(out)
    print(f"Figures written to {out}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
