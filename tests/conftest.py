"""Session-wide real infrastructure: nats-server and PostgreSQL from their wheels.

`WRIT_TEST_NATS_URL` / `WRIT_TEST_DATABASE_URL` (an administrator DSN) point the suite at
existing servers instead; by default it starts its own on free loopback ports, so the machine's
own PostgreSQL and NATS are never touched.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import nats
import pytest
from nats.aio.client import Client

from libs.db import with_database
from libs.embedded import EmbeddedNats, EmbeddedPostgres


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def infra_home() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="writ-test-") as tmp:
        yield Path(tmp)


@pytest.fixture(scope="session")
def nats_server(infra_home: Path) -> Iterator[EmbeddedNats | None]:
    if os.environ.get("WRIT_TEST_NATS_URL"):
        yield None
        return
    server = EmbeddedNats(infra_home / "nats")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: EmbeddedNats | None) -> str:
    return nats_server.url if nats_server else os.environ["WRIT_TEST_NATS_URL"]


@pytest.fixture(scope="session")
def pg_server(infra_home: Path) -> Iterator[EmbeddedPostgres | None]:
    if os.environ.get("WRIT_TEST_DATABASE_URL"):
        yield None
        return
    # Tests trade fsync for speed; `make run` and `make bench` keep durable commits.
    server = EmbeddedPostgres(infra_home / "postgres", durable=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def admin_dsn(pg_server: EmbeddedPostgres | None) -> str:
    return pg_server.admin_url if pg_server else os.environ["WRIT_TEST_DATABASE_URL"]


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    client = await nats.connect(nats_url)
    yield client
    await client.drain()


@pytest.fixture
def unique() -> str:
    """A short unique token for naming streams, databases and requests in one test."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
async def scratch_db(admin_dsn: str, unique: str) -> AsyncIterator[str]:
    """A fresh database for one test; yields its administrator DSN."""
    name = f"t_{unique}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    yield with_database(admin_dsn, name)
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    await admin.close()
