"""What operators do from the command line, over the bus (never with a database password)."""

from __future__ import annotations

import sys
import uuid
from typing import Any, Literal, TypeVar

import anyio
import msgspec
import nats

from actions import ACTIONS
from libs.deadline import timed_request
from schemas import subjects
from schemas.dispatcher import ListUnknown, Reconcile, Reconciled, UnknownCommands
from schemas.governance import Answer, ListPending, ListSpend, PendingDecisions, SpendReport
from schemas.host import ApprovalAnswer, ApproveProposal, HumanDecision, ReviewDecision
from schemas.reads import PROPOSALS_LIST, ListProposals, Proposals

__all__ = [
    "answer_pending",
    "answer_proposal",
    "answer_review",
    "list_pending",
    "list_spend",
    "list_unknown",
    "resolve",
]

T = TypeVar("T")


async def _ask(nats_url: str, subject: str, message: msgspec.Struct, answer: type[T]) -> T:
    """One request/reply with a service, decoded into its answer type."""
    nc = await nats.connect(nats_url)
    try:
        reply = await timed_request(nc, subject, msgspec.json.encode(message), timeout=5)
    finally:
        await nc.close()
    return msgspec.json.decode(reply.data, type=answer)


async def list_unknown(nats_url: str, tenant: str) -> int:
    """Print the tenant's `unknown` commands; exit status 0."""
    answer = await _ask(
        nats_url, subjects.UNKNOWN_LIST, ListUnknown(tenant=tenant), UnknownCommands
    )
    if not answer.commands:
        print(f"no unknown commands for {tenant}")
    for c in answer.commands:
        print(
            f"{c.operation_id}  {c.action:<24} since {c.since}  by {c.principal}\n"
            f"    arguments {msgspec.json.encode(c.arguments).decode()}\n"
            f"    why       {c.reason or '-'}"
        )
    return 0


async def resolve(
    nats_url: str,
    tenant: str,
    operation_id: str,
    state: Literal["succeeded", "failed"],
    receipt: str | None,
    evidence: str,
    by: str,
) -> int:
    """Record a reconciliation; exit status 0 if it was recorded, 1 if refused."""
    ask = Reconcile(
        tenant=tenant,
        operation_id=operation_id,
        state=state,
        receipt=receipt,
        evidence=evidence,
        resolved_by=by,
    )
    answer = await _ask(nats_url, subjects.RECONCILE, ask, Reconciled)
    print(answer.message)
    return 0 if answer.ok else 1


def _described(action: str, preview: dict[str, Any]) -> list[tuple[str, str]]:
    """A preview as its contract says it to a person (money as an amount and a currency)."""
    contract = ACTIONS.get(action)
    try:
        if contract is None:
            raise ValueError(action)
        return contract.describe(contract.decode_preview(preview))
    except (ValueError, msgspec.ValidationError):
        return [(k.replace("_", " "), str(v)) for k, v in preview.items()]


async def list_spend(
    nats_url: str,
    tenant: str,
    *,
    cap: str | None = None,
    agent: str | None = None,
    window: str | None = None,
) -> int:
    """Print the tenant's spend against its caps (per cap and window, newest first); `agent`
    keeps the caps of that agent, `window` the day or month windows; exit status 0."""
    answer = await _ask(
        nats_url, subjects.SPEND_LIST, ListSpend(tenant=tenant, cap=cap), SpendReport
    )
    shown = [
        s
        for s in answer.spend
        if (agent is None or s.agent == agent)
        and (window is None or (len(s.window) == 10) == (window == "day"))
    ]
    if not shown:
        print(f"no spend recorded for {tenant}")
    for s in shown:
        limit = f"of {s.limit} {s.currency}" if s.limit is not None else "(cap no longer set)"
        whose = f"agent {s.agent}" if s.agent else "tenant"
        print(
            f"{s.cap}  {s.window}  {whose}: settled {_money(s.used_micros)}, "
            f"held {_money(s.reserved_micros)} {limit}"
        )
    return 0


def _money(micros: int) -> str:
    whole, frac = divmod(micros, 1_000_000)
    return f"{whole}.{frac:06d}".rstrip("0").rstrip(".") if frac else str(whole)


async def list_pending(nats_url: str, tenant: str) -> int:
    """Print the tenant's decisions waiting for a person; exit status 0."""
    answer = await _ask(
        nats_url, subjects.PENDING_LIST, ListPending(tenant=tenant), PendingDecisions
    )
    proposals = await _ask(
        nats_url,
        PROPOSALS_LIST,
        ListProposals(tenant=tenant, state="pending", limit=500),
        Proposals,
    )
    # A decision about a proposal is answered on the proposal, whose preview is printed here.
    about = {p.decision_id: p for p in proposals.proposals if p.decision_id}
    if not answer.decisions:
        print(f"no pending decisions for {tenant}")
    for d in answer.decisions:
        waits = f"deny at {d.deadline}" if d.deadline else "waits until answered"
        print(
            f"{d.pending_id}  {d.tool} ({d.family}) for agent {d.agent}, run {d.run_id}\n"
            f"    asked by  {d.principal}; {d.reason}\n"
            f"    argument  {d.first_argument or '-'}\n"
            f"    answers   {' | '.join(d.options)}; {waits}"
        )
        if (proposal := about.get(d.pending_id)) is not None:
            print(f"    proposal  {proposal.proposal_id}")
            if proposal.payload == "expired":
                # Erased under the retention policy: said so, never shown as empty.
                print("      payload expired (it cannot be approved)")
                continue
            for label, value in _described(proposal.action, proposal.preview):
                print(f"      {label}: {value}")
            print(f"    answer it with --proposal {proposal.proposal_id}")
    return 0


async def answer_pending(
    nats_url: str,
    tenant: str,
    pending_id: str,
    answer: Answer,
    reason: str,
    token: str,
    timeout: float = 10.0,
    proposal_id: str | None = None,
) -> int:
    """Publish a `HumanDecision` as an approver and wait for governance's verdict on it (a
    decision about a proposal names it: `proposal_id`)."""
    request_id = f"decide-{uuid.uuid4().hex[:12]}"
    decision = HumanDecision(
        request_id=request_id,
        token=token,
        pending_id=pending_id,
        answer=answer,
        reason=reason,
        proposal_id=proposal_id,
    )
    result = await _publish_and_wait(
        nats_url,
        subjects.human_decision(tenant),
        decision,
        subjects.result(tenant),
        "DecisionResult",
        timeout,
    )
    if result is None:
        return 1
    print(result["message"])
    return 0 if result["accepted"] else 1


async def answer_proposal(
    nats_url: str,
    tenant: str,
    proposal_id: str,
    answer: ApprovalAnswer,
    reason: str,
    token: str,
    timeout: float = 10.0,
    grant: Literal["once", "always"] = "once",
) -> int:
    """Approve or reject a proposal by its id (`writ approve` / `writ reject`) and print what
    became of it: nothing but the id is sent; what is approved is what Writ froze."""
    request_id = f"approve-{uuid.uuid4().hex[:12]}"
    message = ApproveProposal(
        request_id=request_id,
        token=token,
        proposal_id=proposal_id,
        answer=answer,
        reason=reason,
        grant=grant,
    )
    result = await _publish_and_wait(
        nats_url,
        subjects.approval(tenant),
        message,
        subjects.result(tenant),
        "ApprovalResult",
        timeout,
    )
    if result is None:
        return 1
    details = [
        f"{k} {result[k]}"
        for k in ("outcome", "receipt", "reason", "correlation_id")
        if result.get(k)
    ]
    print(f"{proposal_id}: {result['status']}" + (f" ({'; '.join(details)})" if details else ""))
    return (
        0
        if result["status"] in ("claimed", "rejected", "already_completed", "approval_recorded")
        else 1
    )


async def answer_review(
    nats_url: str,
    tenant: str,
    pending_id: str,
    answer: ApprovalAnswer,
    comment: str,
    token: str,
    timeout: float = 40.0,
) -> int:
    """Approve or reject the review a run asked for (`writ review`) and print whether the run
    took the answer; exit status 0 if it did. The default timeout outlasts ingress's wait for
    the planner, which resumes the run before it answers."""
    request_id = f"review-{uuid.uuid4().hex[:12]}"
    message = ReviewDecision(
        request_id=request_id, token=token, pending_id=pending_id, answer=answer, comment=comment
    )
    result = await _publish_and_wait(
        nats_url, subjects.review(tenant), message, subjects.result(tenant), "ReviewResult", timeout
    )
    if result is None:
        return 1
    print(f"{pending_id}: {result['message']}")
    return 0 if result["accepted"] else 1


async def _publish_and_wait(
    nats_url: str,
    subject: str,
    message: msgspec.Struct,
    results_subject: str,
    result_type: str,
    timeout: float,
) -> dict[str, Any] | None:
    """Publish a host message (request id = its `Nats-Msg-Id`) and wait for its result."""
    request_id = message.request_id  # type: ignore[attr-defined]
    nc = await nats.connect(nats_url)
    try:
        results = await nc.subscribe(results_subject)
        await nc.jetstream().publish(
            subject, msgspec.json.encode(message), headers={"Nats-Msg-Id": request_id}
        )
        with anyio.fail_after(timeout):
            async for msg in results.messages:
                result = msgspec.json.decode(msg.data)
                if result.get("type") == result_type and result["request_id"] == request_id:
                    return result
    except TimeoutError:
        print(f"no {result_type} within {timeout:.0f} s", file=sys.stderr)
    finally:
        await nc.close()
    return None
