"""Messages of the dispatcher: what is known about executed commands, and reconciliation."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from schemas.base import Command, Event, Id, ShortText, Tenant

__all__ = [
    "CommandOutcome",
    "FactsRead",
    "ReadFacts",
    "CommandState",
    "ListUnknown",
    "Reconcile",
    "Reconciled",
    "UnknownCommand",
    "UnknownCommands",
]

CommandState = Literal[
    "succeeded",
    "denied",
    "expired",
    "revision_required",
    "unknown",
    "failed",
]


# The kinds of state a preview can stand on, each with its reader.
FactsKind = Literal["payment", "mail_draft", "host_ticket"]


class CommandOutcome(Event, frozen=True):
    """A command reached a terminal state; `receipt` is the provider's proof where there is one."""

    tenant: Tenant
    operation_id: Id
    run_id: Id
    step: int
    action: ShortText
    state: CommandState
    receipt: ShortText | None = None
    reason: ShortText | None = None


class ListUnknown(Command, frozen=True):
    """Ask the dispatcher for a tenant's commands in `unknown` (`writ reconcile list`)."""

    tenant: Tenant


class UnknownCommand(msgspec.Struct, frozen=True, kw_only=True):
    """One command whose outcome nobody knows."""

    operation_id: Id
    action: ShortText
    principal: ShortText
    arguments: Annotated[dict[str, Any], msgspec.Meta(max_length=32)]
    reason: ShortText | None
    since: ShortText


class UnknownCommands(Event, frozen=True):
    """The answer to `ListUnknown`."""

    commands: Annotated[list[UnknownCommand], msgspec.Meta(max_length=500)]


class Reconcile(Command, frozen=True):
    """Record what an operator established about an `unknown` command, with the evidence.

    Nothing here generates a new key: the command keeps its operation id whatever is decided.
    """

    tenant: Tenant
    operation_id: Id
    state: Literal["succeeded", "failed"]
    evidence: Annotated[str, msgspec.Meta(min_length=1, max_length=4000)]
    resolved_by: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    receipt: ShortText | None = None


class Reconciled(Event, frozen=True):
    """The answer to `Reconcile`: done, or why not."""

    operation_id: Id
    ok: bool
    message: ShortText


class ReadFacts(Command, frozen=True):
    """Admission asks for the state a proposal's preview will stand on (a payment, a draft)."""

    tenant: Tenant
    kind: FactsKind
    id: ShortText


class FactsRead(Event, frozen=True):
    """The state as the system of record gives it now; `found` false: no such resource."""

    found: bool
    facts: Annotated[dict[str, Any], msgspec.Meta(max_length=64)] | None = None
