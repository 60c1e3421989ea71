"""`host.ticket.update`: change a ticket's status or priority in the host's helpdesk, over its
REST API (`PATCH`, `If-Match` the revision the preview showed, `Idempotency-Key`).

Like `host.ticket.comment.create`, the preview states the ticket as the host has it now (read
through MCP by retrieval at proposal time), and shows each change as from -> to.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from actions.base import ActionContract, FactsRef, Frozen, Invalid, ProviderCall
from actions.host_ticket_comment_create import Revision, TicketFacts, TicketId

__all__ = ["HostTicketUpdate", "UpdateArguments", "UpdatePreview", "UpdateRequest"]

Status = Literal["open", "pending", "solved"]
Priority = Literal["low", "high"]


class UpdateRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the model may send: the ticket and what to change (at least one field)."""

    ticket_id: TicketId
    status: Status | None = None
    priority: Priority | None = None


class UpdateArguments(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Frozen: the ticket, the changes, and the revision the preview showed."""

    ticket_id: TicketId
    revision: Revision
    status: Status | None = None
    priority: Priority | None = None


class UpdatePreview(msgspec.Struct, frozen=True, kw_only=True):
    """What an approver reads: the ticket now and each change, from -> to."""

    ticket_id: str
    subject: str
    revision: str
    changes: dict[str, str]


class HostTicketUpdate(ActionContract[UpdateRequest, UpdateArguments, UpdatePreview, TicketFacts]):
    name: ClassVar[str] = "host.ticket.update"
    version: ClassVar[int] = 1
    family = "write_delete"
    standing_grant = "allowed"  # a record of the organisation's own: a grant may cover it
    connector: ClassVar[str] = "host"
    description: ClassVar[str] = (
        "Change a ticket's status or priority in the host's "
        "helpdesk; the preview shows each change from -> to."
    )
    request = UpdateRequest
    arguments = UpdateArguments
    preview = UpdatePreview
    facts = TicketFacts

    def facts_ref(self, request: UpdateRequest) -> FactsRef:
        return FactsRef(kind="host_ticket", id=request.ticket_id)

    def resolve(
        self, request: UpdateRequest, facts: TicketFacts | None
    ) -> Frozen[UpdateArguments, UpdatePreview]:
        if request.status is None and request.priority is None:
            raise Invalid("host.ticket.update changes status, priority or both: neither given")
        if facts is None:
            raise Invalid(f"ticket {request.ticket_id} was not found at the host")
        # Each change from what the host has now (the same facts the page shows) to what is
        # asked; a field already at the asked value is no change, and nothing to change is
        # refused here rather than shown to a person as if it did something.
        status = request.status if request.status != facts.status else None
        priority = request.priority if request.priority != facts.priority else None
        if status is None and priority is None:
            raise Invalid(
                f"ticket {request.ticket_id} is already "
                + ", ".join(
                    f"{name} {value}"
                    for name, value in (("status", request.status), ("priority", request.priority))
                    if value is not None
                )
                + ": nothing would change"
            )
        changes = {}
        if status is not None:
            changes["status"] = f"{facts.status[:32] or '(none)'} -> {status}"
        if priority is not None:
            changes["priority"] = f"{facts.priority[:32] or '(none)'} -> {priority}"
        return Frozen(
            arguments=UpdateArguments(
                ticket_id=request.ticket_id,
                revision=facts.revision,
                status=status,
                priority=priority,
            ),
            preview=UpdatePreview(
                ticket_id=facts.ticket_id,
                subject=facts.subject[:200],
                revision=facts.revision,
                changes=changes,
            ),
        )

    def provider_call(self, arguments: UpdateArguments) -> ProviderCall:
        body = {
            k: v
            for k, v in (("status", arguments.status), ("priority", arguments.priority))
            if v is not None
        }
        return ProviderCall(
            path=f"/api/v1/tickets/{arguments.ticket_id}",
            body=body,
            receipt="revision",
            method="PATCH",
            if_match=arguments.revision,
        )

    def render(self, receipt: str | None) -> str:
        return f"Ticket updated at the host (revision {receipt or 'unknown'})."
