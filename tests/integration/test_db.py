"""Writ's pools against a real PostgreSQL: the session settings Writ's guarantees rest on."""

from __future__ import annotations

import asyncpg
import pytest

from libs.db import connect_pool

pytestmark = pytest.mark.anyio


async def test_commits_are_synchronous_even_where_the_server_says_otherwise(
        scratch_db: str) -> None:
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
