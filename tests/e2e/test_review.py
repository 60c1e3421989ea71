"""A person answers the review a run's agent asked for, through the six real processes:
`ReviewDecision` on `writ.in.reviews.<tenant>`, verified by ingress (tenant and reviewer from the
token, the approver role required) and handed to the planner by request/reply."""

from __future__ import annotations

import sys
import uuid

import anyio
import asyncpg
import msgspec
import pytest

from schemas import subjects
from schemas.host import ApprovalAnswer, ReviewDecision, ReviewResult, RunResult
from tests.e2e.conftest import Host
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

AGENT = "review-assistant"  # asks for a review first, then answers once it is approved
PROMPT = "Confirm the note about the delayed shipment"


async def _waiting(stack: Stack, host: Host) -> RunResult:
    """Start a review-assistant run; its result once it waits for the review."""
    request = host.request(agent=AGENT, text="Note the call about order 7781's delay.")
    await host.publish(request, msg_id=request.request_id)
    try:
        waiting = await host.wait_result(request.request_id)
    except TimeoutError:
        raise AssertionError(stack.log_tail("planner")) from None
    assert waiting.status == "awaiting_human", (waiting, stack.log_tail("planner"))
    assert waiting.error is not None and waiting.error.code == "HUMAN_REVIEW"
    assert waiting.error.message.startswith(PROMPT)
    assert waiting.run_id is not None and waiting.pending_id == f"review-{waiting.run_id}-0"
    return waiting


async def _review(
    host: Host,
    pending_id: str,
    answer: ApprovalAnswer = "approve",
    *,
    comment: str = "",
    tenant: str = "acme",
    token: str | None = None,
) -> ReviewResult:
    """Publish a `ReviewDecision` on the tenant's subject; the `ReviewResult` it gets."""
    request_id = f"review-{uuid.uuid4().hex[:12]}"
    message = ReviewDecision(
        request_id=request_id,
        pending_id=pending_id,
        answer=answer,
        comment=comment,
        token=token or host.stack.token(tenant, "ops@acme.example", roles=["approver"]),
    )
    js = await host.tenant_js(tenant)  # as the tenant's host, with its permissions
    await js.publish(
        subjects.review(tenant), msgspec.json.encode(message), headers={"Nats-Msg-Id": request_id}
    )
    return await host.first(request_id, ReviewResult, tenant=tenant, timeout=40)


async def _final(host: Host, request_id: str) -> RunResult:
    """The run's result once it no longer waits for a person."""
    with anyio.fail_after(30):
        while True:
            for result in await host.results(request_id):
                if isinstance(result, RunResult) and result.status != "awaiting_human":
                    return result
            await anyio.sleep(0.1)


async def _run(db: asyncpg.Connection, run_id: str) -> tuple[str, list[tuple[str, dict]]]:
    status = await db.fetchval("SELECT status FROM planner.runs WHERE run_id = $1", run_id)
    rows = await db.fetch(
        "SELECT kind, payload FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id
    )
    return status, [(r["kind"], msgspec.json.decode(r["payload"])) for r in rows]


async def _writ(stack: Stack, *args: str) -> tuple[int, str]:
    """Run the `writ` command as an operator would: its exit status and output."""
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [
                sys.executable,
                "-m",
                "writ.cli",
                args[0],
                "--home",
                str(stack.home),
                "--nats-url",
                stack.nats_url,
                *args[1:],
            ],
            check=False,
        )
    return done.returncode, done.stdout.decode() + done.stderr.decode()


async def test_only_an_approver_of_the_runs_tenant_resumes_a_review(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    waiting = await _waiting(stack, host)
    assert waiting.run_id is not None and waiting.pending_id is not None
    pending_id, run_id = waiting.pending_id, waiting.run_id
    before = await _run(db, run_id)
    assert before[0] == "awaiting_human" and len(before[1]) == 1

    # The run's own principal, without the approver role: refused, and nothing reaches the run.
    forbidden = await _review(host, pending_id, token=stack.token("acme", "alice@acme.example"))
    assert not forbidden.accepted and forbidden.message.startswith("FORBIDDEN"), forbidden
    # Another tenant's approver: on acme's subject its token does not verify; on its own
    # tenant's subject the id names no review that tenant has.
    globex = stack.token("globex", "ops@globex.example", roles=["approver"])
    on_acme = await _review(host, pending_id, token=globex)
    assert not on_acme.accepted and on_acme.message.startswith("BAD_SIGNATURE"), on_acme
    on_globex = await _review(host, pending_id, tenant="globex", token=globex)
    assert not on_globex.accepted and "no review is waiting" in on_globex.message, on_globex
    # A tampered id (another step of the same run) is no review either.
    tampered = await _review(host, f"review-{run_id}-3")
    assert not tampered.accepted and "no review is waiting" in tampered.message
    assert await _run(db, run_id) == before  # still waiting, untouched

    status, output = await _writ(
        stack, "review", pending_id, "approve", "--comment", "Order 7781, yes: write it."
    )
    assert status == 0, output
    assert f"{pending_id}: approved; the run is succeeded" in output, output
    done = await _final(host, waiting.request_id)
    assert (done.status, done.answer) == (
        "succeeded",
        "The reviewer confirmed; the note can be written.",
    ), done
    status_after, steps = await _run(db, run_id)
    assert status_after == "succeeded"
    # The comment reached the run as the observation the model decided on next.
    assert steps[1] == (
        "observation",
        {
            "review": "approve",
            "reviewer": "ops@acme.example",
            "reason": "Order 7781, yes: write it.",
        },
    )

    # Answered once: the same answer again finds no review waiting (exit status 1).
    status, output = await _writ(stack, "review", pending_id, "approve")
    assert status == 1 and "no review is waiting" in output, output


async def test_a_rejected_review_fails_the_run(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    waiting = await _waiting(stack, host)
    assert waiting.run_id is not None and waiting.pending_id is not None
    result = await _review(
        host, waiting.pending_id, "reject", comment="That order was never delayed."
    )
    assert result.accepted and result.message == "rejected; the run is failed", result
    assert result.pending_id == waiting.pending_id
    failed = await _final(host, waiting.request_id)
    assert failed.status == "failed" and failed.error is not None
    assert (failed.error.code, failed.error.message) == (
        "REJECTED",
        "That order was never delayed.",
    ), failed
    status, steps = await _run(db, waiting.run_id)
    assert status == "failed"
    assert steps[-1] == (
        "observation",
        {
            "review": "reject",
            "reviewer": "ops@acme.example",
            "reason": "That order was never delayed.",
        },
    )
