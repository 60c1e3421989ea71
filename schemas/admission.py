"""Messages admission publishes: what it did with a proposal, and admitted commands."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from schemas.base import Command, Digest, Event, Id, ShortText, Tenant

__all__ = [
    "CommandAdmitted",
    "DispatchCommand",
    "PlanFactsRecorded",
    "PlannedStep",
    "PlannedStepFacts",
    "ProposalRefused",
    "RecordPlanFacts",
]


# Why admission refused a proposal: what `decide` said, or what admission found itself.
RefusalVerdict = Literal["deny", "ask", "invalid", "conflict", "rejected", "revise"]


class CommandAdmitted(Event, frozen=True):
    """A proposal became a command with a durable operation id (or was a replay of one)."""

    tenant: Tenant
    run_id: Id
    step: int
    action: ShortText
    operation_id: Id
    request_hash: Digest
    decision_id: Id
    decision_line: int
    policy_version: ShortText
    replay: bool = False


class ProposalRefused(Event, frozen=True):
    """A proposal that did not become a command, and why."""

    tenant: Tenant
    run_id: Id
    step: int
    action: ShortText
    # deny: by policy; rejected: by a person (or nobody answering); ask: waiting for a person.
    verdict: RefusalVerdict
    reason: ShortText
    decision_id: Id | None = None
    pending_id: Id | None = None
    # With `ask`: the proposal a person approves by its id, and what approving it does.
    proposal_id: Id | None = None
    preview: Annotated[dict[str, Any], msgspec.Meta(max_length=32)] | None = None
    expires_at: ShortText | None = None


class DispatchCommand(Command, frozen=True):
    """A pointer to an admitted command; the dispatcher loads the command from Postgres.

    The dispatcher never trusts a command's content from the bus (the reference architecture).
    """

    tenant: Tenant
    operation_id: Id


class PlannedStep(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a plan being proposed: the run's step its selection was recorded at, and
    the request as the plan freezes it."""

    step: int
    capability: ShortText
    request: Annotated[dict[str, Any], msgspec.Meta(max_length=64)]


class RecordPlanFacts(Command, frozen=True):
    """The planner proposes a plan: admission reads the facts each step's contract resolves
    against, as it would for its proposal, and keeps them in its record for evaluation."""

    tenant: Tenant
    run_id: Id
    steps: Annotated[list[PlannedStep], msgspec.Meta(max_length=64)]


class PlannedStepFacts(msgspec.Struct, frozen=True, kw_only=True):
    """The facts admission read and kept for one step (`found` false: no such resource)."""

    step: int
    found: bool
    facts: Annotated[dict[str, Any], msgspec.Meta(max_length=64)] | None = None


class PlanFactsRecorded(Event, frozen=True):
    """The facts of each facts-bound step, kept before the reply (a step standing on no facts
    is left out)."""

    steps: list[PlannedStepFacts]
