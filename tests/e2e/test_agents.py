"""Agents and the decision protocol through the six real processes: the catalog on
request, a selection refused before any handler, a run for an agent no manifest declares, and a
review the agent asked for, each replayed identical offline."""

from __future__ import annotations

from typing import Any

import asyncpg
import msgspec
import pytest

from schemas.host import RunResult
from schemas.planner import REVIEW, ReviewAnswer, ReviewTaken
from tests.e2e.conftest import Host, replayed, run_input
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def _result(
    stack: Stack, host: Host, request_id: str, status: str | None = None
) -> RunResult:
    try:
        return await host.wait_result(request_id, status=status)
    except TimeoutError:
        raise AssertionError(stack.log_tail("planner")) from None


async def _steps(db: asyncpg.Connection, run_id: str) -> list[tuple[str, dict]]:
    rows = await db.fetch(
        "SELECT kind, payload FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id
    )
    return [(r["kind"], msgspec.json.decode(r["payload"])) for r in rows]


async def test_request_capabilities_then_select_an_action(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    # The tenant's administrator lets this agent write without asking, as for the demo agent.
    await db.execute(
        "INSERT INTO governance.standing_grants (tenant, agent, family, "
        "granted_by) VALUES ('acme', 'catalog-assistant', 'write_delete', "
        "'admin@acme.example') ON CONFLICT DO NOTHING"
    )
    request = host.request(agent="catalog-assistant")
    await host.publish(request, msg_id=request.request_id)
    result = await _result(stack, host, request.request_id)
    assert result.status == "succeeded", (result, stack.log_tail("planner"))
    assert result.run_id is not None

    steps = await _steps(db, result.run_id)
    assert [(k, p.get("decision")) for k, p in steps] == [
        ("decision", "request_capabilities"),
        ("decision", "select_capability"),
        ("observation", None),
        ("decision", "answer_directly"),
    ]
    assert steps[2][1]["state"] == "succeeded"
    digests = [
        r["input_digest"]
        for r in await db.fetch(
            "SELECT input_digest FROM planner.steps WHERE run_id = $1 AND kind = 'decision' "
            "ORDER BY seq",
            result.run_id,
        )
    ]
    assert len(set(digests)) == 3  # the summary, then the catalog, then with the outcome
    commands = await db.fetch(
        "SELECT action, state FROM admission.commands WHERE run_id = $1", result.run_id
    )
    assert [(c["action"], c["state"]) for c in commands] == [("crm.note.create", "succeeded")]
    manifest = msgspec.json.decode(
        await db.fetchval("SELECT manifest FROM planner.runs WHERE run_id = $1", result.run_id)
    )
    assert (manifest["version"], [e["ref"] for e in manifest["catalog"]]) == (
        "1.0.0",
        ["action:crm.note.create", "action:writ.noop"],
    )
    report = await replayed(host, db, result.run_id)
    assert (report.verdict, report.divergences, report.missing) == ("identical", [], [])


async def test_a_capability_not_in_uses_is_refused_observed_and_the_run_answers(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    request = host.request(agent="scoped-assistant", text="Charge the expedited shipping")
    await host.publish(request, msg_id=request.request_id)
    result = await _result(stack, host, request.request_id)
    assert result.status == "succeeded", (result, stack.log_tail("planner"))
    assert result.answer == "Charging is not among my capabilities; nothing was charged."
    assert result.actions == []
    assert result.run_id is not None

    steps = await _steps(db, result.run_id)
    assert [k for k, _ in steps] == ["decision", "observation", "decision"]
    assert steps[1][1] == {
        "target": "payment.charge.create",
        "refused": "uses",
        "executed": False,
        "reason": "payment.charge.create is not among the capabilities agent scoped-assistant uses",
    }
    # Refused before any handler: admission never saw a proposal, nothing was admitted.
    assert (
        await db.fetchval(
            "SELECT count(*) FROM admission.commands WHERE run_id = $1", result.run_id
        )
        == 0
    )
    assert (
        await db.fetchval(
            "SELECT count(*) FROM admission.proposals WHERE run_id = $1", result.run_id
        )
        == 0
    )
    report = await replayed(host, db, result.run_id)
    assert (report.verdict, report.divergences, report.missing) == ("identical", [], [])


async def test_a_run_for_an_unknown_agent_is_refused_with_its_code(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    request = host.request(agent="ghost-assistant")
    await host.publish(request, msg_id=request.request_id)
    result = await _result(stack, host, request.request_id)
    # Refused at the door, as a command for an unknown agent is (and as over HTTP): no run.
    assert result.status == "rejected" and result.error is not None
    assert result.error.code == "UNKNOWN_AGENT"
    assert "ghost-assistant" in result.error.message
    assert result.run_id is None
    assert (
        await db.fetchval(
            "SELECT count(*) FROM planner.runs WHERE request_id = $1", request.request_id
        )
        == 0
    )


async def test_a_requested_review_waits_for_a_person_then_the_run_goes_on(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    request = host.request(agent="review-assistant")
    await host.publish(request, msg_id=request.request_id)
    waiting = await _result(stack, host, request.request_id)
    assert waiting.status == "awaiting_human", (waiting, stack.log_tail("planner"))
    assert waiting.error is not None and waiting.error.code == "HUMAN_REVIEW"
    assert waiting.error.message.startswith("Confirm the note")
    run_id = waiting.run_id
    assert run_id is not None and waiting.pending_id == f"review-{run_id}-0"
    incomplete = await replayed(host, db, run_id)
    assert incomplete.verdict == "incomplete", incomplete

    def answer(**kw: Any) -> bytes:
        return msgspec.json.encode(
            ReviewAnswer(
                **{
                    "tenant": "acme",
                    "run_id": run_id,
                    "step": 0,
                    "answer": "approve",
                    "reviewer": "ops@acme.example",
                    **kw,
                }
            )
        )

    # Another tenant, or a step nobody asked about, answers nothing.
    for wrong in (answer(tenant="globex"), answer(step=3)):
        reply = await host.nc.request(REVIEW, wrong, timeout=10)
        assert reply.headers and reply.headers.get("Nats-Service-Error-Code") == "404"
    reply = await host.nc.request(REVIEW, answer(), timeout=10)
    taken = msgspec.json.decode(reply.data, type=ReviewTaken)
    assert (taken.run_id, taken.status) == (run_id, "succeeded")
    done = await _result(stack, host, request.request_id, status="succeeded")
    assert done.answer == "The reviewer confirmed; the note can be written."
    steps = await _steps(db, run_id)
    assert steps[1] == (
        "observation",
        {"review": "approve", "reviewer": "ops@acme.example", "reason": ""},
    )
    # Answered once: the same answer again finds no review waiting.
    again = await host.nc.request(REVIEW, answer(), timeout=10)
    assert again.headers and again.headers.get("Nats-Service-Error-Code") == "404"
    report = await replayed(host, db, run_id)
    assert (report.verdict, report.divergences, report.missing) == ("identical", [], [])


async def test_an_agent_calls_another_as_a_branch_and_observes_its_answer(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    request = host.request(agent="case-assistant", text="What does Acme owe for order 7781?")
    await host.publish(request, msg_id=request.request_id)
    result = await _result(stack, host, request.request_id)
    assert result.status == "succeeded", (result, stack.log_tail("planner"))
    assert result.run_id is not None
    assert result.answer is not None and "49 EUR" in result.answer

    steps = await _steps(db, result.run_id)
    assert [(k, p.get("decision")) for k, p in steps] == [
        ("decision", "select_capability"),
        ("observation", None),
        ("decision", "answer_directly"),
    ]
    branch_id = f"{result.run_id}.b0"
    assert steps[1][1] == {
        "agent": "ledger-assistant",
        "executed": True,
        "untrusted": True,
        "answer": "ACME-42 owes 49 EUR: expedited shipping of order 7781.",
        "truncated": False,
    }
    branch = await db.fetchrow(
        "SELECT agent, status FROM planner.runs WHERE run_id = $1", branch_id
    )
    assert (branch["agent"], await run_input(db, stack, branch_id), branch["status"]) == (
        "ledger-assistant",
        "What does ACME-42 owe for order 7781?",
        "succeeded",
    )
    assert [k for k, _ in await _steps(db, branch_id)] == ["decision"]
    # Governance decided the call; the branch's model call was reserved under the run's budget.
    assert [
        (r["tool"], r["verdict"])
        for r in await db.fetch(
            "SELECT tool, verdict FROM governance.decisions WHERE run_id = $1", result.run_id
        )
    ] == [("agent:ledger-assistant", "allow")]
    assert f"{branch_id}:0:model" in {
        r["step_key"]
        for r in await db.fetch(
            "SELECT step_key FROM governance.reservations WHERE run_id = $1", result.run_id
        )
    }
    for run_id in (result.run_id, branch_id):
        report = await replayed(host, db, run_id)
        assert (report.verdict, report.divergences, report.missing) == ("identical", [], [])
