"""An agent calls another agent as a governed capability, against
governance's real endpoints on a real nats-server and PostgreSQL: the call is refused before
anything runs unless the callee lists the caller in `callable_by`, is not too deep and closes no
cycle; an allowed call (governance's `decide` first) runs as a branch run with its own steps
— its model never sees the caller's input, evidence or observations, the caller sees only the
branch's answer — that spends the root run's budgets, so a tiny budget stops both; a branch that
stops for a person stops its caller for the same decision until it goes on, the root's run
grants cover the branch's reads, and a branch's proposal is the branch's, its outcome observed
by the branch; only the root run counts among the runs finished. The
`BranchChanged` messages the planner publishes to itself are handed back to
`PlannerService.handle` in order, as its inbox would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from actions import ACTIONS
from libs.journal import Sealer, SigningKey
from libs.runtime import Runtime
from libs.telemetry import make_tracer_provider
from schemas import subjects
from schemas.base import Family
from schemas.dispatcher import CommandOutcome
from schemas.planner import BranchChanged, ProposeCommand
from services.planner.agents import AgentRegistry, load_manifest
from services.planner.provider import (
    AnswerDirectly,
    CriticInput,
    CriticVerdict,
    ModelDecision,
    ModelInput,
    RequestCapabilities,
    ScriptedProvider,
    SelectCapability,
    TextSink,
)
from services.planner.replay import replay_run
from services.planner.service import PlannerService
from services.planner.store import PlannerStore
from tests.integration import test_planner_reads as reads
from tests.integration.test_planner_reads import Env, _Delivery, register

pytestmark = pytest.mark.anyio
# The read tests' environment: this module's nats-server, the planner's, governance's and
# retrieval's schemas, governance serving `decide` and the budgets.
env = reads.env

SECRET = "the parent's private evidence: order 7781"
ASK_BILLING = SelectCapability(
    capability="agent:billing", arguments={"request": "What does ACME-42 owe?"}
)
BILLED = AnswerDirectly(answer="ACME-42 owes 49 EUR.")
DONE = AnswerDirectly(answer="Told the customer: 49 EUR.")


def manifest(
    name: str,
    *,
    calls: tuple[str, ...] = (),
    callable_by: tuple[str, ...] = (),
    provider_calls: int = 8,
    tools: tuple[str, ...] = (),
    actions: tuple[str, ...] = (),
) -> dict[str, Any]:
    return {
        "name": name,
        "version": "1.0.0",
        "responsibility": f"Be {name}.",
        "uses": [{"kind": "agent", "name": c, "description": f"Asks {c}."} for c in calls]
        + [{"kind": "tool", "name": t} for t in tools]
        + [{"kind": "action", "name": a} for a in actions],
        "callable_by": list(callable_by),
        "budgets": {"provider_calls": provider_calls},
    }


class Recording:
    """Scripted decisions per agent, keeping every model input each agent was given."""

    def __init__(self, scripts: dict[str, list[ModelDecision]]) -> None:
        self._inner = ScriptedProvider([DONE], scripts)
        self.inputs: dict[str, list[ModelInput]] = {}

    async def decide(self, model_input: ModelInput) -> ModelDecision:
        return (await self.decide_with_usage(model_input))[0]

    async def decide_with_usage(
        self, model_input: ModelInput, *, text: TextSink | None = None
    ) -> tuple[ModelDecision, int]:
        self.inputs.setdefault(model_input.agent, []).append(model_input)
        return await self._inner.decide_with_usage(model_input, text=text)

    async def verify(self, critic_input: CriticInput) -> tuple[CriticVerdict, int]:
        return await self._inner.verify(critic_input)


class Planner:
    """The planner under test, and its own inbox's `BranchChanged` messages."""

    def __init__(self, env: Env, provider: Recording, manifests: list[dict[str, Any]]) -> None:
        agents = AgentRegistry([load_manifest(msgspec.json.encode(m)) for m in manifests])
        agents.resolve(actions=ACTIONS)
        rt = Runtime(
            name="planner",
            nc=env.nc,
            js=env.nc.jetstream(),
            registry=CollectorRegistry(),
            tracer_provider=make_tracer_provider("p"),
        )
        self.svc = PlannerService(
            rt=rt,
            store=PlannerStore(env.planner_pool, journal=env.journal),
            provider=provider,
            agents=agents,
            reserve_tokens=100,
        )
        self.env, self.registry = env, rt.registry
        self.inbox: list[BranchChanged] = []

    async def __aenter__(self) -> Planner:
        async def collect(msg: Any) -> None:
            self.inbox.append(msgspec.json.decode(msg.data, type=BranchChanged))

        self._sub = await self.env.nc.subscribe(subjects.branch("acme"), cb=collect)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._sub.unsubscribe()

    async def drive(self, run_id: str, agent: str, *, grants: tuple[Family, ...] = ()) -> None:
        """Start `run_id` and deliver what the planner sent itself until nothing is left."""
        started = await register(self.env, run_id, grants=grants)
        started = msgspec.structs.replace(
            started,
            agent=agent,
            evidence=[
                {
                    "document_id": "d-1",
                    "kind": "ticket",
                    "title": "Order",
                    "text": SECRET,
                    "rank": 1.0,
                }
            ],
        )
        await self.deliver(started)

    async def deliver(self, message: Any) -> None:
        """Hand `message` to the planner, then what it sent itself until nothing is left."""
        await self.svc.handle(_Delivery(message))
        for _ in range(20):
            await self.env.nc.flush()
            if not self.inbox:
                return
            await self.svc.handle(_Delivery(self.inbox.pop(0)))
        raise AssertionError("the branches never settled")


@pytest.fixture
async def used(env: Env) -> AsyncIterator[Any]:
    async def read(run_id: str) -> tuple[int, int]:
        row = await env.db.fetchrow(
            "SELECT used_provider_calls, used_capability_calls FROM "
            "governance.budgets WHERE run_id = $1",
            run_id,
        )
        return row["used_provider_calls"], row["used_capability_calls"]

    yield read


async def test_a_called_agent_answers_in_its_own_branch_and_the_caller_observes_it(
    env: Env, used: Any
) -> None:
    provider = Recording({"front": [ASK_BILLING, DONE], "billing": [BILLED]})
    async with Planner(
        env,
        provider,
        [manifest("front", calls=("billing",)), manifest("billing", callable_by=("front",))],
    ) as p:
        await p.drive("run-b1", "front")

    run, branch = await env.run("run-b1"), await env.run("run-b1.b0")
    assert (run["status"], run["answer"]) == ("succeeded", DONE.answer)
    assert (branch["status"], branch["answer"], branch["agent"]) == (
        "succeeded",
        BILLED.answer,
        "billing",
    )
    steps = await env.steps("run-b1")
    assert [k for k, _ in steps] == ["decision", "observation", "decision"]
    assert steps[1][1] == {
        "agent": "billing",
        "executed": True,
        "untrusted": True,
        "answer": BILLED.answer,
        "truncated": False,
    }
    assert [k for k, _ in await env.steps("run-b1.b0")] == ["decision"]
    # Isolation: the branch's model saw the request it was given, nothing of the caller's.
    [seen] = provider.inputs["billing"]
    assert seen.user == "What does ACME-42 owe?"
    assert (seen.untrusted, seen.observations) == ([], [])
    assert SECRET not in msgspec.json.encode(seen).decode()
    # ...and the caller saw only the branch's answer, as an observation.
    assert provider.inputs["front"][1].observations == [steps[1][1]]
    # Governance decided the call like any capability; the budgets are the root run's.
    assert await env.decided("run-b1") == [("agent:billing", "allow")]
    # The root's steps draw on its leases (the first ended with the delivery that started
    # the branch, before the branch was woken); the branch reserves each step on its own.
    assert await env.reservations("run-b1") == [
        ("lease:1", "settled", 1),
        ("run-b1.b0:0:model", "settled", 0),
        ("lease:2", "settled", 0),
    ]
    assert await used("run-b1") == (3, 1)

    await Sealer(
        pool=env.planner_pool, journal=env.journal, signing=SigningKey.generate("p-1")
    ).seal_all()
    store = PlannerStore(env.planner_pool, journal=env.journal)
    for run_id in ("run-b1", "run-b1.b0"):
        entries, record, unsealed = await store.read_replay("acme", run_id)
        report = replay_run(run_id, entries, record=record, unsealed=unsealed)
        assert (report.verdict, report.divergences, report.missing) == ("identical", [], [])


async def test_an_agent_that_does_not_list_the_caller_is_refused_before_anything_runs(
    env: Env,
) -> None:
    provider = Recording({"front": [ASK_BILLING, DONE], "billing": [BILLED]})
    async with Planner(
        env,
        provider,
        [manifest("front", calls=("billing",)), manifest("billing", callable_by=("backoffice",))],
    ) as p:
        await p.drive("run-b2", "front")

    steps = await env.steps("run-b2")
    assert steps[1][1]["refused"] == "callable_by" and steps[1][1]["executed"] is False
    assert await env.run("run-b2.b0") is None  # no branch
    assert "billing" not in provider.inputs
    assert await env.decided("run-b2") == []  # refused before governance was asked
    assert (await env.run("run-b2"))["status"] == "succeeded"


async def test_a_call_back_up_the_chain_is_refused_as_a_cycle(env: Env) -> None:
    back = SelectCapability(capability="agent:front", arguments={"request": "Ask me again."})
    provider = Recording({"front": [ASK_BILLING, DONE], "billing": [back, BILLED]})
    async with Planner(
        env,
        provider,
        [
            manifest("front", calls=("billing",), callable_by=("billing",)),
            manifest("billing", calls=("front",), callable_by=("front",)),
        ],
    ) as p:
        await p.drive("run-b3", "front")

    branch_steps = await env.steps("run-b3.b0")
    assert branch_steps[1][1]["refused"] == "cycle"
    assert await env.run("run-b3.b0.b0") is None
    assert (await env.run("run-b3.b0"))["answer"] == BILLED.answer
    assert (await env.run("run-b3"))["status"] == "succeeded"


async def test_a_call_deeper_than_the_bound_is_refused(env: Env) -> None:
    def ask(callee: str) -> SelectCapability:
        return SelectCapability(capability=f"agent:{callee}", arguments={"request": "Go on."})

    provider = Recording(
        {"a": [ask("b"), DONE], "b": [ask("c"), BILLED], "c": [ask("d"), BILLED], "d": [BILLED]}
    )
    async with Planner(
        env,
        provider,
        [
            manifest("a", calls=("b",)),
            manifest("b", calls=("c",), callable_by=("a",)),
            manifest("c", calls=("d",), callable_by=("b",)),
            manifest("d", callable_by=("c",)),
        ],
    ) as p:
        await p.drive("run-b4", "a")

    assert (await env.steps("run-b4.b0.b0"))[1][1]["refused"] == "depth"
    assert "d" not in provider.inputs
    assert (await env.run("run-b4"))["status"] == "succeeded"


async def test_a_tiny_budget_stops_the_branch_and_its_caller(env: Env, used: Any) -> None:
    provider = Recording({"front": [ASK_BILLING, DONE], "billing": [RequestCapabilities(), BILLED]})
    async with Planner(
        env,
        provider,
        [
            manifest("front", calls=("billing",), provider_calls=2),
            manifest("billing", callable_by=("front",)),
        ],
    ) as p:
        started = await register(env, "run-b5", provider_calls=2)
        await p.svc.handle(_Delivery(msgspec.structs.replace(started, agent="front")))
        for _ in range(20):
            await env.nc.flush()
            if not p.inbox:
                break
            await p.svc.handle(_Delivery(p.inbox.pop(0)))

    branch = await env.run("run-b5.b0")
    assert (branch["status"], branch["error_code"]) == ("failed", "BUDGET_EXHAUSTED")
    assert branch["error_message"].startswith("provider_calls")
    steps = await env.steps("run-b5")
    assert (steps[1][1]["outcome"], steps[1][1]["executed"]) == ("failed", True)
    run = await env.run("run-b5")
    assert (run["status"], run["error_code"]) == ("failed", "BUDGET_EXHAUSTED")
    assert len(provider.inputs["front"]) == 1 and len(provider.inputs["billing"]) == 1
    assert (await used("run-b5"))[0] == 2


async def test_a_call_governance_denies_is_observed_and_no_branch_runs(env: Env) -> None:
    await env.db.execute(
        "INSERT INTO governance.rules (tenant, tool, arg_prefix, effect) "
        "VALUES ('acme', 'agent:billing', 'What', 'deny')"
    )
    provider = Recording({"front": [ASK_BILLING, DONE], "billing": [BILLED]})
    async with Planner(
        env,
        provider,
        [manifest("front", calls=("billing",)), manifest("billing", callable_by=("front",))],
    ) as p:
        await p.drive("run-b6", "front")

    steps = await env.steps("run-b6")
    assert steps[1][1] == {
        "agent": "billing",
        "outcome": "denied",
        "executed": False,
        "reason": "a deny rule matches the call",
    }
    assert await env.decided("run-b6") == [("agent:billing", "deny")]
    assert await env.run("run-b6.b0") is None and "billing" not in provider.inputs
    assert ("lease:1", "settled", 1) in await env.reservations("run-b6")
    assert (await env.run("run-b6"))["status"] == "succeeded"


CUSTOMER = SelectCapability(
    capability="tool:crm.customer.get", arguments={"customer_id": "ACME-42"}
)


def finished(p: Planner, status: str) -> float:
    return (
        p.registry.get_sample_value("writ_planner_runs_finished_total", {"status": status}) or 0.0
    )


async def test_a_branch_that_stops_for_a_person_stops_its_caller_until_it_goes_on(env: Env) -> None:
    provider = Recording({"front": [ASK_BILLING, DONE], "billing": [CUSTOMER, BILLED]})
    async with Planner(
        env,
        provider,
        [
            manifest("front", calls=("billing",)),
            manifest("billing", callable_by=("front",), tools=("crm.customer.get",)),
        ],
    ) as p:
        await p.drive("run-b7", "front")
        run, branch = await env.run("run-b7"), await env.run("run-b7.b0")
        # The branch's read waits for a person, and so does its caller, for the same decision.
        assert (branch["status"], run["status"]) == ("awaiting_human", "awaiting_human")
        pending = await env.db.fetchval(
            "SELECT pending_id::text FROM governance.pending WHERE run_id = 'run-b7.b0'"
        )
        assert run["pending_id"] == branch["pending_id"] == pending
        assert "agent billing (branch run-b7.b0) waits for a person" in run["error_message"]
        assert [k for k, _ in await env.steps("run-b7")] == ["decision"]
        # One run stopped for a person, as the host sees it: the branch is not counted.
        assert finished(p, "awaiting_human") == 1

        await p.deliver(await reads._answer(env, pending, "once"))

    branch = await env.run("run-b7.b0")
    assert (branch["status"], branch["answer"]) == ("succeeded", BILLED.answer)
    assert [k for k, _ in await env.steps("run-b7.b0")] == ["decision", "observation", "decision"]
    run = await env.run("run-b7")
    assert (run["status"], run["answer"], run["pending_id"]) == ("succeeded", DONE.answer, None)
    steps = await env.steps("run-b7")
    assert steps[1][1]["answer"] == BILLED.answer
    assert (finished(p, "succeeded"), finished(p, "awaiting_human")) == (1, 1)


async def test_a_run_grant_of_the_root_covers_its_branchs_reads(env: Env) -> None:
    provider = Recording({"front": [ASK_BILLING, DONE], "billing": [CUSTOMER, BILLED]})
    async with Planner(
        env,
        provider,
        [
            manifest("front", calls=("billing",)),
            manifest("billing", callable_by=("front",), tools=("crm.customer.get",)),
        ],
    ) as p:
        await p.drive("run-b8", "front", grants=("read_personal",))

    assert await env.decided("run-b8.b0") == [("crm.customer.get", "allow")]
    observed = (await env.steps("run-b8.b0"))[1][1]
    assert [i["id"] for i in observed["items"]] == ["ACME-42"]
    assert (await env.run("run-b8"))["status"] == "succeeded"


async def test_a_branchs_proposal_goes_to_admission_and_its_outcome_back_to_the_branch(
    env: Env,
) -> None:
    note = SelectCapability(
        capability="action:crm.note.create",
        arguments={"customer_id": "ACME-42", "body": "Owes 49 EUR."},
    )
    provider = Recording({"front": [ASK_BILLING, DONE], "billing": [note, BILLED]})
    proposals: list[ProposeCommand] = []

    async def collect(msg: Any) -> None:
        proposals.append(msgspec.json.decode(msg.data, type=ProposeCommand))

    sub = await env.nc.subscribe(subjects.proposal("acme"), cb=collect)
    async with Planner(
        env,
        provider,
        [
            manifest("front", calls=("billing",)),
            manifest("billing", callable_by=("front",), actions=("crm.note.create",)),
        ],
    ) as p:
        await p.drive("run-b9", "front")
        await env.nc.flush()
        # Proposed by the branch, as the branch: its outcome is the branch's to observe.
        [proposed] = proposals
        assert (proposed.run_id, proposed.step, proposed.agent, proposed.action) == (
            "run-b9.b0",
            0,
            "billing",
            "crm.note.create",
        )
        assert (await env.run("run-b9"))["status"] == "running"  # waiting on its branch
        await p.deliver(
            CommandOutcome(
                tenant="acme",
                operation_id="op-b9",
                run_id="run-b9.b0",
                step=0,
                action="crm.note.create",
                state="succeeded",
                receipt="note-9",
            )
        )
    await sub.unsubscribe()

    branch_steps = await env.steps("run-b9.b0")
    assert branch_steps[1][1]["state"] == "succeeded"
    assert (await env.run("run-b9.b0"))["status"] == "succeeded"
    run = await env.run("run-b9")
    assert (run["status"], run["answer"]) == ("succeeded", DONE.answer)
    # The branch's capability call is the root run's to pay.
    assert ("run-b9.b0:0:capability", "settled", 1) in await env.reservations("run-b9")
