"""Spend caps on the run path, against governance's real endpoints on a real nats-server and
PostgreSQL: a run's capability calls are priced by their action (and, where the price table
says so, by the amount their arguments carry), held while in flight and charged once, however
often their deliveries come again; a charge above what a cap leaves proposes nothing; an
amount in another currency than the table's cannot be priced and is refused (fail closed)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from actions import ACTIONS
from libs.runtime import Runtime
from libs.telemetry import make_tracer_provider
from schemas.dispatcher import CommandOutcome
from services.governance.spend import ActionPrice, Cap, ModelPrice, PriceTable, money
from services.planner.agents import AgentRegistry, load_manifest
from services.planner.provider import SelectCapability
from services.planner.service import PlannerService
from services.planner.store import PlannerStore
from tests.integration import test_planner_budgets as budgets
from tests.integration.test_planner_budgets import (
    FIRST,
    NOTE,
    Counting,
    Env,
    _Delivery,
    register,
)

pytestmark = pytest.mark.anyio

env = budgets.env  # that module's fixture: governance and the planner on one database


def charge(cents: int, currency: str = "EUR") -> SelectCapability:
    return SelectCapability(
        capability="payment.charge.create",
        arguments={
            "customer_id": "ACME-42",
            "amount_cents": cents,
            "currency": currency,
            "description": "Annual plan",
        },
    )


def prices(limit: str) -> PriceTable:
    """A token costs 0.001; a note 0.25 a call; a charge 0.01 a call plus its amount."""
    return PriceTable(
        tenant="acme",
        version="v2",
        currency="EUR",
        models={"scripted/scripted": ModelPrice(input_per_mtok="1000", output_per_mtok="1000")},
        actions={
            "crm.note.create": ActionPrice(per_call="0.25"),
            "payment.charge.create": ActionPrice(per_call="0.01", amount_from_arguments=True),
        },
        caps=[Cap(name="acme-daily", window="day", limit=limit)],
    )


def service(env: Env, provider: Counting) -> PlannerService:
    """The planner with a note agent and a billing agent (which charges customers)."""
    uses = {"note-assistant": "crm.note.create", "billing": "payment.charge.create"}
    agents = AgentRegistry(
        [
            load_manifest(
                msgspec.json.encode(
                    {
                        "name": name,
                        "version": "1.0.0",
                        "responsibility": "Act for the customer.",
                        "uses": [{"kind": "action", "name": action}],
                    }
                )
            )
            for name, action in uses.items()
        ]
    )
    agents.resolve(actions=ACTIONS)
    rt = Runtime(
        name="planner",
        nc=env.nc,
        js=env.nc.jetstream(),
        registry=CollectorRegistry(),
        tracer_provider=make_tracer_provider("planner"),
    )
    env.provider = provider
    return PlannerService(
        rt=rt,
        store=PlannerStore(env.planner_pool, journal=env.journal),
        provider=provider,
        agents=agents,
        reserve_tokens=100,
        lease_steps=8,
    )


def outcome(run_id: str, action: str) -> CommandOutcome:
    return CommandOutcome(
        tenant="acme",
        operation_id=f"op-{run_id}",
        run_id=run_id,
        step=0,
        action=action,
        state="succeeded",
        receipt="r-1",
    )


async def spend(env: Env) -> list[tuple[str, int, int]]:
    assert env.governance is not None
    return [
        (str(s["cap"]), int(s["reserved_micros"]), int(s["used_micros"]))  # type: ignore[call-overload]
        for s in await env.governance.spend("acme")
    ]


async def charges(env: Env, run_id: str) -> list[tuple[int, int | None]]:
    """Each held charge of the run: its worst case and what it was charged, hold order."""
    rows = await env.db.fetch(
        "SELECT c.worst_micros, c.used_micros FROM governance.spend_charges c "
        "JOIN governance.reservations r ON r.reservation_id = c.reservation_id "
        "WHERE r.run_id = $1 ORDER BY r.reserved_at",
        run_id,
    )
    return [(r["worst_micros"], r["used_micros"]) for r in rows]


async def test_a_runs_action_is_priced_held_and_charged_once(env: Env) -> None:
    assert env.governance is not None
    env.governance.set_prices("acme", prices("10.00"))
    provider = Counting({"note-assistant": [NOTE, FIRST]})
    provider.tokens_per_call = 37
    svc = service(env, provider)
    started = await register(env, "run-p1", "note-assistant")
    await svc.handle(_Delivery(started))
    await svc.handle(_Delivery(started))  # a redelivery: no second hold
    # The note's call is held at its price while it is in flight; the model call is settled.
    assert await charges(env, "run-p1") == [(100_000, 37_000), (money("0.25"), None)]
    assert await spend(env) == [("acme-daily", money("0.25"), 37_000)]
    await svc.handle(_Delivery(outcome("run-p1", "crm.note.create")))
    await svc.handle(_Delivery(outcome("run-p1", "crm.note.create")))  # and again
    assert (await env.run("run-p1"))["status"] == "succeeded"
    # Two model calls of 37 tokens at 0.001 and one note at 0.25: charged once each.
    assert await spend(env) == [("acme-daily", 0, 2 * 37_000 + money("0.25"))]
    assert len(await charges(env, "run-p1")) == 3
    charged = await env.db.fetchval(
        "SELECT count(*) FROM governance.journal WHERE kind = 'spend.charged' AND run_id = 'run-p1'"
    )
    assert charged == 3


async def test_a_charge_is_held_at_its_amount_and_one_above_the_cap_proposes_nothing(
    env: Env,
) -> None:
    assert env.governance is not None
    env.governance.set_prices("acme", prices("100.00"))
    provider = Counting({"billing": [charge(6_000), FIRST]})
    svc = service(env, provider)
    await svc.handle(_Delivery(await register(env, "run-p2", "billing")))
    # 60.00 and the call's 0.01, held until the charge's outcome, then charged.
    assert await charges(env, "run-p2") == [(100_000, 0), (money("60.01"), None)]
    await svc.handle(_Delivery(outcome("run-p2", "payment.charge.create")))
    assert (await env.run("run-p2"))["status"] == "succeeded"
    assert await spend(env) == [("acme-daily", 0, money("60.01"))]

    # 50.00 more would exceed the cap: the run fails naming it, and nothing is proposed.
    provider = Counting({"billing": [charge(5_000), FIRST]})
    svc = service(env, provider)
    await svc.handle(_Delivery(await register(env, "run-p3", "billing")))
    run = await env.run("run-p3")
    assert (run["status"], run["error_code"]) == ("failed", "BUDGET_EXHAUSTED")
    assert run["error_message"].startswith("spend: spend cap 'acme-daily'")
    assert await _proposals(env, "run-p3") == 0
    assert await spend(env) == [("acme-daily", 0, money("60.01"))]


async def test_a_charge_in_another_currency_cannot_be_priced_and_is_refused(env: Env) -> None:
    assert env.governance is not None
    env.governance.set_prices("acme", prices("100.00"))
    provider = Counting({"billing": [charge(100, "USD"), FIRST]})
    svc = service(env, provider)
    await svc.handle(_Delivery(await register(env, "run-p4", "billing")))
    run = await env.run("run-p4")
    assert (run["status"], run["error_code"]) == ("failed", "BUDGET_EXHAUSTED")
    assert "cannot be priced" in run["error_message"] and "USD" in run["error_message"]
    assert await _proposals(env, "run-p4") == 0
    refused = await env.db.fetchval(
        "SELECT count(*) FROM governance.journal WHERE kind = 'budget.exhausted' "
        "AND run_id = 'run-p4'"
    )
    assert refused == 1


async def _proposals(env: Env, run_id: str) -> Any:
    return await env.db.fetchval(
        "SELECT count(*) FROM planner.journal WHERE run_id = $1 AND kind = 'proposal'", run_id
    )
