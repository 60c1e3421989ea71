"""`host.ticket.comment.create`: add a comment to a ticket in the host's helpdesk, over its REST
API (scenario C: the host stays the system of record).

The preview states the ticket as the host has it now, read through the host's MCP server by
retrieval at proposal time (admission asks for `host_ticket` facts); the frozen arguments carry
the ticket's revision, sent as `If-Match`, so a ticket that changed after the preview was shown
ends `revision_required` (412) instead of commenting on something nobody saw. The host honours
`Idempotency-Key`: a lost response is replayed under the same key and yields one comment.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from actions.base import ActionContract, FactsRef, Frozen, Invalid, ProviderCall

__all__ = [
    "CommentArguments",
    "CommentPreview",
    "CommentRequest",
    "HostTicketCommentCreate",
    "TicketFacts",
]

TicketId = Annotated[str, msgspec.Meta(pattern=r"^[A-Z]+-[0-9]{1,8}(?!\n)$")]
Revision = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._:-]{1,64}(?!\n)$")]
Body = Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]


class CommentRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the model may send: the ticket and the comment's text."""

    ticket_id: TicketId
    body: Body


class TicketFacts(msgspec.Struct, frozen=True, kw_only=True):
    """The ticket as the host's `ticket.get` tool returns it (untrusted, bounded by retrieval)."""

    ticket_id: str
    customer_id: str = ""
    subject: str = ""
    status: str = ""
    priority: str = ""
    revision: Revision
    comments: int = 0


class CommentArguments(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Frozen: the ticket, the text, and the revision the preview showed."""

    ticket_id: TicketId
    body: Body
    revision: Revision


class CommentPreview(msgspec.Struct, frozen=True, kw_only=True):
    """What an approver reads: the ticket as it is now and the whole comment."""

    ticket_id: str
    subject: str
    status: str
    customer_id: str
    revision: str
    comments_before: int
    body: str


class HostTicketCommentCreate(
    ActionContract[CommentRequest, CommentArguments, CommentPreview, TicketFacts]
):
    name: ClassVar[str] = "host.ticket.comment.create"
    version: ClassVar[int] = 1
    family = "write_delete"
    standing_grant = "allowed"  # a record of the organisation's own: a grant may cover it
    connector: ClassVar[str] = "host"
    description: ClassVar[str] = (
        "Add a comment to a ticket in the host's helpdesk; the "
        "preview shows the ticket as the host has it now."
    )
    request = CommentRequest
    arguments = CommentArguments
    preview = CommentPreview
    facts = TicketFacts
    free_text = frozenset({"body"})

    def facts_ref(self, request: CommentRequest) -> FactsRef:
        return FactsRef(kind="host_ticket", id=request.ticket_id)

    def resolve(
        self, request: CommentRequest, facts: TicketFacts | None
    ) -> Frozen[CommentArguments, CommentPreview]:
        if facts is None:
            raise Invalid(f"ticket {request.ticket_id} was not found at the host")
        if facts.ticket_id != request.ticket_id:
            raise Invalid(
                f"the host answered for ticket {facts.ticket_id[:32]}, not {request.ticket_id}"
            )
        arguments = CommentArguments(
            ticket_id=request.ticket_id, body=request.body, revision=facts.revision
        )
        return Frozen(
            arguments=arguments,
            preview=CommentPreview(
                ticket_id=facts.ticket_id,
                subject=facts.subject[:200],
                status=facts.status[:32],
                customer_id=facts.customer_id[:64],
                revision=facts.revision,
                comments_before=facts.comments,
                body=request.body,
            ),
        )

    def provider_call(self, arguments: CommentArguments) -> ProviderCall:
        return ProviderCall(
            path=f"/api/v1/tickets/{arguments.ticket_id}/comments",
            body={"body": arguments.body},
            receipt="comment_id",
            if_match=arguments.revision,
        )

    def render(self, receipt: str | None) -> str:
        return f"Comment added to the host's ticket ({receipt or 'no receipt'})."
