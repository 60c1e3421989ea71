"""`crm.note.create`: add a note to a customer record in the CRM.

External and idempotent: the CRM dedupes on the operation's key, so a lost response is replayed.
The model chooses every field; the preview shows the note exactly as it will be written.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from actions.base import ActionContract, ProviderCall, ProviderLookup

__all__ = ["CrmNoteCreate", "NoteArguments", "NotePreview"]

CustomerId = Annotated[str, msgspec.Meta(pattern=r"^[A-Z0-9][A-Z0-9-]{0,63}(?!\n)$")]


class NoteArguments(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The model's request, which is also the frozen arguments."""

    customer_id: CustomerId
    body: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]


class NotePreview(msgspec.Struct, frozen=True, kw_only=True):
    """What an approver reads: the customer and the whole note."""

    customer_id: str
    body: str


class CrmNoteCreate(ActionContract[NoteArguments, NoteArguments, NotePreview, msgspec.Struct]):
    name: ClassVar[str] = "crm.note.create"
    version: ClassVar[int] = 1
    family = "write_delete"
    standing_grant = "allowed"  # a record of the organisation's own: a grant may cover it
    connector: ClassVar[str] = "crm"
    description: ClassVar[str] = "Add a note to a customer record."
    request = NoteArguments
    arguments = NoteArguments
    preview = NotePreview
    free_text = frozenset({"body"})

    def provider_call(self, arguments: NoteArguments) -> ProviderCall:
        return ProviderCall(
            path=f"/v1/customers/{arguments.customer_id}/notes",
            body={"body": arguments.body},
            receipt="note_id",
        )

    def provider_lookup(self, key: str) -> ProviderLookup:
        return ProviderLookup(
            path="/v1/notes", params={"idempotency_key": key}, listed_as="notes", receipt="note_id"
        )

    def describe(self, preview: NotePreview) -> list[tuple[str, str]]:
        """The record and the whole note, exactly as it will be written."""
        return [("Customer record", preview.customer_id), ("Note", preview.body)]

    def render(self, receipt: str | None) -> str:
        return f"Note added to the customer record ({receipt or 'no receipt'})."
