"""The planner's sweepers claim stalled runs with `FOR UPDATE SKIP LOCKED` on a real PostgreSQL:
several sweepers racing, each on its own connection as the planner's role, take every stalled
run exactly once between them (a run one claims is touched, so no other takes it until it
stalls again), runs waiting for a person only once their answer is recorded, and a run a
delivery holds locked is passed by, not waited for."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import asyncpg
import pytest

from libs.db import load_migrations, provision, role_name, with_database
from services.planner.store import claim_answered, claim_stalled, last_refusal, pending_answer

pytestmark = pytest.mark.anyio

SERVICES = Path(__file__).resolve().parents[2] / "services"
RUNS = 300
SWEEPERS = 6
Claim = Callable[..., Awaitable[list[tuple[str, str]]]]


@pytest.fixture
async def dbs(scratch_db: str) -> AsyncIterator[tuple[str, str]]:
    """(the administrator's DSN, the planner role's DSN) of a database of every service."""
    database = scratch_db.rsplit("/", 1)[1]
    passwords = await provision(
        scratch_db,
        database,
        {
            name: load_migrations(name, SERVICES / name / "migrations")
            for name in ("planner", "governance", "admission", "dispatcher")
        },
    )
    yield (
        scratch_db,
        with_database(
            scratch_db, database, user=role_name(database, "planner"), password=passwords["planner"]
        ),
    )


async def _runs(admin: asyncpg.Connection, status: str, n: int, prefix: str) -> list[str]:
    ids = [f"{prefix}-{i}" for i in range(n)]
    await admin.executemany(
        "INSERT INTO planner.runs (run_id, tenant, request_id, principal, agent, input, "
        "evidence, status, touched_at) "
        "VALUES ($1, 'acme', $1, 'ops@acme', 'crm-assistant', 'x', '[]', $2, "
        "now() - interval '1 hour')",
        [(i, status) for i in ids],
    )
    return ids


async def _answered(admin: asyncpg.Connection, run_id: str, *, answer: str | None) -> str:
    """A read the run waits on, asked of a person: answered `answer` (None: not yet)."""
    pending, decided = str(uuid.uuid4()), str(uuid.uuid4())
    for decision_id, verdict in ((pending, "ask"), (decided, "allow")):
        await admin.execute(
            "INSERT INTO governance.decisions (decision_id, tenant, run_id, agent, principal, "
            "tool, family, verdict, line, reason, policy_version) VALUES "
            "($1, 'acme', $2, 'crm-assistant', 'ops@acme', 'crm.customer.get', 'read', $3, 4, "
            "'asked', 'v1')",
            decision_id,
            run_id,
            verdict,
        )
    await admin.execute(
        "INSERT INTO governance.pending (pending_id, tenant, run_id, agent, principal, tool, "
        "family, first_argument, reason, options, attended, answer, answered_by, "
        "answer_decision_id) VALUES ($1, 'acme', $2, 'crm-assistant', 'ops@acme', "
        "'crm.customer.get', 'read', 'ACME-42', 'asked', '{once,deny}', false, $3, "
        "CASE WHEN $3::text IS NULL THEN NULL ELSE 'ann@acme' END, "
        "CASE WHEN $3::text IS NULL THEN NULL ELSE $4::uuid END)",
        pending,
        run_id,
        answer,
        decided,
    )
    await admin.execute(
        "UPDATE planner.runs SET pending_id = $2 WHERE run_id = $1", run_id, pending
    )
    return pending


async def _race(dsn: str, claim: Claim) -> Counter[str]:
    """Every sweeper claims small batches at once, until none finds anything more."""
    taken: Counter[str] = Counter()
    conns = [await asyncpg.connect(dsn) for _ in range(SWEEPERS)]
    start = anyio.Event()

    async def sweeper(conn: asyncpg.Connection) -> None:
        await start.wait()
        while claimed := await claim(conn, stall_s=60.0, limit=7):
            taken.update(run_id for _, run_id in claimed)

    try:
        async with anyio.create_task_group() as tg:
            for conn in conns:
                tg.start_soon(sweeper, conn)
            await anyio.sleep(0.1)
            start.set()
    finally:
        for conn in conns:
            await conn.close()
    return taken


async def test_racing_sweepers_claim_each_stalled_run_once(dbs: tuple[str, str]) -> None:
    admin_dsn, planner_dsn = dbs
    admin = await asyncpg.connect(admin_dsn)
    try:
        stalled = await _runs(admin, "running", RUNS, "run")
        await _runs(admin, "succeeded", 20, "done")  # ended: never claimed
        taken = await _race(planner_dsn, claim_stalled)
        assert set(taken) == set(stalled)
        assert max(taken.values()) == 1, taken.most_common(3)
        # Claimed, each was touched: a sweep right after finds none stalled.
        conn = await asyncpg.connect(planner_dsn)
        try:
            assert await claim_stalled(conn, stall_s=60.0, limit=RUNS) == []
        finally:
            await conn.close()
    finally:
        await admin.close()


async def test_racing_sweepers_claim_each_answered_wait_once(dbs: tuple[str, str]) -> None:
    admin_dsn, planner_dsn = dbs
    admin = await asyncpg.connect(admin_dsn)
    try:
        waiting = await _runs(admin, "awaiting_human", RUNS // 3, "wait")
        answered = waiting[: len(waiting) // 2]
        for run_id in waiting:
            await _answered(admin, run_id, answer="once" if run_id in answered else None)
        taken = await _race(planner_dsn, claim_answered)
        # Only the waits a person answered, each once; the others still wait for theirs.
        assert set(taken) == set(answered)
        assert max(taken.values()) == 1, taken.most_common(3)
        conn = await asyncpg.connect(planner_dsn)
        try:
            found = await pending_answer(conn, "acme", answered[0])
            assert found is not None and (found.answer, found.answered_by, found.line) == (
                "once",
                "ann@acme",
                4,
            )
            assert await pending_answer(conn, "acme", waiting[-1]) is None
        finally:
            await conn.close()
    finally:
        await admin.close()


async def _proposed(admin: asyncpg.Connection, run_id: str, state: str) -> None:
    """The run's step 0 proposed a command, approved by a person, now in `state`."""
    proposal = str(uuid.uuid4())
    await admin.execute(
        "INSERT INTO planner.steps (run_id, seq, kind, payload) VALUES ($1, 0, 'decision', '{}')",
        run_id,
    )
    await admin.execute(
        "INSERT INTO admission.proposals (tenant, proposal_id, run_id, step, principal, agent, "
        "action, action_version, arguments, request_hash, state) VALUES ('acme', $1, $2, 0, "
        "'ops@acme', 'crm-assistant', 'payment.refund', 1, '{}', '\\x00', 'completed')",
        proposal,
        run_id,
    )
    await admin.execute(
        "INSERT INTO admission.commands (tenant, operation_id, proposal_id, run_id, step, "
        "principal, agent, action, action_version, arguments, request_hash, decision_id, "
        "decision_line, policy_version, expires_at, state) VALUES ('acme', $1, $2, $3, 0, "
        "'ops@acme', 'crm-assistant', 'payment.refund', 1, '{}', '\\x00', $1, 4, 'v1', "
        "now() + interval '1 hour', $4)",
        str(uuid.uuid4()),
        proposal,
        run_id,
        state,
    )


async def test_a_wait_whose_approved_command_ended_is_claimed_and_one_in_flight_is_not(
    dbs: tuple[str, str],
) -> None:
    admin_dsn, planner_dsn = dbs
    admin = await asyncpg.connect(admin_dsn)
    sweeper = await asyncpg.connect(planner_dsn)
    try:
        ended, running, pending = await _runs(admin, "awaiting_human", 3, "refund")
        await _proposed(admin, ended, "succeeded")
        await _proposed(admin, running, "dispatching")  # the dispatcher's sweeper has it
        await _proposed(admin, pending, "pending")
        assert await claim_answered(sweeper, stall_s=60.0, limit=10) == [("acme", ended)]
        assert await claim_answered(sweeper, stall_s=60.0, limit=10) == []  # touched
    finally:
        await admin.close()
        await sweeper.close()


async def test_a_sweeper_passes_by_a_run_a_delivery_holds_locked(dbs: tuple[str, str]) -> None:
    admin_dsn, planner_dsn = dbs
    admin = await asyncpg.connect(admin_dsn)
    delivery = await asyncpg.connect(planner_dsn)
    sweeper = await asyncpg.connect(planner_dsn)
    try:
        held, free = await _runs(admin, "running", 2, "held")
        async with delivery.transaction():
            await delivery.execute("SELECT 1 FROM planner.runs WHERE run_id = $1 FOR UPDATE", held)
            with anyio.fail_after(5):  # skipped at once, not waited for
                claimed = await claim_stalled(sweeper, stall_s=60.0, limit=10)
        assert claimed == [("acme", free)]
        assert await claim_stalled(sweeper, stall_s=60.0, limit=10) == [("acme", held)]
    finally:
        for conn in (admin, delivery, sweeper):
            await conn.close()


async def _refused(
    admin: asyncpg.Connection, run_id: str, state: str, reason: str, *, answered: bool = False
) -> tuple[str, str]:
    """The run's step 0 proposed a refund that admission did not admit: left in `state` with
    `reason` (`answered`: a person's answer to its ask recorded by governance); (the decision
    that asked or refused, the answer's decision)."""
    decision, answer = str(uuid.uuid4()), str(uuid.uuid4())
    await admin.execute(
        "INSERT INTO planner.steps (run_id, seq, kind, payload) VALUES ($1, 0, 'decision', '{}')",
        run_id,
    )
    await admin.execute(
        "INSERT INTO admission.proposals (tenant, proposal_id, run_id, step, principal, agent, "
        "action, action_version, arguments, request_hash, state, decision_id, reason, "
        "public_id, preview, expires_at) VALUES ('acme', $1, $2, 0, 'ops@acme', "
        "'refund-assistant', 'payment.refund', 1, '{\"secret\": 1}', '\\x00', $3, $4, $5, $6, "
        "'{\"amount\": 12}', now() + interval '1 hour')",
        str(uuid.uuid4()),
        run_id,
        state,
        decision,
        reason,
        f"prop_{run_id}",
    )
    if answered:
        await admin.execute(
            "INSERT INTO governance.decisions (decision_id, tenant, run_id, agent, principal, "
            "tool, family, verdict, line, reason, policy_version) VALUES ($1, 'acme', $2, "
            "'refund-assistant', 'ops@acme', 'payment.refund', 'action', 'ask', 4, 'asked', 'v1')",
            decision,
            run_id,
        )
        await admin.execute(
            "INSERT INTO governance.pending (pending_id, tenant, run_id, proposal_id, agent, "
            "principal, tool, family, first_argument, reason, options, attended, answer, "
            "answered_by, answer_reason, answer_decision_id) VALUES ($1, 'acme', $2, "
            "$3, 'refund-assistant', 'ops@acme', 'payment.refund', 'action', 'pay_1', 'asked', "
            "'{once,deny}', false, 'deny', 'nobody', 'no answer in time', $4)",
            decision,
            run_id,
            f"prop_{run_id}",
            answer,
        )
    return decision, answer


async def test_a_wait_whose_proposal_was_refused_is_claimed_and_read_as_its_message(
    dbs: tuple[str, str],
) -> None:
    admin_dsn, planner_dsn = dbs
    admin = await asyncpg.connect(admin_dsn)
    sweeper = await asyncpg.connect(planner_dsn)
    try:
        rejected, expired, asked = await _runs(admin, "awaiting_human", 3, "refused")
        denied = (await _runs(admin, "running", 1, "denied"))[0]
        _, by_person = await _refused(admin, rejected, "rejected", "rejected by ann@acme: no")
        _, by_clock = await _refused(admin, expired, "expired", "expired", answered=True)
        pending, _ = await _refused(admin, asked, "pending", "a person decides refunds")
        by_policy, _ = await _refused(admin, denied, "rejected", "refunds over 500 are denied")
        # A person's rejection and an expiry are claimed; an ask still waits for its answer.
        claimed = await claim_answered(sweeper, stall_s=60.0, limit=10)
        assert sorted(claimed) == sorted([("acme", rejected), ("acme", expired)])
        assert await claim_answered(sweeper, stall_s=60.0, limit=10) == []  # touched

        refusal = await last_refusal(sweeper, "acme", rejected)
        assert refusal is not None
        assert (refusal.verdict, refusal.reason, refusal.step, refusal.action) == (
            "rejected",
            "rejected by ann@acme: no",
            0,
            "payment.refund",
        )
        assert refusal.pending_id is None and refusal.proposal_id is None
        refusal = await last_refusal(sweeper, "acme", expired)
        assert refusal is not None
        assert (refusal.verdict, refusal.reason, refusal.decision_id) == (
            "rejected",
            "the proposal expired unanswered (no answer in time)",
            by_clock,
        )
        refusal = await last_refusal(sweeper, "acme", denied)
        assert refusal is not None
        assert (refusal.verdict, refusal.decision_id) == ("deny", by_policy)
        refusal = await last_refusal(sweeper, "acme", asked)
        assert refusal is not None
        assert (refusal.verdict, refusal.pending_id, refusal.proposal_id, refusal.preview) == (
            "ask",
            pending,
            f"prop_{asked}",
            {"amount": 12},
        )
        assert refusal.expires_at
        # The planner reads the refusal, never the proposal's arguments.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await sweeper.fetch("SELECT arguments FROM admission.proposals")
        # Once the run observed it, its last step is past the proposal: nothing to deliver.
        await admin.execute(
            "INSERT INTO planner.steps (run_id, seq, kind, payload) "
            "VALUES ($1, 1, 'observation', '{}')",
            rejected,
        )
        assert await last_refusal(sweeper, "acme", rejected) is None
        assert by_person  # the person's answer's decision is governance's, not recorded here
    finally:
        await admin.close()
        await sweeper.close()
