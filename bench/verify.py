"""How fast `writ audit verify` checks a journal: rows per second over at least 100,000 sealed
rows, held against their record in JetStream, with and without the data keys.

`make bench` runs it on its deployment before the services start (its own schema and record
stream, so nothing else is measured with it); `python -m bench.verify` runs it alone on an
embedded deployment (`BENCH_VERIFY_ROWS`, default 100,000).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import msgspec
import nats

from bench.report import BenchReport
from libs.bus import ensure_streams
from libs.db import connect_pool
from libs.journal import (
    DataKeys,
    JetStreamRecord,
    Journal,
    Sealer,
    SigningKey,
    load_verify_keys,
    verify,
)
from writ.stack import Stack

__all__ = ["journal_verify"]

ROWS = int(os.environ.get("BENCH_VERIFY_ROWS", "100000"))
SCHEMA = "bench_journal"
_SQL = Path(__file__).resolve().parent.parent / "libs"


async def journal_verify(stack: Stack, report: BenchReport, rows: int = ROWS) -> None:
    """Write and seal `rows` journal rows, then time `verify` over them."""
    report.section(f"writ audit verify ({rows:,} sealed rows, record in JetStream)")
    dsn = stack.database_dsn
    admin = await asyncpg.connect(dsn)
    nc = await nats.connect(stack.nats_url)
    try:
        await admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}")
        for name in ("journal", "journal_rejected"):
            sql = (_SQL / f"{name}.sql").read_text().replace("{schema}", SCHEMA)
            await admin.execute(sql.split("GRANT SELECT, INSERT")[0])
        journal = Journal(
            service="bench", schema=SCHEMA, keys=DataKeys.from_json(DataKeys.generate("d1"))
        )
        signing = SigningKey.generate("bench-1")
        record = JetStreamRecord(
            nc.jetstream(), stream="BENCH_AUDIT", subject=lambda s: f"bench.audit.checkpoints.{s}"
        )
        await ensure_streams(nc.jetstream(), [record.spec()])
        started = time.perf_counter()
        for start in range(0, rows, 5000):  # bulk: only verify is measured here
            async with admin.transaction():
                await admin.executemany(
                    journal.insert_sql,
                    [
                        msgspec.structs.astuple(
                            journal.entry(
                                tenant="acme",
                                kind="decision",
                                subject=f"d-{n}",
                                run_id=f"run-{n % 97}",
                                payload={"n": n, "verdict": "allow"},
                            )
                        )
                        for n in range(start, min(start + 5000, rows))
                    ],
                )
        written = time.perf_counter() - started
        pool = await connect_pool(dsn, max_size=2)
        try:
            started = time.perf_counter()
            sealed = await Sealer(
                pool=pool, journal=journal, signing=signing, record=record, batch=2000
            ).seal_all()
            sealing = time.perf_counter() - started
        finally:
            await pool.close()
        keys = load_verify_keys(msgspec.json.encode({"bench": {"bench-1": signing.public_pem()}}))
        figures: dict[str, Any] = {
            "rows": sealed,
            "write_s": round(written, 2),
            "seal_rows_per_s": round(sealed / sealing),
        }
        for label, data_keys in (("", None), ("_with_data_keys", journal)):
            started = time.perf_counter()
            result = await verify(
                admin, service="bench", schema=SCHEMA, keys=keys, record=record, journal=data_keys
            )
            seconds = time.perf_counter() - started
            if not result.ok or result.entries != rows:
                raise RuntimeError(f"verify did not find the bench journal intact: {result}")
            figures[f"verify{label}_rows_per_s"] = round(rows / seconds)
            figures[f"verify{label}_s"] = round(seconds, 2)
        report.line(
            "sealed",
            f"{figures['seal_rows_per_s']:9,} rows/s ({result.checkpoints} checkpoints recorded)",
        )
        report.line(
            "verify (public keys + record)",
            f"{figures['verify_rows_per_s']:9,} rows/s   ({figures['verify_s']} s)",
        )
        report.line(
            "verify --data-keys (payloads authenticated too)",
            f"{figures['verify_with_data_keys_rows_per_s']:9,} rows/s   "
            f"({figures['verify_with_data_keys_s']} s)",
        )
        report.data["journal_verify"] = figures
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        await admin.close()
        with contextlib.suppress(Exception):  # a stream of its own, gone with its journal
            await nc.jetstream().delete_stream("BENCH_AUDIT")
        await nc.close()


def main() -> None:
    """Alone, on an embedded deployment (no services)."""
    with tempfile.TemporaryDirectory(prefix="writ-bench-verify-") as home:
        stack = Stack(Path(home), database="bench", durable_pg=True)
        try:
            stack.start_infrastructure()
            anyio.run(stack.provision)
            anyio.run(journal_verify, stack, BenchReport())
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
