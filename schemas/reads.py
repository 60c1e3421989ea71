"""Reads ingress asks of the services that own the state (request/reply on the bus): ingress
holds no database, so `GET /runs/{id}` is a question to the planner, `GET /commands/{key}` and
`GET /proposals` questions to admission."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from schemas.base import Command, Id, ShortText, Tenant
from schemas.subjects import COMMAND_STATUS as COMMAND_STATUS
from schemas.subjects import JOURNALED as JOURNALED
from schemas.subjects import PROPOSAL_GET as PROPOSAL_GET
from schemas.subjects import PROPOSALS_LIST as PROPOSALS_LIST
from schemas.subjects import REVIEWS_LIST as REVIEWS_LIST
from schemas.subjects import RUN_EVENTS as RUN_EVENTS
from schemas.subjects import RUN_STATUS as RUN_STATUS
from schemas.subjects import journal_verify as journal_verify

__all__ = [
    "COMMAND_STATUS",
    "PROPOSALS_LIST",
    "PROPOSAL_GET",
    "REVIEWS_LIST",
    "RUN_EVENTS",
    "RUN_STATUS",
    "ApprovalGiven",
    "GetCommand",
    "JournalEntryView",
    "ProposalTrail",
    "GetProposal",
    "GetRun",
    "GetRunEvents",
    "ListProposals",
    "JOURNALED",
    "JournalState",
    "JournalStates",
    "ListReviews",
    "PendingReview",
    "PendingReviews",
    "ProposalDetail",
    "ProposalState",
    "Proposals",
    "VerifyJournal",
    "journal_verify",
]


class GetRun(Command, frozen=True):
    """Where one of the tenant's runs stands."""

    tenant: Tenant
    run_id: Id


ProposalState = Literal["pending", "executing", "completed", "rejected", "expired"]


class GetCommand(Command, frozen=True):
    """What became of the host command under this operation key."""

    tenant: Tenant
    operation_key: Id


class ListProposals(Command, frozen=True):
    """The tenant's proposals, newest first (those in `state`, if given)."""

    tenant: Tenant
    state: ProposalState | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 100
    run_id: Id | None = None  # only this run's proposals
    # Paging: `Proposals.next_cursor` of the page before (opaque); every proposal is on
    # exactly one page, however many there are.
    cursor: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    # Filters: the contract, the agent, who asked, and proposed at least this long ago.
    action: ShortText | None = None
    agent: ShortText | None = None
    requester: ShortText | None = None
    older_than_s: Annotated[int, msgspec.Meta(ge=0, le=366 * 86400)] | None = None
    # The proposal the decision under this id asked for (a lookup by id, however many wait).
    decision_id: Id | None = None


class GetProposal(Command, frozen=True):
    """One proposal by its public id."""

    tenant: Tenant
    proposal_id: Id


class ApprovalGiven(msgspec.Struct, frozen=True, kw_only=True):
    """One approval of a proposal that needs several distinct approvers (four eyes), and
    whether it still counts towards them."""

    approver: ShortText
    approved_at: ShortText
    counts: bool = True
    # Why it no longer counts: a stable code (`APPROVER_REVOKED`: the approver's access was
    # revoked after they approved) and the same in English words; None while it counts.
    code: ShortText | None = None
    reason: ShortText | None = None


class ProposalDetail(msgspec.Struct, frozen=True, kw_only=True):
    """A proposal as a person sees it: the frozen preview, the canonical request hash, its
    expiry, the decision that asked, and what it became."""

    proposal_id: Id
    run_id: ShortText
    action: ShortText
    preview: dict[str, Any]
    request_hash: ShortText
    state: ProposalState
    expires_at: ShortText | None = None
    decision_id: ShortText | None = None
    reason: ShortText | None = None
    approved_by: ShortText | None = None
    operation_id: ShortText | None = None
    command_state: ShortText | None = None
    receipt: ShortText | None = None
    # Why the command ended as it did (a revision required, a denial at the re-check, ...).
    command_reason: ShortText | None = None
    # Who asked for the run (who may not approve it), its agent, and when it was proposed.
    requester: ShortText | None = None
    agent: ShortText | None = None
    created_at: ShortText | None = None
    # The facts the preview was computed from and when they were read (None: the action reads
    # none), and the line of `decide` and policy version of the decision that asked.
    facts: Any = None
    facts_read_at: ShortText | None = None
    decision_line: int | None = None
    policy_version: ShortText | None = None
    approved_at: ShortText | None = None  # when the approval that admitted it was given
    # Four eyes: how many distinct approvers its contract asks for, and the approvers whose
    # approval counts so far (while it waits for the second). An approval that no longer
    # counts (its approver revoked since) is not among them; `approvals_given` lists every
    # approval given, each saying whether it counts and why not.
    approvals_needed: int = 1
    approvals: Annotated[list[ShortText], msgspec.Meta(max_length=16)] = msgspec.field(
        default_factory=list
    )
    approvals_given: Annotated[list[ApprovalGiven], msgspec.Meta(max_length=16)] = msgspec.field(
        default_factory=list
    )
    # "expired" when its arguments, preview and facts were erased by the retention policy or
    # an erasure: `preview` is then `{}` because it is gone, and it cannot be approved.
    payload: Literal["expired"] | None = None


class Proposals(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to `ListProposals`."""

    proposals: Annotated[list[ProposalDetail], msgspec.Meta(max_length=500)]
    # How many match the filters in all (every page), and the cursor of the next page (None:
    # this is the last).
    total: int | None = None
    next_cursor: ShortText | None = None


class GetRunEvents(Command, frozen=True):
    """The run's steps with a sequence above `after` (-1: from the start)."""

    tenant: Tenant
    run_id: Id
    after: Annotated[int, msgspec.Meta(ge=-1)] = -1


class ListReviews(Command, frozen=True):
    """The tenant's runs waiting for a person to review their agent's work."""

    tenant: Tenant
    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 100
    pending_id: Id | None = None  # that one review, if its run still waits (a lookup by id)


class PendingReview(msgspec.Struct, frozen=True, kw_only=True):
    """A review a run's agent asked for, waiting (answered by `POST /reviews/{pending_id}`)."""

    pending_id: Id
    run_id: Id
    agent: ShortText
    principal: ShortText
    since: ShortText
    # What the agent asks the reviewer (its `review_prompt`), as the run recorded it.
    prompt: Annotated[str, msgspec.Meta(max_length=2048)] = ""


class PendingReviews(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to `ListReviews`."""

    reviews: Annotated[list[PendingReview], msgspec.Meta(max_length=500)]


class VerifyJournal(Command, frozen=True):
    """Verify the service's whole chain; count the entries of `tenant`, and return its sealed
    entries about `subjects` (a proposal's ids, its decisions, its command), each checked."""

    tenant: Tenant
    subjects: Annotated[list[Id], msgspec.Meta(max_length=16)] = msgspec.field(default_factory=list)


class JournalEntryView(msgspec.Struct, frozen=True, kw_only=True):
    """One journal entry, opened: where it sits in the chain, what it says, and whether
    it checks out (`problem` says why not)."""

    seq: int | None  # None: not sealed into the chain yet
    kind: ShortText
    subject: ShortText
    recorded_at: ShortText
    payload: dict[str, Any]
    verified: bool
    problem: ShortText | None = None


class JournalState(msgspec.Struct, frozen=True, kw_only=True):
    """One journal's state: its chain, checkpoints and signatures check out, or where not."""

    service: ShortText
    ok: bool
    entries: int = 0
    checkpoints: int = 0
    unsealed: int = 0
    tenant_entries: int | None = None
    first_problem: ShortText | None = None
    # The entries about the asked subjects, in chain order.
    found: Annotated[list[JournalEntryView], msgspec.Meta(max_length=256)] = msgspec.field(
        default_factory=list
    )


class ProposalTrail(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /proposals/{id}/trail`: the proposal as recorded, and each journal's entries about
    it (proposed, decided, answered, approved or rejected, every attempt, the outcome), each
    checked against its signed chain."""

    proposal: ProposalDetail
    journals: list[JournalState]


class JournalStates(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /audit/verify`: every journal's state (`ok` only if all are)."""

    ok: bool
    journals: list[JournalState]
