"""What admission's SQL reads and writes, as values: commands, proposals, the outbox."""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timedelta
from typing import Any

import msgspec

from schemas.governance import Decision

__all__ = [
    "COMMAND_STATES",
    "OUTBOX_CHANNEL",
    "Admitted",
    "Approval",
    "Backlog",
    "CommandAdmission",
    "Known",
    "OutboxRow",
    "ProposalRow",
    "ResolvedFacts",
    "StoredCommand",
    "approvals_of",
    "known_of",
    "new_public_id",
    "proposal_of",
]

OUTBOX_CHANNEL = "writ_outbox"
# Every state a command can be in (the CHECK on admission.commands.state).
COMMAND_STATES = (
    "pending",
    "dispatching",
    "succeeded",
    "denied",
    "expired",
    "revision_required",
    "unknown",
    "failed",
)


class StoredCommand(msgspec.Struct, frozen=True, kw_only=True):
    """The registry's view of one operation id."""

    request_hash: bytes
    state: str
    receipt: str | None
    reason: str | None
    decision_id: str
    decision_line: int
    policy_version: str
    origin: str
    operation_key: str | None
    request_id: str | None


class Admitted(msgspec.Struct, frozen=True, kw_only=True):
    """What the admission transaction found: created now, or already there (maybe conflicting)."""

    created: bool
    command: StoredCommand


class ProposalRow(msgspec.Struct, frozen=True, kw_only=True):
    """A proposal as stored, with its command's recorded state once it became one."""

    tenant: str
    proposal_id: str
    public_id: str
    run_id: str
    step: int
    principal: str
    agent: str
    action: str
    action_version: int
    arguments: dict[str, Any]
    preview: dict[str, Any]
    request_hash: bytes
    state: str
    decision_id: str | None
    reason: str | None
    expires_at: datetime | None
    approved_by: str | None
    expected_revision: str | None
    operation_key: str | None
    request_id: str | None
    traceparent: str | None  # the trace the proposal was made in (approval links back to it)
    operation_id: str | None
    command_state: str | None
    receipt: str | None
    command_reason: str | None
    # The window key of its arguments and preview if that key was destroyed (retention, an
    # erasure): then they read `{}`, and the proposal can be neither shown nor approved.
    expired: str | None = None


class ResolvedFacts(msgspec.Struct, frozen=True, kw_only=True):
    """The facts one proposal was resolved against (`FactsRef` kind and id), as read."""

    tenant: str
    proposal_id: str
    run_id: str
    step: int
    action: str
    kind: str
    ref: str
    facts: Any
    read_at: datetime


class Known(msgspec.Struct, frozen=True, kw_only=True):
    """What a proposal finds first: its command, its recorded refusal or ask, and the policy
    epoch before `decide` (None if governance's counter cannot be read)."""

    command: StoredCommand | None
    proposal: tuple[str, str | None, str] | None
    policy_epoch: int | None


class Backlog(msgspec.Struct, frozen=True, kw_only=True):
    """What the operators' gauges show: commands per state, the outbox's age, waiting asks."""

    commands: dict[str, int]
    outbox_oldest_s: float
    proposals_pending: int


class OutboxRow(msgspec.Struct, frozen=True, kw_only=True):
    """One dispatch obligation waiting to be published."""

    id: int
    tenant: str
    operation_id: str
    traceparent: str | None = None  # the admitting span, so dispatch joins the run's trace
    signed: bool = False  # its approval receipt is stored already (signed at its admission)


def new_public_id() -> str:
    """An opaque, unguessable proposal id: nothing about the run or the step can be read from
    it, and knowing one proposal's id says nothing about another's."""
    return f"prop_{secrets.token_urlsafe(18)}"


def proposal_of(row: Any) -> ProposalRow:
    values = dict(row)
    values.pop("sealed", None)
    values["arguments"] = json.loads(values["arguments"])
    values["preview"] = json.loads(values["preview"])
    return ProposalRow(**values)


def known_of(row: Any) -> Known:
    command = None
    if row["state"] is not None:
        command = StoredCommand(**{k: row[k] for k in StoredCommand.__struct_fields__})
    proposal = None
    if row["proposal_state"] is not None:
        proposal = (row["proposal_state"], row["proposal_decision_id"], row["proposal_reason"])
    return Known(command=command, proposal=proposal, policy_epoch=row["policy_epoch"])


class CommandAdmission(msgspec.Struct, frozen=True, kw_only=True):
    """One proposal to admit as a command (`AdmissionStore.admit`, `admit_many`)."""

    tenant: str
    operation_id: str
    proposal_id: str
    run_id: str
    step: int
    principal: str
    agent: str
    action: str
    version: int
    arguments: dict[str, Any]
    request_hash: bytes
    decision: Decision
    ttl: timedelta
    preview: dict[str, Any]
    expected_revision: str | None = None
    operation_key: str | None = None
    request_id: str | None = None
    policy_epoch: int | None = None
    traceparent: str | None = None  # the admitting span, so the dispatch joins its trace

    @property
    def origin(self) -> str:
        return "host" if self.operation_key is not None else "run"


class Approval(msgspec.Struct, frozen=True, kw_only=True):
    """One person's approval of a proposal that needs several, and whether it still counts."""

    approver: str
    approved_at: str
    # Why it no longer counts, as a stable code (`APPROVER_REVOKED`); None while it counts.
    void: str | None = None

    @property
    def counts(self) -> bool:
        """It still counts towards the distinct approvers the proposal needs."""
        return self.void is None


def approvals_of(raw: Any) -> list[Approval]:
    """A proposal's approvals as `_statements.APPROVALS_OF` reads them (JSON), first first."""
    items = json.loads(raw) if isinstance(raw, str | bytes) else raw
    return [
        Approval(approver=a["approver"], approved_at=str(a["approved_at"]), void=a.get("void"))
        for a in items or []
    ]
