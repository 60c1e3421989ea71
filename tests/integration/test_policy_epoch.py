"""Governance's policy epoch against a real PostgreSQL: every change that could take an allow
back moves it in its own transaction, and what only adds to what may be allowed does not.

The dispatcher lets an admission's allow stand as its re-check only while the epoch read before
that `decide` is still the epoch in its claim, so a change that did not move it would be a
change the re-check never sees."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from libs.db import connect_pool, load_migrations, provision, role_name, with_database
from services.governance.logic import Call, decide
from services.governance.store import GovernanceStore

pytestmark = pytest.mark.anyio

MIGRATIONS = Path(__file__).resolve().parents[2] / "services" / "governance" / "migrations"
WRITE = Call(
    tool="payment.charge.create", family="write_delete", connector="payments", agent="billing"
)


@pytest.fixture
async def env(scratch_db: str) -> AsyncIterator[tuple[GovernanceStore, asyncpg.Connection]]:
    database = scratch_db.rsplit("/", 1)[1]
    passwords = await provision(
        scratch_db, database, {"governance": load_migrations("governance", MIGRATIONS)}
    )
    dsn = with_database(
        scratch_db,
        database,
        user=role_name(database, "governance"),
        password=passwords["governance"],
    )
    pool = await connect_pool(dsn)
    admin = await asyncpg.connect(scratch_db)
    yield GovernanceStore(pool), admin
    await admin.close()
    await pool.close()


async def _epoch(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT epoch FROM governance.policy_epoch"))


@pytest.mark.parametrize(
    "change",
    [
        "INSERT INTO governance.revocations (tenant, principal, revoked_by) "
        "VALUES ('acme', 'bob@acme', 'security@acme')",
        "INSERT INTO governance.rules (tenant, tool, arg_prefix, effect) "
        "VALUES ('acme', 'payment.charge.create', 'cus_', 'deny')",
        "INSERT INTO governance.policy (tenant, version) VALUES ('acme', 'v2')",
        "INSERT INTO governance.standing_grants (tenant, agent, family, granted_by) "
        "VALUES ('acme', 'billing', 'read', 'admin@acme')",
    ],
)
async def test_a_change_that_could_withdraw_an_allow_moves_the_epoch_at_commit(
    env: tuple[GovernanceStore, asyncpg.Connection], scratch_db: str, change: str
) -> None:
    _, admin = env
    reader = await asyncpg.connect(scratch_db)
    try:
        before = await _epoch(admin)
        async with admin.transaction():
            await admin.execute(change)
            # Not committed yet: nobody else sees a new epoch before they see the change.
            assert await _epoch(reader) == before
        assert await _epoch(reader) == before + 1
    finally:
        await reader.close()


async def test_removing_or_changing_grants_rules_runs_and_answers_moves_the_epoch(
    env: tuple[GovernanceStore, asyncpg.Connection],
) -> None:
    store, admin = env
    await admin.execute(
        "INSERT INTO governance.standing_grants (tenant, agent, family, "
        "granted_by) VALUES ('acme', 'billing', 'write_delete', 'admin@acme')"
    )
    await admin.execute(
        "INSERT INTO governance.runs (tenant, run_id, principal, agent, "
        "attended) VALUES ('acme', 'run-1', 'alice@acme', 'billing', false)"
    )
    await admin.execute(
        "INSERT INTO governance.run_grants (tenant, run_id, family, granted_by) "
        "VALUES ('acme', 'run-1', 'write_delete', 'alice@acme')"
    )
    for change in (
        "DELETE FROM governance.standing_grants WHERE agent = 'billing'",
        "DELETE FROM governance.run_grants WHERE run_id = 'run-1'",
        "UPDATE governance.runs SET attended = true WHERE run_id = 'run-1'",
        "TRUNCATE governance.rules",
    ):
        before = await _epoch(admin)
        await admin.execute(change)
        assert await _epoch(admin) == before + 1, change

    facts = await store.facts("acme", WRITE, "alice@acme", "run-1")
    ruling = decide(WRITE, facts)
    assert ruling.verdict == "ask"
    before = await _epoch(admin)
    pending_id = await store.record(
        tenant="acme",
        run_id="run-1",
        principal="alice@acme",
        call=WRITE,
        ruling=ruling,
        policy_version=facts.policy_version,
    )
    assert await _epoch(admin) == before  # a decision and a new ask withdraw nothing
    await store.answer(
        tenant="acme", pending_id=pending_id, answer="once", answered_by="approver@acme", reason=""
    )
    assert await _epoch(admin) == before + 1


async def test_registering_a_run_or_rolling_a_change_back_leaves_the_epoch_alone(
    env: tuple[GovernanceStore, asyncpg.Connection],
) -> None:
    _, admin = env
    before = await _epoch(admin)
    await admin.execute(
        "INSERT INTO governance.runs (tenant, run_id, principal, agent, "
        "attended) VALUES ('acme', 'run-2', 'alice@acme', 'billing', true)"
    )
    await admin.execute(
        "INSERT INTO governance.run_grants (tenant, run_id, family, granted_by) "
        "VALUES ('acme', 'run-2', 'write_delete', 'alice@acme')"
    )
    with pytest.raises(asyncpg.UniqueViolationError):
        async with admin.transaction():
            await admin.execute(
                "INSERT INTO governance.revocations (tenant, principal, "
                "revoked_by) VALUES ('acme', 'eve@acme', 'security@acme')"
            )
            await admin.execute(
                "INSERT INTO governance.revocations (tenant, principal, "
                "revoked_by) VALUES ('acme', 'eve@acme', 'security@acme')"
            )
    assert await _epoch(admin) == before
