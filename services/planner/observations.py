"""What the model reads of what happened: the runtime's own outputs (a selection it refused, a
person's review answer, the critic's replan, what a read returned, how a called agent's branch
ended) and `observation_of`, which turns an output into the observation fed back to the model.

Written by Writ and classified by Writ (the approval-contracts note): untrusted content (a read's
items, a called agent's answer) is marked so and bounded. The service records each output with its
observation; the replay (`replay/`) derives the observation again from the captured output.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from actions.base import outcome_of
from schemas.admission import ProposalRefused
from schemas.dispatcher import CommandOutcome
from schemas.retrieval import ReadRefused, ReadResult

__all__ = [
    "AGENT_ANSWER_CHARS",
    "OBSERVED_TEXT_CHARS",
    "AgentObserved",
    "CriticReplan",
    "Output",
    "ReadObserved",
    "ReviewAnswered",
    "SelectionRefused",
    "observation_of",
]

# What the model reads of one item a read returned (retrieval already cuts excerpts shorter).
OBSERVED_TEXT_CHARS: Final = 2000
# How much of a called agent's answer its caller observes (untrusted, like a read's text).
AGENT_ANSWER_CHARS: Final = 4000


class SelectionRefused(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=True):
    """The runtime's own output for a selection that failed its checks: nothing ran."""

    run_id: str
    step: int
    target: str
    check: str
    reason: str


class ReviewAnswered(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=True):
    """A person's explicit answer to the review the model requested at `step`."""

    run_id: str
    step: int
    answer: str  # approve | reject
    reviewer: str
    reason: str = ""


class CriticReplan(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=True):
    """The runtime's own output for a critic's `replan` at `step` (the verdict's step): the
    reason, fed back to the agent as written by Writ."""

    run_id: str
    step: int
    reason: str


class ReadObserved(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=True):
    """The captured output of the read a checked `select_capability` at `step` named:
    retrieval's answer as received, a result or a refusal asking again would not change."""

    run_id: str
    step: int
    tool: str
    arguments: dict[str, Any]
    answer: ReadResult | ReadRefused


class AgentObserved(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=True):
    """The captured output of the agent call a checked `select_capability` at `step` named: how
    the branch run `branch` ended (its answer, or why it gave none), or, with no branch, why
    the call never started (governance's verdict `denied` / `ask`, or `unknown_agent`)."""

    run_id: str
    step: int
    agent: str
    arguments: dict[str, Any]
    outcome: str  # answered | failed | awaiting_human | denied | ask | unknown_agent
    branch: str | None = None
    answer: str | None = None
    reason: str = ""
    pending_id: str | None = None


Output = (
    CommandOutcome
    | ProposalRefused
    | SelectionRefused
    | ReviewAnswered
    | CriticReplan
    | ReadObserved
    | AgentObserved
)


def observation_of(event: Output) -> dict[str, Any]:
    """What the model reads next turn: written by Writ, classified by Writ (the approval-contracts
    note).

    A recoverable outcome (revision required, needs reconciliation) carries its safe reason as
    revision context; a terminal failure carries only its correlation id.
    """
    if isinstance(event, CommandOutcome):
        outcome = outcome_of(
            event.state, receipt=event.receipt, reason=event.reason, operation_id=event.operation_id
        )
        return {
            "action": event.action,
            "operation_id": event.operation_id,
            "state": event.state,
            "outcome": outcome.kind,
            "receipt": event.receipt,
            "reason": outcome.detail or None,
            "correlation_id": outcome.correlation_id,
        }
    if isinstance(event, SelectionRefused):
        return {
            "target": event.target,
            "refused": event.check,
            "reason": event.reason,
            "executed": False,
        }
    if isinstance(event, ReviewAnswered):
        return {"review": event.answer, "reviewer": event.reviewer, "reason": event.reason}
    if isinstance(event, CriticReplan):
        return {"critic": "replan", "reason": event.reason, "answer_accepted": False}
    if isinstance(event, ReadObserved):
        return _read_observation(event)
    if isinstance(event, AgentObserved):
        return _agent_observation(event)
    return {"action": event.action, "refused": event.verdict, "reason": event.reason}


def _agent_observation(event: AgentObserved) -> dict[str, Any]:
    """What the caller reads of a called agent: its answer as untrusted data, bounded; or how
    its branch ended without one, or why it never ran."""
    if event.outcome == "answered":
        answer = event.answer or ""
        return {
            "agent": event.agent,
            "executed": True,
            "untrusted": True,
            "answer": answer[:AGENT_ANSWER_CHARS],
            "truncated": len(answer) > AGENT_ANSWER_CHARS,
        }
    observation: dict[str, Any] = {
        "agent": event.agent,
        "outcome": event.outcome,
        "reason": event.reason[:512],
        "executed": event.branch is not None,
    }
    if event.outcome == "ask":
        observation["pending_id"] = event.pending_id
        observation["note"] = (
            "a person must allow this call; this run does not wait for that "
            "answer, so the agent was not called"
        )
    return observation


def _read_observation(event: ReadObserved) -> dict[str, Any]:
    """What the model reads of a read: the items as untrusted data, each bounded; or why the
    read did not run (nothing was executed)."""
    answer = event.answer
    if isinstance(answer, ReadRefused):
        observation: dict[str, Any] = {
            "tool": event.tool,
            "refused": answer.code,
            "reason": answer.reason,
            "executed": False,
        }
        if answer.code == "ASK":
            # Reads a person must allow are not waited for: the run goes on without it.
            observation["pending_id"] = answer.pending_id
            observation["note"] = (
                "a person must allow this read; this run does not wait for "
                "that answer, so nothing was read"
            )
        return observation
    items, cut = [], False
    for item in answer.items:
        cut = cut or len(item.text) > OBSERVED_TEXT_CHARS
        observed: dict[str, Any] = {
            "id": item.id,
            "kind": item.kind,
            "title": item.title,
            "text": item.text[:OBSERVED_TEXT_CHARS],
            "rank": round(item.rank, 4),
            "trust": "untrusted",
        }
        if item.fields:
            observed["fields"] = dict(item.fields)
        items.append(observed)
    return {
        "tool": event.tool,
        "executed": True,
        "untrusted": True,
        "items": items,
        "truncated": answer.truncated or cut,
    }
