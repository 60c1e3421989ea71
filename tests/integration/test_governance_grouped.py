"""Governance's single `decide` requests, served as the service serves them (`BatchEndpoint`:
the requests that arrive while a batch is under way go in the next), on a real nats-server and
PostgreSQL: concurrent decides are recorded together, each with its decision row and its
journal row, and what cannot be recorded is denied."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import msgspec
import pytest
from nats.aio.client import Client
from nats.micro import add_service
from prometheus_client import CollectorRegistry

from libs.db import connect_pool, load_migrations, provision, role_name, with_database
from libs.journal import DataKeys, Journal
from libs.runtime import Batches, Runtime, in_tasks
from libs.telemetry import make_tracer_provider
from schemas import subjects
from schemas.governance import DecideRequest, Decision
from services.governance.logic import SENSITIVE_UNREADABLE
from services.governance.service import GovernanceService
from services.governance.store import GovernanceStore

pytestmark = pytest.mark.anyio

MIGRATIONS = Path(__file__).resolve().parents[2] / "services" / "governance" / "migrations"
CALLS = 12


class Env(msgspec.Struct, kw_only=True):
    nc: Client
    svc: GovernanceService
    admin: Any
    role: str
    decides: Batches  # the decide endpoint's requests in hand


@pytest.fixture
def nc(private_nc: Client) -> Client:
    """This module's requests go to a nats-server of its own (see conftest.py)."""
    return private_nc


@pytest.fixture
async def env(scratch_db: str, nc: Client, unique: str) -> AsyncIterator[Env]:
    database = scratch_db.rsplit("/", 1)[1]
    passwords = await provision(
        scratch_db, database, {"governance": load_migrations("governance", MIGRATIONS)}
    )
    role = role_name(database, "governance")
    pool = await connect_pool(
        with_database(scratch_db, database, user=role, password=passwords["governance"]), max_size=4
    )
    admin = await asyncpg.connect(scratch_db)
    await admin.execute(
        "INSERT INTO governance.standing_grants (tenant, agent, family, "
        "granted_by) VALUES ('acme', 'billing', 'write_delete', 'ops')"
    )
    rt = Runtime(
        name="governance",
        nc=nc,
        js=nc.jetstream(),
        registry=CollectorRegistry(),
        tracer_provider=make_tracer_provider("governance"),
    )
    journal = Journal(service="governance", keys=DataKeys.from_json(DataKeys.generate("d1")))
    svc = GovernanceService(rt=rt, store=GovernanceStore(pool, journal=journal))
    async with anyio.create_task_group() as tg:
        # As `libs.runtime.serve` does: each request in a task of its own, so they overlap.
        micro = await add_service(nc, name=f"writ-governance-{unique}", version="0.1.0")
        handlers = {}
        for endpoint in svc.endpoints():
            handlers[endpoint.name] = in_tasks(endpoint, tg, rt.metrics)
            await micro.add_endpoint(
                name=endpoint.name,
                subject=endpoint.subject,
                handler=handlers[endpoint.name],
                queue_group=f"test-{unique}",
            )
        assert isinstance(handlers["decide"], Batches)
        yield Env(nc=nc, svc=svc, admin=admin, role=role, decides=handlers["decide"])
        await micro.stop()
        tg.cancel_scope.cancel()
    await admin.close()
    await pool.close()


async def _decide(
    nc: Client, *, tool: str = "crm.note.create", run_id: str = "", agent: str = "billing"
) -> Decision:
    ask = DecideRequest(
        tenant="acme",
        principal="alice@acme",
        agent=agent,
        run_id=run_id or f"run-{uuid.uuid4().hex[:8]}",
        tool=tool,
    )
    reply = await nc.request(subjects.DECIDE, msgspec.json.encode(ask), timeout=10)
    return msgspec.json.decode(reply.data, type=Decision)


async def _concurrently(env: Env, asks: list[dict[str, str]]) -> list[Decision]:
    """Send `asks` at once while the decisions table is locked, so that none of them can be
    recorded until all of them wait to be: the batches under way (at most two) block on the
    lock, the rest queue for the next batch. Then unlock."""
    answers: list[Decision | None] = [None] * len(asks)

    async def one(i: int) -> None:
        answers[i] = await _decide(env.nc, **asks[i])

    await env.admin.execute("BEGIN; LOCK TABLE governance.decisions IN EXCLUSIVE MODE")
    try:
        async with anyio.create_task_group() as tg:
            for i in range(len(asks)):
                tg.start_soon(one, i)
            with anyio.fail_after(10):
                while (
                    env.decides.in_hand < len(asks)
                    or await env.admin.fetchval(
                        "SELECT count(*) FROM pg_locks WHERE NOT granted "
                        "AND relation = 'governance.decisions'::regclass"
                    )
                    == 0
                ):
                    await anyio.sleep(0.01)
            await env.admin.execute("ROLLBACK")
    finally:
        if env.admin.is_in_transaction():
            await env.admin.execute("ROLLBACK")
    assert all(a is not None for a in answers)
    return [a for a in answers if a is not None]


async def test_concurrent_decides_are_recorded_together_each_with_its_journal_row(env: Env) -> None:
    decisions = await _concurrently(env, [{} for _ in range(CALLS)])
    assert [(d.verdict, d.line) for d in decisions] == [("allow", 5)] * CALLS
    ids = [d.decision_id for d in decisions]
    assert len(set(ids)) == CALLS
    rows = await env.admin.fetch(
        "SELECT decision_id::text AS id, verdict, xmin::text AS tx FROM governance.decisions"
    )
    assert sorted(r["id"] for r in rows) == sorted(ids)
    assert {r["verdict"] for r in rows} == {"allow"}
    # Together: the batches that went first (at most two), and one holding everything that
    # waited behind them.
    assert len({r["tx"] for r in rows}) <= 3
    assert env.decides.batches <= 3 and env.decides.requests == CALLS
    journal = await env.admin.fetch(
        "SELECT subject, xmin::text AS tx FROM governance.journal WHERE kind = 'decision'"
    )
    assert sorted(j["subject"] for j in journal) == sorted(ids)
    # Each journal row was written in its decision's transaction.
    assert {(j["subject"], j["tx"]) for j in journal} == {(r["id"], r["tx"]) for r in rows}


async def test_one_call_that_cannot_be_recorded_is_denied_and_the_others_recorded(env: Env) -> None:
    """A row Postgres refuses (here: a constraint against its run id) fails the transaction it
    is grouped in: each of the others is recorded again on its own, and that one is denied."""
    bad = "run-refused"
    await env.admin.execute(
        f"ALTER TABLE governance.decisions ADD CONSTRAINT refused CHECK (run_id <> '{bad}')"
    )
    asks: list[dict[str, Any]] = [{} for _ in range(CALLS - 1)] + [{"run_id": bad}]
    decisions = await _concurrently(env, asks)
    assert [(d.verdict, d.line) for d in decisions[:-1]] == [("allow", 5)] * (CALLS - 1)
    assert (decisions[-1].verdict, decisions[-1].reason) == ("deny", SENSITIVE_UNREADABLE)
    recorded = {
        r["id"]
        for r in await env.admin.fetch("SELECT decision_id::text AS id FROM governance.decisions")
    }
    journaled = {
        r["subject"]
        for r in await env.admin.fetch(
            "SELECT subject FROM governance.journal WHERE kind = 'decision'"
        )
    }
    assert recorded == journaled == {d.decision_id for d in decisions[:-1]}


async def test_decisions_that_cannot_be_recorded_are_denied_reads_excepted(env: Env) -> None:
    await env.admin.execute(f'REVOKE INSERT ON governance.decisions FROM "{env.role}"')
    decisions = await _concurrently(env, [{} for _ in range(CALLS)])
    assert {(d.verdict, d.line, d.reason) for d in decisions} == {("deny", 1, SENSITIVE_UNREADABLE)}
    read = await _decide(env.nc, tool="documents.search")  # a plain read is still allowed
    assert (read.verdict, read.line) == ("allow", 3)
    assert await env.admin.fetchval("SELECT count(*) FROM governance.decisions") == 0
    assert await env.admin.fetchval("SELECT count(*) FROM governance.journal") == 0
