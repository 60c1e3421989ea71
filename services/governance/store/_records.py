"""The values governance's store passes around: policies, answers, decisions to record."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Final, Literal

import msgspec

from schemas.governance import Answer
from services.governance.logic import Call, Facts, Ruling
from services.governance.recorded import record_of

__all__ = [
    "ATTENDED_ASK_TIMEOUT",
    "DEFAULT_POLICY_VERSION",
    "Answered",
    "NotAnswerable",
    "Policy",
    "ToRead",
    "ToRecord",
    "decision_row",
    "is_uuid",
]

DEFAULT_POLICY_VERSION: Final = "default"
# The agent-OS runtime view: an unanswered ask in an attended conversation is a deny after five
# minutes, fixed.
ATTENDED_ASK_TIMEOUT: Final = timedelta(minutes=5)


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    """An organisation policy as loaded from its signed file (or refused)."""

    tenant: str
    version: str
    status: str = "valid"
    refusal: str | None = None
    refused_tools: tuple[str, ...] = ()
    refused_connectors: tuple[str, ...] = ()
    refused_families: tuple[str, ...] = ()
    developer_mode: bool = False
    key_id: str | None = None
    digest: str | None = None


class Answered(msgspec.Struct, frozen=True, kw_only=True):
    """A pending decision that just got its answer."""

    pending_id: str
    tenant: str
    run_id: str
    proposal_id: str | None
    answer: Answer
    reason: str
    answered_by: str
    decision_id: str
    line: int
    policy_version: str


class Counted(msgspec.Struct, frozen=True, kw_only=True):
    """One approval of several a proposal needs: checked like an answer, nothing written."""

    approvers: list[str]  # the approvals that count, this one last


class NotAnswerable(msgspec.Struct, frozen=True, kw_only=True):
    """Why an answer was not taken: `code` is the host contract's stable code."""

    reason: str
    code: Literal[
        "UNKNOWN_PENDING",
        "ALREADY_ANSWERED",
        "INVALID_ANSWER",
        "SEPARATION_OF_DUTIES",
        "PROPOSAL_REQUIRED",
        "EXPIRED",
    ] = "UNKNOWN_PENDING"


class ToRead(msgspec.Struct, frozen=True, kw_only=True):
    """One call `facts_many` reads the facts of."""

    tenant: str
    call: Call
    principal: str
    run_id: str
    approval_id: str | None = None


class ToRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One decision `record_many` persists."""

    tenant: str
    run_id: str
    principal: str
    call: Call
    ruling: Ruling
    policy_version: str
    proposal_id: str | None = None
    attended: bool = False
    ask_open_s: int | None = None  # an ask's pending decision closes after this long
    facts: Facts | None = None  # what it was ruled on (None: the store could not be read)
    approval_id: str | None = None  # the answer it was asked to stand on, at dispatch


def decision_row(
    *,
    tenant: str,
    run_id: str,
    principal: str,
    call: Call,
    ruling: Ruling,
    policy_version: str,
    proposal_id: str | None,
    attended: bool,
    facts: Facts | None = None,
    approval_id: str | None = None,
) -> tuple[str, tuple[object, ...], dict[str, object]]:
    """A new decision's id, its `governance.decisions` row and its journal event (which keeps
    the call and the facts it was ruled on, so that it can be ruled again: `recorded.py`)."""
    decision_id = str(uuid.uuid4())
    decision = (
        decision_id,
        tenant,
        run_id,
        call.agent,
        principal,
        call.tool,
        call.family or "unclassified",
        ruling.verdict,
        ruling.line,
        ruling.reason,
        policy_version,
    )
    event: dict[str, object] = {
        "decision_id": decision_id,
        "tenant": tenant,
        "run_id": run_id,
        "agent": call.agent,
        "principal": principal,
        "tool": call.tool,
        "family": call.family or "unclassified",
        "first_argument": call.first_argument,
        "verdict": ruling.verdict,
        "line": ruling.line,
        "reason": ruling.reason,
        "policy_version": policy_version,
        "proposal_id": proposal_id,
        "attended": attended,
        "approval_id": approval_id,
        **record_of(call, facts),
    }
    return decision_id, decision, event


def is_uuid(value: str) -> bool:
    """Whether `value` spells a UUID (ids that are not cannot name a row)."""
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
