"""`python -m bench.cap_rows [CONCURRENCY] [SECONDS]`: governance's reservations of one
tenant's capped runs, contending on its cap rows, against its real store on an embedded,
durable PostgreSQL (fsync and synchronous commit on, as `make bench`).

CONCURRENCY runs (default 32) each reserve a model call (priced, held against a day and a
month cap that never refuse), then settle it with what it used, carrying the settlement in the
next reservation as the planner does, for SECONDS (default 20); then the same without a price
table (caps off). Prints reservations per second and this process's CPU per reservation, caps
off and on: the part of the run path's cost that the cap rows decide, without the five other
services and the bus around it (`BENCH_CAPS=1 make bench` measures the whole run path).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import anyio
import asyncpg

from libs.db import connect_pool, load_migrations, provision, role_name, with_database
from libs.embedded import EmbeddedPostgres
from libs.journal import DataKeys, Journal
from schemas.governance import BudgetReserved, RegisterRun, Settlement
from services import governance
from services.governance.budgets import Limits
from services.governance.spend import Cap, ModelPrice, PriceTable
from services.governance.store import GovernanceStore

__all__ = ["main"]

# Beside the store measured (the checkout whose `services` is imported).
MIGRATIONS = Path(governance.__file__).resolve().parent / "migrations"
MODEL = "openai/bench"


async def _pass(store: GovernanceStore, concurrency: int, seconds: float, tag: str) -> dict:
    for r in range(concurrency):
        await store.register_run(
            RegisterRun(tenant="acme", run_id=f"{tag}-{r}", principal="a@acme", agent="bench"),
            Limits(wall_time_s=3600, max_concurrent_steps=8, provider_calls=10**6, tokens=10**12),
        )
    done = timeouts = 0
    deadline = time.monotonic() + seconds

    async def run(r: int) -> None:
        nonlocal done, timeouts
        carried: list[Settlement] = []
        step = 0
        while time.monotonic() < deadline:
            try:
                held = await store.reserve(
                    tenant="acme",
                    run_id=f"{tag}-{r}",
                    step_key=f"{tag}-{r}:{step}:model",
                    provider_calls=1,
                    tokens=1_000,
                    model=MODEL,
                    settle=carried,
                )
            except asyncpg.QueryCanceledError:  # waited past the statement timeout (5 s)
                timeouts += 1
                continue
            assert isinstance(held, BudgetReserved), held
            carried = [Settlement(reservation_id=held.reservation_id, provider_calls=1, tokens=600)]
            step += 1
            done += 1

    cpu, wall = time.process_time(), time.monotonic()
    async with anyio.create_task_group() as tg:
        for r in range(concurrency):
            tg.start_soon(run, r)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    return {
        "reservations_per_s": round(done / wall, 1),
        "cpu_ms_per_reservation": round(1000 * cpu / max(done, 1), 3),
        "reservations": done,
        "statement_timeouts": timeouts,
    }


async def _main(concurrency: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="writ-cap-rows-") as home:
        server = EmbeddedPostgres(Path(home) / "postgres", durable=True)
        server.start()
        try:
            admin = await asyncpg.connect(server.admin_url)
            await admin.execute('CREATE DATABASE "caps"')
            await admin.close()
            url = with_database(server.admin_url, "caps")
            passwords = await provision(
                url, "caps", {"governance": load_migrations("governance", MIGRATIONS)}
            )
            dsn = with_database(
                url, "caps", user=role_name("caps", "governance"), password=passwords["governance"]
            )
            pool = await connect_pool(dsn, min_size=concurrency, max_size=concurrency)
            try:
                keys = DataKeys.from_json(DataKeys.generate("bench"))
                store = GovernanceStore(pool, journal=Journal(service="governance", keys=keys))
                figures = {"off": await _pass(store, concurrency, seconds, "off")}
                store.set_prices(
                    "acme",
                    PriceTable(
                        tenant="acme",
                        version="bench",
                        currency="EUR",
                        models={MODEL: ModelPrice(input_per_mtok="1", output_per_mtok="2")},
                        caps=[
                            Cap(name="bench-day", window="day", limit="1000000000"),
                            Cap(name="bench-month", window="month", limit="1000000000"),
                        ],
                    ),
                )
                figures["on"] = await _pass(store, concurrency, seconds, "on")
            finally:
                await pool.close()
        finally:
            server.stop()
    return figures


def main(argv: list[str]) -> int:
    concurrency = int(argv[0]) if argv else 32
    seconds = float(argv[1]) if len(argv) > 1 else 20.0
    print(json.dumps(anyio.run(_main, concurrency, seconds), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
