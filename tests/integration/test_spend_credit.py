"""A priced capability call that was definitely not carried out gives its charge back to the
caps, once; one that succeeded, or whose outcome nobody knows, stays charged. Against
governance's real endpoints and the planner on a real nats-server and PostgreSQL."""

from __future__ import annotations

import pytest

from schemas.admission import ProposalRefused, RefusalVerdict
from schemas.dispatcher import CommandOutcome, CommandState
from services.governance.spend import money
from tests.integration import test_planner_budgets as budgets
from tests.integration.test_planner_budgets import FIRST, Counting, Env, _Delivery, register
from tests.integration.test_spend_run_path import charge, prices, service, spend

pytestmark = pytest.mark.anyio

env = budgets.env  # that module's fixture: governance and the planner on one database

CHARGE = "payment.charge.create"


def refused(run_id: str, verdict: RefusalVerdict) -> ProposalRefused:
    return ProposalRefused(
        tenant="acme",
        run_id=run_id,
        step=0,
        action=CHARGE,
        verdict=verdict,
        reason="a person said no" if verdict != "ask" else "needs a person",
        pending_id="p-1" if verdict == "ask" else None,
    )


def ended(run_id: str, state: CommandState) -> CommandOutcome:
    return CommandOutcome(
        tenant="acme",
        operation_id=f"op-{run_id}",
        run_id=run_id,
        step=0,
        action=CHARGE,
        state=state,
        receipt="r-1" if state == "succeeded" else None,
    )


async def journaled(env: Env, run_id: str, kind: str) -> int:
    return int(
        await env.db.fetchval(
            "SELECT count(*) FROM governance.journal WHERE kind = $1 AND run_id = $2",
            kind,
            run_id,
        )
    )


async def charged(env: Env, run_id: str) -> tuple[int, int | None]:
    """The run's charge call (the one priced by its amount): what it was charged and what was
    credited back."""
    row = await env.db.fetchrow(
        "SELECT c.used_micros, c.credited_micros FROM governance.spend_charges c "
        "JOIN governance.reservations r ON r.reservation_id = c.reservation_id "
        "WHERE r.run_id = $1 AND c.fixed > 0",
        run_id,
    )
    assert row is not None
    return row["used_micros"], row["credited_micros"]


async def test_a_charge_a_person_rejects_is_back_under_the_cap_once(env: Env) -> None:
    assert env.governance is not None
    env.governance.set_prices("acme", prices("100.00"))
    svc = service(env, Counting({"billing": [charge(6_000), FIRST]}))
    await svc.handle(_Delivery(await register(env, "run-c1", "billing")))
    # Asked: the run waits for a person, and the charge's call counts in full meanwhile.
    await svc.handle(_Delivery(refused("run-c1", "ask")))
    assert (await env.run("run-c1"))["status"] == "awaiting_human"
    assert await spend(env) == [("acme-daily", 0, money("60.01"))]
    # The person rejects it: nothing was charged, so its amount is back under the cap.
    await svc.handle(_Delivery(refused("run-c1", "rejected")))
    assert await spend(env) == [("acme-daily", 0, 0)]
    assert await charged(env, "run-c1") == (money("60.01"), money("60.01"))
    # The same refusal delivered again gives back nothing more.
    await svc.handle(_Delivery(refused("run-c1", "rejected")))
    assert await spend(env) == [("acme-daily", 0, 0)]
    assert await journaled(env, "run-c1", "spend.credited") == 1

    # 60.00 more fits again (it would not with the rejected charge still counted).
    svc = service(env, Counting({"billing": [charge(6_000), FIRST]}))
    await svc.handle(_Delivery(await register(env, "run-c2", "billing")))
    assert (await env.run("run-c2"))["status"] == "running"
    assert await spend(env) == [("acme-daily", money("60.01"), 0)]


@pytest.mark.parametrize("state", ["denied", "expired", "failed", "revision_required"])
async def test_a_command_that_did_not_act_is_credited_once(env: Env, state: CommandState) -> None:
    assert env.governance is not None
    env.governance.set_prices("acme", prices("100.00"))
    svc = service(env, Counting({"billing": [charge(6_000), FIRST, FIRST]}))
    await svc.handle(_Delivery(await register(env, "run-c3", "billing")))
    assert await spend(env) == [("acme-daily", money("60.01"), 0)]  # held while in flight
    await svc.handle(_Delivery(ended("run-c3", state)))
    await svc.handle(_Delivery(ended("run-c3", state)))  # redelivered
    assert await spend(env) == [("acme-daily", 0, 0)]
    assert await charged(env, "run-c3") == (0, 0)  # its hold returned, nothing charged
    assert await journaled(env, "run-c3", "spend.credited") == 1


@pytest.mark.parametrize("state", ["succeeded", "unknown"])
async def test_a_charge_that_acted_or_may_have_stays_charged(env: Env, state: CommandState) -> None:
    assert env.governance is not None
    env.governance.set_prices("acme", prices("100.00"))
    svc = service(env, Counting({"billing": [charge(6_000), FIRST, FIRST]}))
    await svc.handle(_Delivery(await register(env, "run-c4", "billing")))
    await svc.handle(_Delivery(refused("run-c4", "ask")))  # asked, then approved and run
    await svc.handle(_Delivery(ended("run-c4", state)))
    await svc.handle(_Delivery(ended("run-c4", state)))
    assert await spend(env) == [("acme-daily", 0, money("60.01"))]
    assert await charged(env, "run-c4") == (money("60.01"), None)
    assert await journaled(env, "run-c4", "spend.credited") == 0


async def test_an_unknown_charge_reconciled_as_failed_is_credited_once(env: Env) -> None:
    """`unknown` stays charged until a person establishes what happened; when reconciliation
    finds the charge never happened, its outcome reaches the run again and the charge is
    given back, once, even though the run already ended on the `unknown`."""
    assert env.governance is not None
    env.governance.set_prices("acme", prices("100.00"))
    svc = service(env, Counting({"billing": [charge(6_000), FIRST, FIRST]}))
    await svc.handle(_Delivery(await register(env, "run-c5", "billing")))
    await svc.handle(_Delivery(ended("run-c5", "unknown")))
    assert (await env.run("run-c5"))["status"] == "succeeded"  # the model answered after it
    assert await spend(env) == [("acme-daily", 0, money("60.01"))]
    # Reconciled: the provider never charged. The outcome is published again, as failed.
    await svc.handle(_Delivery(ended("run-c5", "failed")))
    await svc.handle(_Delivery(ended("run-c5", "failed")))  # redelivered
    assert await spend(env) == [("acme-daily", 0, 0)]
    assert await charged(env, "run-c5") == (money("60.01"), money("60.01"))
    assert await journaled(env, "run-c5", "spend.credited") == 1
