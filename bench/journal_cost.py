"""What the audit journal costs on the hot path: governance recording a decision with the
journal off and on (and with the sealer running), on a fresh embedded PostgreSQL with durable
commits.

    .venv/bin/python -m bench.journal_cost          (BENCH_JOURNAL_S: seconds per window, 5)

Not part of `make bench`'s phases; its numbers are in docs/journal.md.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import anyio
import asyncpg

from libs.db import connect_pool, load_migrations, provision, role_name, with_database
from libs.embedded import EmbeddedPostgres
from libs.journal import DataKeys, Journal, Sealer, SigningKey
from services.governance.logic import Call, Ruling
from services.governance.store import GovernanceStore

CALL = Call(tool="writ.noop", family="write_delete", connector=None, agent="bench")
RULING = Ruling(verdict="allow", line=5, reason="standing grant for write_delete")
WINDOW_S = float(os.environ.get("BENCH_JOURNAL_S", "5"))
MIGRATIONS = Path(__file__).resolve().parent.parent / "services" / "governance" / "migrations"


async def _rate(store: GovernanceStore, concurrency: int) -> tuple[float, float]:
    """(decisions/s, p50 ms) of `record` in a closed loop."""
    latencies: list[float] = []
    deadline = time.perf_counter() + WINDOW_S

    async def worker() -> None:
        while (start := time.perf_counter()) < deadline:
            await store.record(
                tenant="acme",
                run_id="run-1",
                principal="alice",
                call=CALL,
                ruling=RULING,
                policy_version="v1",
            )
            latencies.append(time.perf_counter() - start)

    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    latencies.sort()
    return len(latencies) / WINDOW_S, latencies[len(latencies) // 2] * 1000


def _cpu_per_entry(journal: Journal, n: int = 20000) -> float:
    payload = {
        "decision_id": "0" * 36,
        "tenant": "acme",
        "run_id": "run-1",
        "agent": "bench",
        "verdict": "allow",
        "line": 5,
        "reason": RULING.reason,
        "policy_version": "v1",
    }
    start = time.perf_counter()
    for _ in range(n):
        journal.entry(
            tenant="acme", kind="decision", subject="0" * 36, run_id="run-1", payload=payload
        )
    return (time.perf_counter() - start) / n * 1e6


async def main(admin_dsn: str) -> None:
    """Measure and print."""
    passwords = await provision(
        admin_dsn, "journal_bench", {"governance": load_migrations("governance", MIGRATIONS)}
    )
    dsn = with_database(
        admin_dsn,
        "journal_bench",
        user=role_name("journal_bench", "governance"),
        password=passwords["governance"],
    )
    journal = Journal(service="governance", keys=DataKeys.from_json(DataKeys.generate("d1")))
    print(f"encrypt + AAD per entry (Python CPU): {_cpu_per_entry(journal):.1f} µs")
    async with await connect_pool(dsn, max_size=20) as pool:
        sealer = Sealer(pool=pool, journal=journal, signing=SigningKey.generate("g-1"))
        plain, journaled = GovernanceStore(pool), GovernanceStore(pool, journal=journal)
        for concurrency in (1, 16):
            off = await _rate(plain, concurrency)
            on = await _rate(journaled, concurrency)
            t0 = time.perf_counter()
            backlog = await sealer.seal_all()  # steady state below, not a catch-up
            catch_up = time.perf_counter() - t0
            async with anyio.create_task_group() as tg:
                await tg.start(sealer.run)
                sealing = await _rate(journaled, concurrency)
                tg.cancel_scope.cancel()
            print(
                f"concurrency {concurrency:>2}: journal off {off[0]:7.0f}/s p50 {off[1]:.2f} ms"
                f" | on {on[0]:7.0f}/s p50 {on[1]:.2f} ms ({on[0] / off[0] - 1:+.0%})"
                f" | on + sealer {sealing[0]:7.0f}/s p50 {sealing[1]:.2f} ms"
                f" ({sealing[0] / off[0] - 1:+.0%})",
                flush=True,
            )
            print(
                f"    sealer alone, catching up: {backlog} rows in {catch_up:.2f}s "
                f"({backlog / max(catch_up, 1e-9):.0f} rows/s)",
                flush=True,
            )
        lag = await sealer.seal_all()
        print(f"left unsealed after the last window: {lag} rows")
    conn = await asyncpg.connect(with_database(admin_dsn, "journal_bench"))
    try:
        size = await conn.fetchval(
            "SELECT pg_total_relation_size('governance.journal')::float / count(*) "
            "FROM governance.journal"
        )
        print(f"journal storage: {size:.0f} bytes per row (table + indexes)")
    finally:
        await conn.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="writ-journal-bench-") as home:
        server = EmbeddedPostgres(Path(home) / "postgres", durable=True)
        server.start()
        try:
            anyio.run(main, server.admin_url)
        finally:
            server.stop()
