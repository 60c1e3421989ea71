"""Run budgets in governance's store against a real PostgreSQL, as governance's own role:
limits hold per kind, parallel steps cannot spend one remainder twice, a step key has one
reservation, settling counts what was really used, the concurrency cap holds, the run's clock
stops while it waits for a person, and every change is journaled."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import msgspec
import pytest

from libs.db import connect_pool, load_migrations, provision, role_name, with_database
from libs.journal import DataKeys, Journal
from schemas.governance import (
    BudgetRefused,
    BudgetReserved,
    BudgetSettled,
    LeaseAmounts,
    RegisterRun,
    RunBudget,
    Settlement,
)
from services.governance.budgets import BudgetDefaults, Limits
from services.governance.logic import Call, decide
from services.governance.store import Answered, GovernanceStore

pytestmark = pytest.mark.anyio

MIGRATIONS = Path(__file__).resolve().parents[2] / "services" / "governance" / "migrations"
WRITE = Call(
    tool="payment.charge.create", family="write_delete", connector="payments", agent="billing"
)


class Env(msgspec.Struct, kw_only=True):
    store: GovernanceStore
    pool: asyncpg.Pool
    admin: asyncpg.Connection
    journal: Journal


@pytest.fixture
async def env(scratch_db: str) -> AsyncIterator[Env]:
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
    # As many connections as parallel steps: each reservation really runs on its own.
    pool = await connect_pool(dsn, min_size=20, max_size=20)
    admin = await asyncpg.connect(scratch_db)
    journal = Journal(service="governance", keys=DataKeys.from_json(DataKeys.generate("d1")))
    yield Env(store=GovernanceStore(pool, journal=journal), pool=pool, admin=admin, journal=journal)
    await admin.close()
    await pool.close()


async def _run(store: GovernanceStore, run_id: str = "run-1", **limits: int) -> None:
    await store.register_run(
        RegisterRun(tenant="acme", run_id=run_id, principal="alice@acme", agent="billing"),
        Limits(**{"wall_time_s": 600, "max_concurrent_steps": 64, **limits}),
    )


async def _reserve(
    store: GovernanceStore, step_key: str, run_id: str = "run-1", **amounts: Any
) -> BudgetReserved | BudgetRefused:
    return await store.reserve(tenant="acme", run_id=run_id, step_key=step_key, **amounts)


def _refused(answer: object, budget: str) -> bool:
    return isinstance(answer, BudgetRefused) and answer.budget == budget


async def test_each_budget_is_enforced_for_what_a_step_asks(env: Env) -> None:
    await _run(env.store, provider_calls=2, tokens=100, capability_calls=1)
    assert isinstance(await _reserve(env.store, "s1", provider_calls=1, tokens=60), BudgetReserved)
    tokens = await _reserve(env.store, "s2", provider_calls=1, tokens=60)
    assert _refused(tokens, "tokens")
    assert isinstance(tokens, BudgetRefused) and "40 left of 100" in tokens.reason
    # Both or neither: the refused step took no provider call either.
    assert isinstance(await _reserve(env.store, "s3", provider_calls=1, tokens=40), BudgetReserved)
    assert _refused(await _reserve(env.store, "s4", provider_calls=1), "provider_calls")
    # A step that needs no model is not refused for the model's budgets.
    assert isinstance(await _reserve(env.store, "s5", capability_calls=1), BudgetReserved)
    assert _refused(await _reserve(env.store, "s6", capability_calls=1), "capability_calls")
    state = await env.store.budget("acme", "run-1")
    assert state is not None
    assert (
        state.reserved_provider_calls,
        state.reserved_tokens,
        state.reserved_capability_calls,
        state.open_steps,
    ) == (2, 100, 1, 3)
    assert _refused(await _reserve(env.store, "s1", run_id="run-unknown"), "unknown_run")
    assert _refused(
        await env.store.reserve(tenant="globex", run_id="run-1", step_key="x"), "unknown_run"
    )


async def test_parallel_steps_cannot_all_spend_the_same_remainder(env: Env) -> None:
    await _run(env.store, capability_calls=8, provider_calls=100, tokens=10_000)
    spent = await _reserve(env.store, "earlier", capability_calls=3)
    assert isinstance(spent, BudgetReserved)
    await env.store.settle(
        tenant="acme", run_id="run-1", reservation_id=spent.reservation_id, capability_calls=3
    )
    # 5 capability calls left; 20 steps ask for one each at once, on 20 connections.
    answers = []

    async def one(i: int) -> None:
        answers.append(await _reserve(env.store, f"step-{i}", capability_calls=1, tokens=10))

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(one, i)
    granted = [a for a in answers if isinstance(a, BudgetReserved)]
    assert len(granted) == 5
    assert all(_refused(a, "capability_calls") for a in answers if a not in granted)
    assert (
        await env.admin.fetchval(
            "SELECT count(*) FROM governance.reservations WHERE status = 'open'"
        )
        == 5
    )
    state = await env.store.budget("acme", "run-1")
    assert state is not None and state.remaining("capability_calls") == 0
    assert (state.reserved_tokens, state.open_steps) == (50, 5)


async def test_the_concurrency_cap_counts_open_steps(env: Env) -> None:
    await _run(
        env.store, provider_calls=100, tokens=10_000, capability_calls=100, max_concurrent_steps=3
    )
    answers = []

    async def one(i: int) -> None:
        answers.append(await _reserve(env.store, f"p-{i}", provider_calls=1))

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(one, i)
    granted = [a for a in answers if isinstance(a, BudgetReserved)]
    assert len(granted) == 3
    assert all(_refused(a, "concurrent_steps") for a in answers if a not in granted)
    assert _refused(await _reserve(env.store, "next", provider_calls=1), "concurrent_steps")
    # A step that ends frees its place; the spent budget stays spent.
    await env.store.settle(
        tenant="acme", run_id="run-1", reservation_id=granted[0].reservation_id, provider_calls=1
    )
    assert isinstance(await _reserve(env.store, "next", provider_calls=1), BudgetReserved)
    assert _refused(await _reserve(env.store, "one-more", provider_calls=1), "concurrent_steps")


async def test_a_step_key_has_one_reservation(env: Env) -> None:
    await _run(env.store, provider_calls=10, tokens=1000, capability_calls=10)
    answers = []

    async def again() -> None:
        answers.append(await _reserve(env.store, "run-1:7:model", provider_calls=1, tokens=100))

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(again)
    assert all(isinstance(a, BudgetReserved) for a in answers)
    assert len({a.reservation_id for a in answers if isinstance(a, BudgetReserved)}) == 1
    state = await env.store.budget("acme", "run-1")
    assert state is not None and (state.reserved_tokens, state.open_steps) == (100, 1)
    first = answers[0]
    assert isinstance(first, BudgetReserved)
    await env.store.settle(
        tenant="acme",
        run_id="run-1",
        reservation_id=first.reservation_id,
        provider_calls=1,
        tokens=80,
    )
    # Redelivered after it ended: the same reservation, closed; nothing new reserved.
    replay = await _reserve(env.store, "run-1:7:model", provider_calls=1, tokens=100)
    assert isinstance(replay, BudgetReserved)
    assert (replay.reservation_id, replay.status) == (first.reservation_id, "settled")
    state = await env.store.budget("acme", "run-1")
    assert state is not None
    assert (state.reserved_tokens, state.used_tokens, state.open_steps) == (0, 80, 0)


async def test_settling_frees_the_reservation_and_counts_actual_use(env: Env) -> None:
    await _run(env.store, provider_calls=10, tokens=1000, capability_calls=10)
    held = await _reserve(env.store, "m1", provider_calls=1, tokens=300)
    assert isinstance(held, BudgetReserved)
    # The model used more than it reserved: recorded as it is.
    settled = await env.store.settle(
        tenant="acme",
        run_id="run-1",
        reservation_id=held.reservation_id,
        provider_calls=1,
        tokens=450,
    )
    assert settled is not None and (settled.status, settled.tokens) == ("settled", 450)
    state = await env.store.budget("acme", "run-1")
    assert state is not None
    assert (state.used_tokens, state.reserved_tokens, state.remaining("tokens")) == (450, 0, 550)
    # Settling again returns what was recorded, and changes nothing.
    again = await env.store.settle(
        tenant="acme", run_id="run-1", reservation_id=held.reservation_id, tokens=1
    )
    assert again == settled
    abandoned = await _reserve(env.store, "m2", provider_calls=1, tokens=500)
    assert isinstance(abandoned, BudgetReserved)
    assert _refused(await _reserve(env.store, "m3", tokens=100), "tokens")
    released = await env.store.settle(
        tenant="acme", run_id="run-1", reservation_id=abandoned.reservation_id, release=True
    )
    assert released is not None and released.status == "released"
    state = await env.store.budget("acme", "run-1")
    assert state is not None
    assert (state.used_provider_calls, state.used_tokens, state.remaining("tokens")) == (
        1,
        450,
        550,
    )
    assert isinstance(await _reserve(env.store, "m3", tokens=100), BudgetReserved)
    # Nobody else's reservation, and no made-up one.
    assert (
        await env.store.settle(tenant="globex", run_id="run-1", reservation_id=held.reservation_id)
        is None
    )
    assert (
        await env.store.settle(tenant="acme", run_id="run-1", reservation_id="not-a-uuid") is None
    )


async def test_a_reserve_settles_the_steps_it_carries_first_in_its_transaction(env: Env) -> None:
    # One step at a time: the next step's reservation fits only because the settlement it
    # carries closes the previous one first, under the same lock.
    await _run(env.store, provider_calls=2, tokens=1000, capability_calls=1, max_concurrent_steps=1)
    model = await _reserve(env.store, "run-1:0:model", provider_calls=1, tokens=400)
    assert isinstance(model, BudgetReserved)
    assert _refused(
        await _reserve(env.store, "run-1:1:capability", capability_calls=1), "concurrent_steps"
    )
    carried = [Settlement(reservation_id=model.reservation_id, provider_calls=1, tokens=30)]
    call = await env.store.reserve(
        tenant="acme",
        run_id="run-1",
        step_key="run-1:1:capability",
        capability_calls=1,
        settle=carried,
    )
    assert isinstance(call, BudgetReserved) and call.settled == [model.reservation_id]
    state = await env.store.budget("acme", "run-1")
    assert state is not None
    assert (
        state.used_provider_calls,
        state.used_tokens,
        state.reserved_tokens,
        state.reserved_capability_calls,
        state.open_steps,
    ) == (1, 30, 0, 1, 1)
    # Carried again (a redelivery): recorded once, the first use kept.
    again = await env.store.reserve(
        tenant="acme",
        run_id="run-1",
        step_key="run-1:1:capability",
        capability_calls=1,
        settle=[Settlement(reservation_id=model.reservation_id, provider_calls=1, tokens=999)],
    )
    assert isinstance(again, BudgetReserved) and again.reservation_id == call.reservation_id
    state = await env.store.budget("acme", "run-1")
    assert state is not None and (state.used_tokens, state.open_steps) == (30, 1)
    # A refused reserve still closes what it carries: the capability call is settled, and
    # the run has no capability call left for the next one.
    refused = await env.store.reserve(
        tenant="acme",
        run_id="run-1",
        step_key="run-1:3:capability",
        capability_calls=1,
        settle=[Settlement(reservation_id=call.reservation_id, capability_calls=1)],
    )
    assert _refused(refused, "capability_calls")
    assert isinstance(refused, BudgetRefused) and refused.settled == [call.reservation_id]
    state = await env.store.budget("acme", "run-1")
    assert state is not None
    assert (state.used_capability_calls, state.reserved_capability_calls, state.open_steps) == (
        1,
        0,
        0,
    )
    rows = await env.admin.fetch(
        "SELECT kind FROM governance.journal WHERE kind LIKE 'budget.%' ORDER BY id"
    )
    assert [r["kind"] for r in rows] == [
        "budget.set",
        "budget.reserved",
        "budget.exhausted",
        "budget.settled",
        "budget.reserved",
        "budget.settled",
        "budget.exhausted",
    ]


async def test_a_failed_reserve_settles_nothing_it_carries(env: Env) -> None:
    await _run(env.store, provider_calls=2, tokens=1000)
    model = await _reserve(env.store, "run-1:0:model", provider_calls=1, tokens=400)
    assert isinstance(model, BudgetReserved)
    # The next step's reservation fails inside the transaction (an amount the table's check
    # refuses, which the wire schema never lets through): the settlement it carried rolls
    # back with it.
    with pytest.raises(asyncpg.PostgresError):
        await env.store.reserve(
            tenant="acme",
            run_id="run-1",
            step_key="run-1:1:model",
            provider_calls=1,
            tokens=-5,
            settle=[Settlement(reservation_id=model.reservation_id, provider_calls=1, tokens=30)],
        )
    state = await env.store.budget("acme", "run-1")
    assert state is not None
    assert (state.used_tokens, state.reserved_tokens, state.open_steps) == (0, 400, 1)


async def test_wall_time_does_not_count_waiting_for_a_person(env: Env) -> None:
    await _run(env.store, provider_calls=100, tokens=10_000, capability_calls=100, wall_time_s=1)

    async def ask() -> str:
        facts = await env.store.facts("acme", WRITE, "alice@acme", "run-1")
        ruling = decide(WRITE, facts)
        assert ruling.verdict == "ask"
        return await env.store.record(
            tenant="acme",
            run_id="run-1",
            principal="alice@acme",
            call=WRITE,
            ruling=ruling,
            policy_version=facts.policy_version,
        )

    async def answer(pending_id: str) -> None:
        assert isinstance(
            await env.store.answer(
                tenant="acme",
                pending_id=pending_id,
                answer="once",
                answered_by="ops@acme",
                reason="",
            ),
            Answered,
        )

    # Two people asked at once: the clock stops at the first and runs again after the last.
    first, second = await ask(), await ask()
    await anyio.sleep(1.3)
    await answer(first)
    assert isinstance(await _reserve(env.store, "w1", capability_calls=1), BudgetReserved)
    await anyio.sleep(0.3)
    await answer(second)
    # Answered again (same answer, as concurrent approvals do): the clock resumes once.
    assert isinstance(
        await env.store.answer(
            tenant="acme",
            pending_id=second,
            answer="once",
            answered_by="ops@acme",
            reason="",
            same_again=True,
        ),
        Answered,
    )
    state = await env.store.budget("acme", "run-1")
    assert state is not None and state.elapsed_s < 0.7, state
    assert (
        await env.admin.fetchval("SELECT paused_s FROM governance.budgets WHERE run_id = 'run-1'")
        >= 1.5
    )
    assert isinstance(await _reserve(env.store, "w2", capability_calls=1), BudgetReserved)
    await anyio.sleep(1.0)
    exhausted = await _reserve(env.store, "w3", capability_calls=1)
    assert _refused(exhausted, "wall_time")


async def test_defaults_come_from_the_agent_then_global_then_the_run(env: Env) -> None:
    defaults = BudgetDefaults(
        default=Limits(tokens=1000, max_concurrent_steps=2),
        agents={"billing": RunBudget(tokens=500, capability_calls=3)},
    )
    limits = defaults.limits_for("billing", RunBudget(capability_calls=1))
    assert (limits.tokens, limits.capability_calls, limits.max_concurrent_steps) == (500, 1, 2)
    assert defaults.limits_for("other", None).tokens == 1000
    # Registered twice (a redelivery): one budget, as first set, and one grant.
    run = RegisterRun(
        tenant="acme",
        run_id="run-2",
        principal="alice@acme",
        agent="billing",
        grants=["write_delete"],
    )
    await env.store.register_run(run, limits)
    await env.store.register_run(run, Limits(tokens=99))
    state = await env.store.budget("acme", "run-2")
    assert state is not None and state.limits == limits
    assert (
        await env.admin.fetchval(
            "SELECT count(*) FROM governance.run_grants WHERE run_id = 'run-2'"
        )
        == 1
    )
    # One statement records the run, its grants and its budget, each journaled once.
    rows = await env.admin.fetch(
        "SELECT kind, xid::text AS xid FROM governance.journal WHERE subject = 'run-2'"
    )
    assert sorted(r["kind"] for r in rows) == ["budget.set", "run.registered"]
    assert len({r["xid"] for r in rows}) == 1
    # A run registered before budgets existed gets one when it is registered again.
    await env.admin.execute("DELETE FROM governance.budgets WHERE run_id = 'run-2'")
    await env.store.register_run(run, Limits(tokens=99))
    state = await env.store.budget("acme", "run-2")
    assert state is not None and state.limits.tokens == 99
    assert sorted(
        r["kind"]
        for r in await env.admin.fetch(
            "SELECT kind FROM governance.journal WHERE subject = 'run-2'"
        )
    ) == ["budget.set", "budget.set", "run.registered"]


async def test_a_callers_limit_lowers_the_run_budget_once_and_never_raises_it(env: Env) -> None:
    await _run(env.store, provider_calls=10, tokens=1000, capability_calls=5)
    # A limit above every budget changes nothing, and writes nothing.
    wide = RunBudget(provider_calls=50, tokens=10_000, capability_calls=9, wall_time_s=6000)
    first = await env.store.reserve(
        tenant="acme", run_id="run-1", step_key="s0", capability_calls=1, limit=wide
    )
    assert isinstance(first, BudgetReserved)
    state = await env.store.budget("acme", "run-1")
    assert state is not None and state.limits == Limits(
        provider_calls=10, tokens=1000, capability_calls=5, wall_time_s=600, max_concurrent_steps=64
    )
    # A lower one applies before the step it comes with: 2 capability calls, one spent.
    tight = RunBudget(capability_calls=2, tokens=5000)
    second = await env.store.reserve(
        tenant="acme", run_id="run-1", step_key="s1", capability_calls=1, limit=tight
    )
    assert isinstance(second, BudgetReserved)
    third = await env.store.reserve(
        tenant="acme", run_id="run-1", step_key="s2", capability_calls=1, limit=tight
    )
    assert _refused(third, "capability_calls")
    state = await env.store.budget("acme", "run-1")
    assert state is not None and (state.limits.capability_calls, state.limits.tokens) == (2, 1000)
    # Asked again, and wider afterwards: the lowered limit stays.
    await env.store.reserve(tenant="acme", run_id="run-1", step_key="s3", limit=wide)
    assert _refused(await _reserve(env.store, "s4", capability_calls=1), "capability_calls")
    lowered = await env.admin.fetch(
        "SELECT * FROM governance.journal WHERE kind = 'budget.lowered'"
    )
    assert len(lowered) == 1
    payload = msgspec.json.decode(env.journal.open(lowered[0]))
    assert payload["capability_calls"] == 2 and payload["asked"]["tokens"] == 5000


async def test_a_reservation_settled_elsewhere_is_settled_once(env: Env) -> None:
    # `made` reserves and settles what it made in one statement; `other` (a second governance
    # process) knows nothing of it and settles under the lock. Whoever is first counts.
    made, other = env.store, GovernanceStore(env.pool, journal=env.journal)
    await _run(made, provider_calls=100, tokens=10_000)
    held = await _reserve(made, "first", provider_calls=1, tokens=100)
    assert isinstance(held, BudgetReserved)
    taken = await other.settle(
        tenant="acme",
        run_id="run-1",
        reservation_id=held.reservation_id,
        provider_calls=1,
        tokens=70,
    )
    again = await made.settle(
        tenant="acme",
        run_id="run-1",
        reservation_id=held.reservation_id,
        provider_calls=1,
        tokens=999,
    )
    assert taken is not None and again == taken and again.tokens == 70
    # Both at once, ten times over: each settled once, whichever answered, and no deadlock.
    held_ids = []
    for i in range(10):
        step = await _reserve(made, f"race-{i}", provider_calls=1, tokens=100)
        assert isinstance(step, BudgetReserved)
        held_ids.append(step.reservation_id)
    answers: dict[str, list[BudgetSettled | None]] = {r: [] for r in held_ids}

    async def settle(store: GovernanceStore, reservation_id: str, tokens: int) -> None:
        answers[reservation_id].append(
            await store.settle(
                tenant="acme",
                run_id="run-1",
                reservation_id=reservation_id,
                provider_calls=1,
                tokens=tokens,
            )
        )

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for reservation_id in held_ids:
                tg.start_soon(settle, made, reservation_id, 5)
                tg.start_soon(settle, other, reservation_id, 6)
    for first, second in answers.values():
        assert first == second and first is not None and first.tokens in (5, 6)
    state = await made.budget("acme", "run-1")
    assert state is not None
    assert (state.used_provider_calls, state.reserved_tokens, state.open_steps) == (11, 0, 0)
    assert state.used_tokens == 70 + sum(a[0].tokens for a in answers.values())  # type: ignore
    settled = await env.admin.fetch(
        "SELECT subject FROM governance.journal WHERE kind = 'budget.settled'"
    )
    assert sorted(r["subject"] for r in settled) == sorted([held.reservation_id, *held_ids])


async def test_every_budget_change_is_journaled(env: Env) -> None:
    await _run(env.store, provider_calls=1, tokens=100, capability_calls=1)
    held = await _reserve(env.store, "j1", provider_calls=1, tokens=100)
    assert isinstance(held, BudgetReserved)
    assert _refused(await _reserve(env.store, "j2", provider_calls=1), "provider_calls")
    await _reserve(env.store, "j1", provider_calls=1, tokens=100)  # a replay: no row
    await env.store.settle(
        tenant="acme",
        run_id="run-1",
        reservation_id=held.reservation_id,
        provider_calls=1,
        tokens=70,
    )
    await env.store.settle(
        tenant="acme",
        run_id="run-1",
        reservation_id=held.reservation_id,
        provider_calls=1,
        tokens=70,
    )  # again: no row
    other = await _reserve(env.store, "j3", capability_calls=1)
    assert isinstance(other, BudgetReserved)
    await env.store.settle(
        tenant="acme", run_id="run-1", reservation_id=other.reservation_id, release=True
    )
    facts = await env.store.facts("acme", WRITE, "alice@acme", "run-1")
    pending = await env.store.record(
        tenant="acme",
        run_id="run-1",
        principal="alice@acme",
        call=WRITE,
        ruling=decide(WRITE, facts),
        policy_version=facts.policy_version,
    )
    await env.store.answer(
        tenant="acme", pending_id=pending, answer="deny", answered_by="ops@acme", reason="no"
    )
    rows = await env.admin.fetch(
        "SELECT * FROM governance.journal WHERE kind LIKE 'budget.%' ORDER BY id"
    )
    assert [r["kind"] for r in rows] == [
        "budget.set",
        "budget.reserved",
        "budget.exhausted",
        "budget.settled",
        "budget.reserved",
        "budget.released",
        "budget.paused",
        "budget.resumed",
    ]
    assert all(r["run_id"] == "run-1" and r["tenant"] == "acme" for r in rows)
    payloads = [msgspec.json.decode(env.journal.open(r)) for r in rows]
    assert payloads[0]["provider_calls"] == 1 and payloads[0]["agent"] == "billing"
    assert payloads[2]["budget"] == "provider_calls"
    assert payloads[3]["used"] == {"provider_calls": 1, "tokens": 70, "capability_calls": 0}
    assert payloads[3]["reserved"]["tokens"] == 100
    assert payloads[6]["wait_key"] == f"pending:{pending}"


async def test_a_lease_reserves_what_is_left_up_to_its_amounts_and_is_refused_by_its_step(
    env: Env,
) -> None:
    """`up_to` raises each amount to what is left, up to the lease's; only what the step asks
    decides a refusal; a lease is one open step; a lease's key is one reservation."""
    await _run(env.store, provider_calls=3, tokens=1000, capability_calls=0)
    up_to = LeaseAmounts(provider_calls=8, tokens=400, capability_calls=8)
    lease = await env.store.reserve(
        tenant="acme",
        run_id="run-1",
        step_key="run-1:lease:1",
        provider_calls=1,
        tokens=100,
        up_to=up_to,
    )
    assert isinstance(lease, BudgetReserved)
    # 3 provider calls were left (not 8), 400 tokens of 1,000, no capability call at all.
    assert (lease.provider_calls, lease.tokens, lease.capability_calls) == (3, 400, 0)
    state = await env.store.budget("acme", "run-1")
    assert state is not None
    assert (state.reserved_provider_calls, state.reserved_tokens, state.open_steps) == (3, 400, 1)
    again = await env.store.reserve(
        tenant="acme",
        run_id="run-1",
        step_key="run-1:lease:1",
        provider_calls=1,
        tokens=100,
        up_to=up_to,
    )
    assert isinstance(again, BudgetReserved) and again.reservation_id == lease.reservation_id
    # The next lease, settling the first with what its steps used: 2 calls and 300 tokens.
    # One call is left, so it gets one; asking a capability call is refused outright.
    refused = await env.store.reserve(
        tenant="acme",
        run_id="run-1",
        step_key="run-1:lease:2",
        capability_calls=1,
        up_to=up_to,
        settle=[Settlement(reservation_id=lease.reservation_id, provider_calls=2, tokens=300)],
    )
    assert _refused(refused, "capability_calls")
    second = await env.store.reserve(
        tenant="acme", run_id="run-1", step_key="run-1:lease:2", provider_calls=1, up_to=up_to
    )
    assert isinstance(second, BudgetReserved)
    assert (second.provider_calls, second.tokens, second.capability_calls) == (1, 400, 0)
    state = await env.store.budget("acme", "run-1")
    assert state is not None
    assert (
        state.used_provider_calls,
        state.used_tokens,
        state.reserved_provider_calls,
        state.open_steps,
    ) == (2, 300, 1, 1)
    # With none left, a lease asking one call is refused like the step it is for.
    await env.store.settle(
        tenant="acme", run_id="run-1", reservation_id=second.reservation_id, provider_calls=1
    )
    assert _refused(
        await env.store.reserve(
            tenant="acme", run_id="run-1", step_key="run-1:lease:3", provider_calls=1, up_to=up_to
        ),
        "provider_calls",
    )
