"""Writ's pools against a real PostgreSQL: the session settings Writ's guarantees rest on."""

from __future__ import annotations

import collections
import random

import anyio
import asyncpg
import pytest

from libs.db import connect_pool
from libs.errors import waits_out

pytestmark = pytest.mark.anyio


async def test_commits_are_synchronous_even_where_the_server_says_otherwise(
    scratch_db: str,
) -> None:
    name = scratch_db.rsplit("/", 1)[1]
    admin = await asyncpg.connect(scratch_db)
    try:
        await admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    finally:
        await admin.close()
    plain = await asyncpg.connect(scratch_db)
    try:
        assert await plain.fetchval("SHOW synchronous_commit") == "off"
    finally:
        await plain.close()

    pool = await connect_pool(scratch_db, statement_timeout_ms=1234)
    try:
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
            assert await conn.fetchval("SHOW statement_timeout") == "1234ms"
    finally:
        await pool.close()


async def test_backends_terminated_mid_transaction_never_leave_a_stuck_connection_pooled(
    scratch_db: str,
) -> None:
    # Backends are terminated at random under transactions in flight (what a Postgres restart
    # does to a service). asyncpg now and then reports it as `InternalClientError: cannot
    # switch to state 15; another operation (2) is in progress` (the soak saw 10-21 per
    # service): every error must be one a delivery waits out, not a poison message headed for
    # the dead letters, and the pool must not keep a broken connection.
    pool = await connect_pool(scratch_db, max_size=8)
    admin = await asyncpg.connect(scratch_db)
    errors: collections.Counter[str] = collections.Counter()
    poison: list[BaseException] = []
    done = anyio.Event()
    rng = random.Random(7)

    async def work() -> None:
        while not done.is_set():
            try:
                async with pool.acquire() as conn, conn.transaction():
                    await conn.fetchval("SELECT pg_backend_pid()")
                    await anyio.sleep(rng.random() * 0.003)
                    await conn.fetchval("SELECT 1")
                    await conn.execute("SELECT pg_sleep(0.001)")
            except Exception as exc:  # noqa: BLE001 - each is classified below
                errors[type(exc).__name__] += 1
                if not waits_out(exc):
                    poison.append(exc)

    async def terminate() -> None:
        for _ in range(400):
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                "pid <> pg_backend_pid() AND datname = current_database() AND random() < 0.3"
            )
            await anyio.sleep(rng.random() * 0.01)
        done.set()

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(work)
            tg.start_soon(terminate)
        assert sum(errors.values()) > 0, "no backend was terminated under a statement"
        assert poison == []
        # Every connection the pool hands out now works: none was kept stuck.
        connections = [await pool.acquire() for _ in range(8)]
        try:
            assert [await c.fetchval("SELECT 1") for c in connections] == [1] * 8
        finally:
            for c in connections:
                await pool.release(c)
    finally:
        await admin.close()
        await pool.close()
