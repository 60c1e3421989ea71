"""The planner's budgets and critic against governance's real endpoints, on a real nats-server
and PostgreSQL: every provider call and capability call reserves first and settles after; a
budget that ran out fails the run naming it, without asking the model; a redelivered step reuses
its reservation; governance not answering is a retry, never an allow; steps in flight at the
concurrency cap hold the next one back (a retry); the critic's replan feeds back and spends the
same budget. Deliveries are handed to `PlannerService.handle` directly (the
actor loop is libs/actor.py's, tested on its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import asyncpg
import msgspec
import nats
import pytest
from nats.aio.client import Client
from prometheus_client import CollectorRegistry

from actions import ACTIONS
from libs import budget
from libs.budget import BudgetUnavailable
from libs.db import connect_pool, load_migrations, provision, role_name, with_database
from libs.embedded import EmbeddedNats
from libs.errors import RetryableError
from libs.journal import DataKeys, Journal, Sealer, SigningKey
from libs.provision import provision_bus
from libs.runtime import Runtime
from libs.telemetry import make_tracer_provider
from schemas import subjects
from schemas.admission import ProposalRefused
from schemas.dispatcher import CommandOutcome
from schemas.governance import LeaseAmounts, RegisterRun, ReserveBudget, RunBudget, RunRegistered
from schemas.retrieval import EvidenceGathered
from services.governance.service import GovernanceService
from services.governance.spend import Cap, ModelPrice, PriceTable
from services.governance.store import GovernanceStore
from services.planner.agents import AgentRegistry, load_manifest
from services.planner.provider import (
    Accept,
    AnswerDirectly,
    CriticInput,
    CriticVerdict,
    ModelDecision,
    ModelInput,
    Replan,
    ScriptedProvider,
    SelectCapability,
    TextSink,
)
from services.planner.replay import replay_run
from services.planner.service import PlannerService
from services.planner.store import PlannerStore
from tests.integration.conftest import serve
from tests.integration.readings import planner_draws
from writ.operator import list_spend

pytestmark = pytest.mark.anyio

SERVICES = Path(__file__).resolve().parents[2] / "services"
NOTE = SelectCapability(
    capability="crm.note.create", arguments={"customer_id": "ACME-42", "body": "Called back."}
)
FIRST = AnswerDirectly(answer="Done.")
SECOND = AnswerDirectly(answer="Added a note on ACME-42 about the call back.")
REPLAN = Replan(reason="The answer does not say what was recorded, or where.")


def manifest(name: str, *, critic: bool = False) -> bytes:
    return msgspec.json.encode(
        {
            "name": name,
            "version": "1.0.0",
            "responsibility": "Record calls as CRM notes.",
            "uses": [{"kind": "action", "name": "crm.note.create"}],
            "critic": critic,
        }
    )


class Counting:
    """The scripted provider, counting its calls; `fail_next` makes the next decision fail as
    a model that did not answer would (retryable)."""

    def __init__(
        self,
        decisions: dict[str, list[ModelDecision]],
        critics: dict[str, list[CriticVerdict]] | None = None,
    ) -> None:
        self._inner = ScriptedProvider([FIRST], decisions, critics)
        self.priced_as = self._inner.priced_as
        # The tokens each decision reports it used (a real model's usage).
        self.tokens_per_call = 0
        self.decisions = 0
        self.verdicts = 0
        self.fail_next = False

    async def decide(self, model_input: ModelInput) -> ModelDecision:
        return (await self.decide_with_usage(model_input))[0]

    async def decide_with_usage(
        self, model_input: ModelInput, *, text: TextSink | None = None
    ) -> tuple[ModelDecision, int]:
        self.decisions += 1
        if self.fail_next:
            self.fail_next = False
            raise RetryableError("no answer from the model")
        decision, tokens = await self._inner.decide_with_usage(model_input, text=text)
        return decision, tokens + self.tokens_per_call

    async def verify(self, critic_input: CriticInput) -> tuple[CriticVerdict, int]:
        self.verdicts += 1
        return await self._inner.verify(critic_input)


def _Delivery(message: Any) -> Any:
    """A delivery as the planner's handler reads it: its message, nothing else."""
    return SimpleNamespace(message=message)


class Env(msgspec.Struct, kw_only=True):
    nc: Client
    db: Any  # governance's and the planner's tables, read as the administrator
    planner_pool: Any
    journal: Journal
    registry: CollectorRegistry
    micro: Any
    provider: Counting | None = None
    governance: GovernanceStore | None = None

    def service(self, provider: Counting, *, lease_steps: int = 8) -> PlannerService:
        self.provider = provider
        agents = AgentRegistry(
            [
                load_manifest(manifest("note-assistant")),
                load_manifest(manifest("checked-assistant", critic=True)),
            ]
        )
        agents.resolve(actions=ACTIONS)
        rt = Runtime(
            name="planner",
            nc=self.nc,
            js=self.nc.jetstream(),
            registry=self.registry,
            tracer_provider=make_tracer_provider("planner"),
        )
        return PlannerService(
            rt=rt,
            store=PlannerStore(self.planner_pool, journal=self.journal),
            provider=provider,
            agents=agents,
            reserve_tokens=100,
            lease_steps=lease_steps,
        )

    async def run(self, run_id: str) -> Any:
        return await self.db.fetchrow("SELECT * FROM planner.runs WHERE run_id = $1", run_id)

    async def steps(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        rows = await self.db.fetch(
            "SELECT kind, payload FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id
        )
        return [(r["kind"], msgspec.json.decode(r["payload"])) for r in rows]

    async def reservations(self, run_id: str) -> list[tuple[str, str, int, int, int]]:
        rows = await self.db.fetch(
            "SELECT step_key, status, used_provider_calls, used_tokens, used_capability_calls "
            "FROM governance.reservations WHERE run_id = $1 ORDER BY reserved_at",
            run_id,
        )
        return [
            (
                r["step_key"].removeprefix(f"{run_id}:"),
                r["status"],
                r["used_provider_calls"],
                r["used_tokens"],
                r["used_capability_calls"],
            )
            for r in rows
        ]

    async def draws(self, run_id: str) -> list[tuple[str, str | None, str]]:
        """The planner's own record: each step key, the lease it drew on, its state."""
        return await planner_draws(self.db, run_id)

    def exhausted(self) -> float:
        return self.registry.get_sample_value("writ_planner_budget_exhaustions_total") or 0.0


@pytest.fixture
async def env(scratch_db: str, private_nats: EmbeddedNats, unique: str) -> AsyncIterator[Env]:
    nc = await nats.connect(private_nats.url)
    # Writ's streams, and the results stream of the tenant these runs belong to.
    await provision_bus(nc.jetstream(), ["acme"])
    database = scratch_db.rsplit("/", 1)[1]
    passwords = await provision(
        scratch_db,
        database,
        {
            name: load_migrations(name, SERVICES / name / "migrations")
            for name in ("planner", "governance")
        },
    )
    pools = {
        name: await connect_pool(
            with_database(
                scratch_db, database, user=role_name(database, name), password=passwords[name]
            )
        )
        for name in ("planner", "governance")
    }
    registry = CollectorRegistry()
    governance_store = GovernanceStore(
        pools["governance"],
        journal=Journal(service="governance", keys=DataKeys.from_json(DataKeys.generate("g1"))),
    )
    governance = GovernanceService(
        rt=Runtime(
            name="governance",
            nc=nc,
            js=nc.jetstream(),
            registry=CollectorRegistry(),
            tracer_provider=make_tracer_provider("governance"),
        ),
        store=governance_store,
    )
    micro = await serve(nc, "governance", governance.endpoints(), unique)
    admin = await asyncpg.connect(scratch_db)
    journal = Journal(service="planner", keys=DataKeys.from_json(DataKeys.generate("p1")))
    yield Env(
        nc=nc,
        db=admin,
        planner_pool=pools["planner"],
        journal=journal,
        registry=registry,
        micro=micro,
        governance=governance_store,
    )
    await admin.close()
    await micro.stop()  # idempotent: a test may have stopped it
    for pool in pools.values():
        await pool.close()
    await nc.drain()


async def register(env: Env, run_id: str, agent: str, **limits: int) -> EvidenceGathered:
    run = RegisterRun(
        tenant="acme",
        run_id=run_id,
        principal="alice@acme",
        agent=agent,
        budget=RunBudget(**limits) if limits else None,
    )
    reply = await env.nc.request(subjects.REGISTER_RUN, msgspec.json.encode(run), timeout=5)
    assert msgspec.json.decode(reply.data, type=RunRegistered).run_id == run_id
    return EvidenceGathered(
        run_id=run_id,
        request_id=f"req-{run_id}",
        tenant="acme",
        principal="alice@acme",
        agent=agent,
        input="Note that I called ACME back",
        evidence=[],
    )


def outcome(run_id: str, step: int) -> CommandOutcome:
    return CommandOutcome(
        tenant="acme",
        operation_id=f"op-{run_id}",
        run_id=run_id,
        step=step,
        action="crm.note.create",
        state="succeeded",
        receipt="note-1",
    )


async def test_an_exhausted_budget_fails_the_run_naming_it_without_asking_the_model(
    env: Env,
) -> None:
    provider = Counting({"note-assistant": [NOTE, FIRST]})
    svc = env.service(provider)
    started = await register(env, "run-b1", "note-assistant", provider_calls=1)
    await svc.handle(_Delivery(started))  # decision 1, then its proposal
    assert [k for k, _ in await env.steps("run-b1")] == ["decision"]
    await svc.handle(_Delivery(outcome("run-b1", 0)))

    run = await env.run("run-b1")
    assert (run["status"], run["error_code"]) == ("failed", "BUDGET_EXHAUSTED")
    assert run["error_message"].startswith("provider_calls: ")
    assert provider.decisions == 1  # the model was not asked whether to go on
    assert [k for k, _ in await env.steps("run-b1")] == ["decision", "observation"]
    assert env.exhausted() == 1.0
    # Both steps drew on the run's lease, settled with what they used; the second lease
    # (the next model call) was refused: nothing is left open.
    assert await env.reservations("run-b1") == [("lease:1", "settled", 1, 0, 1)]
    assert await env.draws("run-b1") == [
        ("0:capability", "lease:1", "closed"),
        ("0:model", "lease:1", "closed"),
        ("lease:1", None, "closed"),
    ]
    exhausted = await env.db.fetchrow(
        "SELECT b.used_provider_calls, b.reserved_provider_calls, b.open_steps "
        "FROM governance.budgets b WHERE run_id = 'run-b1'"
    )
    assert tuple(exhausted) == (1, 0, 0)


async def test_a_capability_budget_that_ran_out_proposes_nothing(env: Env) -> None:
    provider = Counting({"note-assistant": [NOTE, FIRST]})
    svc = env.service(provider)
    started = await register(env, "run-b2", "note-assistant", capability_calls=0)
    await svc.handle(_Delivery(started))
    run = await env.run("run-b2")
    assert (run["status"], run["error_code"]) == ("failed", "BUDGET_EXHAUSTED")
    assert run["error_message"].startswith("capability_calls: ")
    # The lease got no capability call (none was left); the one the step asked was refused.
    assert await env.reservations("run-b2") == [("lease:1", "settled", 1, 0, 0)]
    kinds = [
        r["kind"]
        for r in await env.db.fetch(
            "SELECT kind FROM planner.journal WHERE run_id = 'run-b2' ORDER BY id"
        )
    ]
    assert "proposal" not in kinds  # journaled only once its capability call was reserved


async def test_a_redelivered_step_reuses_its_reservation(env: Env) -> None:
    provider = Counting({"note-assistant": [NOTE, FIRST]})
    svc = env.service(provider)
    started = await register(env, "run-b3", "note-assistant", provider_calls=2)
    provider.fail_next = True
    with pytest.raises(RetryableError):
        await svc.handle(_Delivery(started))
    assert await env.steps("run-b3") == []
    assert await env.reservations("run-b3") == [("lease:1", "open", None, None, None)]
    await svc.handle(_Delivery(started))  # the redelivery: same lease key, same reservation
    await svc.handle(_Delivery(started))  # and again, after the proposal: nothing new
    # The lease stays open while the proposal's capability call (a draw) is in flight.
    assert await env.reservations("run-b3") == [("lease:1", "open", None, None, None)]
    assert await env.draws("run-b3") == [
        ("0:capability", "lease:1", "open"),
        ("0:model", "lease:1", "closed"),
        ("lease:1", None, "open"),
    ]
    assert provider.decisions == 2  # the failed call and the one recorded; never a third
    await svc.handle(_Delivery(outcome("run-b3", 0)))
    run = await env.run("run-b3")
    assert (run["status"], run["answer"]) == ("succeeded", FIRST.answer)
    assert await env.reservations("run-b3") == [("lease:1", "settled", 2, 0, 1)]


async def test_a_runs_steps_draw_on_one_lease_in_two_round_trips(env: Env) -> None:
    """A root run's three steps (model, capability, model) draw on one lease: one reserve,
    asking up to the lease's amounts, and one settlement with what they used together, sent
    once the delivery that ended it committed. Governance's totals are what the steps used."""
    seen: list[tuple[str, bytes]] = []

    async def heard(msg: Any) -> None:
        seen.append((msg.subject, msg.data))

    reserves = await env.nc.subscribe(subjects.RESERVE, cb=heard)
    settles = await env.nc.subscribe(subjects.SETTLE, cb=heard)
    svc = env.service(Counting({"note-assistant": [NOTE, FIRST]}))
    await svc.handle(_Delivery(await register(env, "run-b12", "note-assistant")))
    # Between the deliveries the lease is open: the proposal's capability call draws on it.
    assert await env.reservations("run-b12") == [("lease:1", "open", None, None, None)]
    await svc.handle(_Delivery(outcome("run-b12", 0)))
    run = await env.run("run-b12")
    assert (run["status"], run["answer"]) == ("succeeded", FIRST.answer)
    assert await env.reservations("run-b12") == [("lease:1", "settled", 2, 0, 1)]
    assert await env.draws("run-b12") == [
        ("0:capability", "lease:1", "closed"),
        ("0:model", "lease:1", "closed"),
        ("2:model", "lease:1", "closed"),
        ("lease:1", None, "closed"),
    ]
    budget_row = await env.db.fetchrow(
        "SELECT used_provider_calls, used_capability_calls, reserved_provider_calls, "
        "reserved_tokens, reserved_capability_calls, open_steps FROM governance.budgets "
        "WHERE run_id = 'run-b12'"
    )
    assert tuple(budget_row) == (2, 1, 0, 0, 0, 0)
    await env.nc.flush()
    await reserves.unsubscribe()
    await settles.unsubscribe()
    assert [subject for subject, _ in seen] == [subjects.RESERVE, subjects.SETTLE]
    ask = msgspec.json.decode(seen[0][1], type=ReserveBudget)
    assert (ask.step_key, ask.provider_calls, ask.tokens, ask.up_to) == (
        "run-b12:lease:1",
        1,
        100,
        LeaseAmounts(provider_calls=8, tokens=800, capability_calls=8),
    )
    granted = await env.db.fetchrow(
        "SELECT provider_calls, tokens, capability_calls FROM governance.reservations "
        "WHERE run_id = 'run-b12'"
    )
    assert tuple(granted) == (8, 800, 8)  # all of it was left


async def test_a_lease_that_does_not_cover_the_next_step_is_settled_with_the_next_one(
    env: Env,
) -> None:
    """A lease covering two provider calls: the third model call settles it (carried by the
    next lease's reserve, as a step's settlement is) and draws on a new one."""
    svc = env.service(
        Counting(
            {"checked-assistant": [NOTE, FIRST, SECOND]}, {"checked-assistant": [REPLAN, Accept()]}
        ),
        lease_steps=2,
    )
    await svc.handle(_Delivery(await register(env, "run-b13", "checked-assistant")))
    await svc.handle(_Delivery(outcome("run-b13", 0)))
    run = await env.run("run-b13")
    assert (run["status"], run["answer"]) == ("succeeded", SECOND.answer)
    # model, capability, model, critic (2 provider calls, then the lease is spent) ...
    # ... then the critic and the replanned model call, then the last critic.
    assert await env.reservations("run-b13") == [
        ("lease:1", "settled", 2, 0, 1),
        ("lease:2", "settled", 2, 0, 0),
        ("lease:3", "settled", 1, 0, 0),
    ]
    assert await env.draws("run-b13") == [
        ("0:capability", "lease:1", "closed"),
        ("0:model", "lease:1", "closed"),
        ("2:model", "lease:1", "closed"),
        ("3:critic", "lease:2", "closed"),
        ("5:model", "lease:2", "closed"),
        ("6:critic", "lease:3", "closed"),
        ("lease:1", None, "closed"),
        ("lease:2", None, "closed"),
        ("lease:3", None, "closed"),
    ]
    used = await env.db.fetchrow(
        "SELECT used_provider_calls, used_capability_calls, "
        "open_steps FROM governance.budgets WHERE run_id = 'run-b13'"
    )
    assert tuple(used) == (5, 1, 0)


async def test_a_steps_settlement_travels_with_the_next_reservation(env: Env) -> None:
    """Without a lease (as a branch's steps reserve): three reservations and three
    settlements, in four round trips to governance: each step's settlement goes with the next
    step's reservation, and only the last is sent alone, before its delivery commits; every
    reservation ends settled with what its step used."""
    seen: list[tuple[str, bytes]] = []

    async def heard(msg: Any) -> None:
        seen.append((msg.subject, msg.data))

    reserves = await env.nc.subscribe(subjects.RESERVE, cb=heard)
    settles = await env.nc.subscribe(subjects.SETTLE, cb=heard)
    svc = env.service(Counting({"note-assistant": [NOTE, FIRST]}), lease_steps=0)
    await svc.handle(_Delivery(await register(env, "run-b11", "note-assistant")))
    await svc.handle(_Delivery(outcome("run-b11", 0)))
    run = await env.run("run-b11")
    assert (run["status"], run["answer"]) == ("succeeded", FIRST.answer)
    assert await env.reservations("run-b11") == [
        ("0:model", "settled", 1, 0, 0),
        ("0:capability", "settled", 0, 0, 1),
        ("2:model", "settled", 1, 0, 0),
    ]
    assert (
        await env.db.fetchval(
            "SELECT count(*) FROM planner.reservations WHERE run_id = $1 AND state <> 'closed'",
            "run-b11",
        )
        == 0
    )
    await env.nc.flush()
    await reserves.unsubscribe()
    await settles.unsubscribe()
    assert [subject for subject, _ in seen] == [subjects.RESERVE] * 3 + [subjects.SETTLE]
    asks = [
        msgspec.json.decode(data, type=ReserveBudget)
        for subject, data in seen
        if subject == subjects.RESERVE
    ]
    assert [len(ask.settle) for ask in asks] == [0, 1, 1]
    assert [ask.settle[0].provider_calls for ask in asks[1:]] == [1, 0]
    assert [ask.settle[0].capability_calls for ask in asks[1:]] == [0, 1]


async def test_governance_not_answering_is_a_retry_never_an_allow(env: Env) -> None:
    provider = Counting({"note-assistant": [NOTE, FIRST]})
    svc = env.service(provider)
    started = await register(env, "run-b4", "note-assistant")
    await env.micro.stop()
    with pytest.raises(BudgetUnavailable) as caught:
        await svc.handle(_Delivery(started))
    assert isinstance(caught.value, RetryableError)  # the actor naks it
    assert provider.decisions == 0
    assert await env.steps("run-b4") == []
    assert (await env.run("run-b4"))["status"] == "running"


async def test_a_run_that_stops_for_a_person_holds_no_reservation(env: Env) -> None:
    provider = Counting({"note-assistant": [NOTE, FIRST]})
    svc = env.service(provider)
    started = await register(env, "run-b5", "note-assistant")
    await svc.handle(_Delivery(started))
    await svc.handle(
        _Delivery(
            ProposalRefused(
                tenant="acme",
                run_id="run-b5",
                step=0,
                action="crm.note.create",
                verdict="ask",
                reason="needs a person",
                pending_id="p-1",
            )
        )
    )
    assert (await env.run("run-b5"))["status"] == "awaiting_human"
    # The lease ends with the delivery: nothing is held while the run waits for a person.
    assert await env.reservations("run-b5") == [("lease:1", "settled", 1, 0, 1)]
    assert (
        await env.db.fetchval("SELECT open_steps FROM governance.budgets WHERE run_id = 'run-b5'")
        == 0
    )


async def test_a_critic_replan_then_accept_ends_with_the_second_answer(env: Env) -> None:
    provider = Counting(
        {"checked-assistant": [NOTE, FIRST, SECOND]}, {"checked-assistant": [REPLAN, Accept()]}
    )
    svc = env.service(provider)
    started = await register(env, "run-c1", "checked-assistant")
    await svc.handle(_Delivery(started))
    await svc.handle(_Delivery(outcome("run-c1", 0)))

    run = await env.run("run-c1")
    assert (run["status"], run["answer"]) == ("succeeded", SECOND.answer)
    steps = await env.steps("run-c1")
    assert [
        (k, p.get("decision") or p.get("verdict") or p.get("critic") or p.get("state"))
        for k, p in steps
    ] == [
        ("decision", "select_capability"),
        ("observation", "succeeded"),
        ("decision", "answer_directly"),
        ("critic", "replan"),
        ("observation", "replan"),
        ("decision", "answer_directly"),
        ("critic", "accept"),
    ]
    assert [p["answer"] for k, p in steps if p.get("decision") == "answer_directly"] == [
        FIRST.answer,
        SECOND.answer,
    ]
    assert steps[4][1] == {"critic": "replan", "reason": REPLAN.reason, "answer_accepted": False}
    assert (provider.decisions, provider.verdicts) == (3, 2)
    keys = [k for k, lease, _ in await env.draws("run-c1") if lease is not None]
    assert keys == ["0:capability", "0:model", "2:model", "3:critic", "5:model", "6:critic"]
    assert await env.reservations("run-c1") == [("lease:1", "settled", 5, 0, 1)]
    # Sealed, the journal replays the run identical, critic verdicts included.
    sealer = Sealer(pool=env.planner_pool, journal=env.journal, signing=SigningKey.generate("p-1"))
    await sealer.seal_all()
    entries, record, unsealed = await PlannerStore(
        env.planner_pool, journal=env.journal
    ).read_replay("acme", "run-c1")
    report = replay_run("run-c1", entries, record=record, unsealed=unsealed)
    assert (report.verdict, report.divergences, report.missing) == ("identical", [], [])


async def test_a_replan_that_runs_out_of_budget_ends_budget_exhausted(env: Env) -> None:
    provider = Counting(
        {"checked-assistant": [FIRST, SECOND]}, {"checked-assistant": [REPLAN, Accept()]}
    )
    svc = env.service(provider)
    started = await register(env, "run-c2", "checked-assistant", provider_calls=3)
    await svc.handle(_Delivery(started))

    run = await env.run("run-c2")
    assert (run["status"], run["error_code"]) == ("failed", "BUDGET_EXHAUSTED")
    assert run["error_message"].startswith("provider_calls: ")
    assert [k for k, _ in await env.steps("run-c2")] == [
        "decision",
        "critic",
        "observation",
        "decision",
    ]
    assert (provider.decisions, provider.verdicts) == (2, 1)  # the second critic never ran
    assert env.exhausted() == 1.0


async def test_parallel_steps_in_flight_hold_the_next_one_back_at_the_concurrency_cap(
    env: Env,
) -> None:
    """Steps of one run in flight at once (its branches, another replica's): governance admits
    no more of them than the cap, and the planner's next step waits for one to settle — the
    run is retried, neither failed nor the model asked."""
    provider = Counting({"note-assistant": [NOTE, FIRST]})
    svc = env.service(provider)
    started = await register(env, "run-b10", "note-assistant")  # governance's cap: 4
    granted, refused = [], []

    async def step(i: int) -> None:
        try:
            granted.append(
                await budget.reserve(
                    env.nc,
                    tenant="acme",
                    run_id="run-b10",
                    step_key=f"run-b10.b{i}:0:model",
                    provider_calls=1,
                    tokens=10,
                )
            )
        except budget.BudgetExhausted as exc:
            refused.append(exc.kind)

    async with anyio.create_task_group() as tg:
        for i in range(12):
            tg.start_soon(step, i)
    assert (len(granted), refused) == (4, ["concurrent_steps"] * 8)

    # The run's own next step, under its manifest (concurrent_steps 1): held back, retried.
    with pytest.raises(RetryableError, match="4 steps in flight, at most 1"):
        await svc.handle(_Delivery(started))
    assert provider.decisions == 0 and await env.steps("run-b10") == []
    assert (await env.run("run-b10"))["status"] == "running"
    assert (
        await env.db.fetchval(
            "SELECT max_concurrent_steps FROM governance.budgets WHERE run_id = 'run-b10'"
        )
        == 1
    )

    for held in granted:  # the steps in flight end
        await budget.settle(
            env.nc,
            tenant="acme",
            run_id="run-b10",
            reservation_id=held.reservation_id,
            provider_calls=1,
            tokens=10,
        )
    await svc.handle(_Delivery(started))  # the retry takes the step
    assert provider.decisions == 1
    assert [k for k, _ in await env.steps("run-b10")] == ["decision"]
    open_steps = await env.db.fetchval(
        "SELECT open_steps FROM governance.budgets WHERE run_id = 'run-b10'"
    )
    assert open_steps == 1  # the proposal's capability call, until its outcome


def _prices(limit: str) -> PriceTable:
    # 1,000 per million tokens: a token costs 0.001.
    return PriceTable(
        tenant="acme",
        version="v1",
        currency="EUR",
        models={"scripted/scripted": ModelPrice(input_per_mtok="1000", output_per_mtok="1000")},
        caps=[Cap(name="acme-daily", window="day", limit=limit)],
    )


async def test_a_spend_cap_fails_the_run_naming_it_without_asking_the_model(env: Env) -> None:
    assert env.governance is not None
    # A model call reserves 100 tokens: 0.10 at worst, more than the cap leaves.
    env.governance.set_prices("acme", _prices("0.05"))
    provider = Counting({"note-assistant": [NOTE, FIRST]})
    svc = env.service(provider)
    await svc.handle(_Delivery(await register(env, "run-s1", "note-assistant")))
    run = await env.run("run-s1")
    assert (run["status"], run["error_code"]) == ("failed", "BUDGET_EXHAUSTED")
    assert run["error_message"].startswith("spend: spend cap 'acme-daily'")
    assert provider.decisions == 0
    refusal = await env.db.fetchval(
        "SELECT count(*) FROM governance.journal WHERE kind = 'budget.exhausted' "
        "AND run_id = 'run-s1'"
    )
    assert refusal == 1
    assert await env.reservations("run-s1") == []


async def test_a_capped_run_is_charged_what_the_model_reported(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    assert env.governance is not None
    env.governance.set_prices("acme", _prices("1.00"))
    provider = Counting({"note-assistant": [NOTE, FIRST]})
    provider.tokens_per_call = 37
    svc = env.service(provider)
    await svc.handle(_Delivery(await register(env, "run-s2", "note-assistant")))
    await svc.handle(_Delivery(outcome("run-s2", 0)))
    assert (await env.run("run-s2"))["status"] == "succeeded"
    assert provider.decisions == 2
    spend = await env.governance.spend("acme")
    # Two decisions of 37 tokens at 0.001 each, every hold returned.
    assert [(s["cap"], s["reserved_micros"], s["used_micros"]) for s in spend] == [
        ("acme-daily", 0, 74_000)
    ]
    # `writ spend` asks governance: the cap, its window, what was settled, nothing held.
    url = env.nc.connected_url
    assert url is not None
    assert await list_spend(f"nats://{url.hostname}:{url.port}", "acme", window="day") == 0
    printed = capsys.readouterr().out
    assert "acme-daily" in printed and "settled 0.074, held 0 of 1.00 EUR" in printed
    await list_spend(f"nats://{url.hostname}:{url.port}", "acme", window="month")
    assert "no spend recorded for acme" in capsys.readouterr().out
    # No lease took more than its first step asked (the caps hold what each step may cost).
    reserved = await env.db.fetch(
        "SELECT tokens, capability_calls FROM governance.reservations WHERE run_id = 'run-s2'"
    )
    assert sorted((r["tokens"], r["capability_calls"]) for r in reserved) == [
        (0, 1),
        (100, 0),
        (100, 0),
    ]
