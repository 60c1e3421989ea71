"""`email.draft.apply`: copy a frozen email draft into the editable broadcast form.

Local only: nothing is sent and no provider is called. The business change (the form) and the
command's outcome commit in one Postgres transaction in the dispatcher, after the recipients are
counted again: a changed audience, or an edited draft, needs a new proposal.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec

from actions.base import ActionContract, FactsRef, Frozen, Invalid, Stale

__all__ = ["DraftArguments", "DraftFacts", "DraftPreview", "DraftRequest", "EmailDraftApply"]

DraftId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}(?!\n)$")]


class DraftRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The model names the draft; everything else is read from it."""

    draft_id: DraftId


class DraftArguments(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The draft as it was shown, frozen, with the audience's size at the time."""

    draft_id: DraftId
    subject: Annotated[str, msgspec.Meta(max_length=300)]
    body: Annotated[str, msgspec.Meta(max_length=20_000)]
    segment: Annotated[str, msgspec.Meta(max_length=128)]
    recipients: Annotated[int, msgspec.Meta(ge=1)]


class DraftPreview(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an approver reads."""

    subject: str
    segment: str
    recipients: int
    body: str


class DraftFacts(msgspec.Struct, frozen=True, kw_only=True):
    """A draft and its audience counted now."""

    draft_id: str
    subject: str
    body: str
    segment: str
    state: str
    recipients: int


_FACTS = """
SELECT d.draft_id, d.subject, d.body, d.segment, d.state,
       (SELECT count(*) FROM dispatcher.mail_audience a
        WHERE a.tenant = d.tenant AND a.segment = d.segment)::int AS recipients
FROM dispatcher.mail_drafts d WHERE d.tenant = $1 AND d.draft_id = $2
"""


class EmailDraftApply(ActionContract[DraftRequest, DraftArguments, DraftPreview, DraftFacts]):
    name: ClassVar[str] = "email.draft.apply"
    version: ClassVar[int] = 1
    family = "write_delete"
    standing_grant = "allowed"  # a record of the organisation's own: a grant may cover it
    connector: ClassVar[str] = "local"
    description: ClassVar[str] = (
        "Copy an email draft into the editable broadcast form (it sends nothing)."
    )
    request = DraftRequest
    arguments = DraftArguments
    preview = DraftPreview
    reach = frozenset({"recipients"})
    facts = DraftFacts

    def facts_ref(self, request: DraftRequest) -> FactsRef:
        return FactsRef(kind="mail_draft", id=request.draft_id)

    def facts_ref_of(self, arguments: DraftArguments) -> FactsRef:
        return FactsRef(kind="mail_draft", id=arguments.draft_id)

    def resolve(
        self, request: DraftRequest, facts: DraftFacts | None
    ) -> Frozen[DraftArguments, DraftPreview]:
        if facts is None:
            raise Invalid(f"draft {request.draft_id} was not found")
        if facts.state != "draft":
            raise Invalid(f"draft {facts.draft_id} is {facts.state}, not a draft")
        if facts.recipients < 1:
            raise Invalid(f"the audience of draft {facts.draft_id} is empty")
        return self.checked(
            Frozen(
                arguments=DraftArguments(
                    draft_id=facts.draft_id,
                    subject=facts.subject,
                    body=facts.body,
                    segment=facts.segment,
                    recipients=facts.recipients,
                ),
                preview=DraftPreview(
                    subject=facts.subject,
                    segment=facts.segment,
                    recipients=facts.recipients,
                    body=facts.body,
                ),
            )
        )

    def revalidate(
        self,
        arguments: DraftArguments,
        preview: DraftPreview,
        facts: DraftFacts | None,
        *,
        key: str,
    ) -> None:
        if facts is None or facts.state != "draft":
            raise Stale("the draft is no longer a draft; a new proposal is needed")
        if (facts.subject, facts.body, facts.segment) != (
            arguments.subject,
            arguments.body,
            arguments.segment,
        ):
            raise Stale("the draft was edited since it was proposed; a new proposal is needed")
        if facts.recipients != arguments.recipients:
            raise Stale(
                f"the audience changed: {arguments.recipients} recipients when "
                f"proposed, {facts.recipients} now; a new proposal is needed"
            )

    def describe(self, preview: DraftPreview) -> list[tuple[str, str]]:
        """Who it reaches, then the message as it will be copied."""
        return [
            ("Audience", f"{preview.recipients} recipients ({preview.segment})"),
            ("Subject", preview.subject),
            ("Body", preview.body),
        ]

    def render(self, receipt: str | None) -> str:
        return f"Draft copied into the broadcast form ({receipt or 'no receipt'}); nothing sent."

    # -- the executor: dispatcher side only, inside the transaction that records the outcome --

    async def read_local(
        self, conn: Any, tenant: str, draft_id: str, *, lock: bool = False
    ) -> DraftFacts | None:
        """The draft and its audience now; `lock` holds the draft until the commit."""
        if lock:
            await conn.execute(
                "SELECT 1 FROM dispatcher.mail_drafts "
                "WHERE tenant = $1 AND draft_id = $2 FOR UPDATE",
                tenant,
                draft_id,
            )
        row = await conn.fetchrow(_FACTS, tenant, draft_id)
        return None if row is None else DraftFacts(**dict(row))

    async def apply_local(self, conn: Any, tenant: str, arguments: DraftArguments, key: str) -> str:
        """Write the form; the caller commits it with the outcome. Returns the receipt."""
        form_id = await conn.fetchval(
            "INSERT INTO dispatcher.mail_forms (tenant, draft_id, subject, body, segment, "
            "recipients, operation_key) VALUES ($1, $2, $3, $4, $5, $6, $7) "
            # Applied once per operation: a second holder of the same command finds the form.
            "ON CONFLICT (tenant, operation_key) "
            "DO UPDATE SET operation_key = EXCLUDED.operation_key RETURNING form_id",
            tenant,
            arguments.draft_id,
            arguments.subject,
            arguments.body,
            arguments.segment,
            arguments.recipients,
            key,
        )
        return f"form-{form_id}"
