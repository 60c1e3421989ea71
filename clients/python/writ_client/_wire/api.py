# A copy of schemas/api.py made by clients/python/copy_wire.py: do not edit.
"""The HTTP API's bodies (`/api/v1`, served by ingress): the host contract without its token.

Over HTTP the token travels in `Authorization: Bearer` and the request id in `Idempotency-Key`,
so the bodies are the NATS messages less those two fields. Ingress rebuilds the NATS message
from them and hands it to the same verification as a message published on `writ.in.*`.
Bodies refuse unknown fields and carry no type tag.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from .base import AgentName, Family, Id, ShortText
from .governance import RunBudget
from .host import ActionResult, ErrorInfo, ProposalView
from .planner import StepRecorded

__all__ = [
    "ApproveBody",
    "CommandAccepted",
    "CommandBody",
    "DecideBody",
    "EvidenceRef",
    "Problem",
    "RejectBody",
    "ResolveBody",
    "ReviewBody",
    "RunAccepted",
    "RunEvents",
    "RunView",
    "StartRun",
]


class Body(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A request body: unknown fields are an error."""


class StartRun(Body, frozen=True):
    """`POST /runs`: a `RunRequest` without `request_id` (the Idempotency-Key) and `token`."""

    agent: AgentName
    input: Annotated[str, msgspec.Meta(min_length=1, max_length=8192)]
    attended: bool = False
    grants: Annotated[list[Family], msgspec.Meta(max_length=5)] = []
    budget: RunBudget | None = None


class CommandBody(Body, frozen=True):
    """`POST /commands`: a `SubmitCommand` without `request_id` and `token`."""

    agent: AgentName
    operation_key: Id
    action: Annotated[str, msgspec.Meta(max_length=128)]
    arguments: Annotated[dict[str, Any], msgspec.Meta(max_length=32)]
    expected_revision: Annotated[str, msgspec.Meta(max_length=128)] | None = None


class DecideBody(Body, frozen=True):
    """`POST /pending-decisions/decide`: a `HumanDecision` without `request_id` and `token`."""

    pending_id: Id
    answer: Literal["once", "always", "deny"]
    reason: ShortText = ""
    proposal_id: Id | None = None  # required where the decision is about a proposal


class ApproveBody(Body, frozen=True):
    """`POST /proposals/{id}/approve`: an optional note, and `always` where it is offered."""

    reason: ShortText = ""
    grant: Literal["once", "always"] = "once"


class RejectBody(Body, frozen=True):
    """`POST /proposals/{id}/reject`: why (required)."""

    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]


class ReviewBody(Body, frozen=True):
    """`POST /reviews/{pending_id}`: a `ReviewDecision` without the ids and the token."""

    answer: Literal["approve", "reject"]
    comment: ShortText = ""


class RunAccepted(msgspec.Struct, frozen=True, kw_only=True):
    """`202` to `POST /runs`: the run's id (derived from tenant and Idempotency-Key)."""

    run_id: Id
    request_id: Id
    links: dict[str, str]


class CommandAccepted(msgspec.Struct, frozen=True, kw_only=True):
    """`202` to `POST /commands`."""

    request_id: Id
    operation_key: Id
    links: dict[str, str]


RunState = Literal["queued", "running", "awaiting_human", "succeeded", "failed", "cancelled"]


class EvidenceRef(msgspec.Struct, frozen=True, kw_only=True):
    """A document a run was given as evidence (untrusted content: its title, not its text)."""

    document_id: ShortText
    kind: ShortText
    title: ShortText
    trust: ShortText = "untrusted"


class RunView(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /runs/{run_id}`: where a run stands, as the planner recorded it."""

    run_id: Id
    request_id: ShortText
    status: RunState
    agent: ShortText
    answer: str | None = None
    error: ErrorInfo | None = None
    actions: list[ActionResult] = []
    pending_id: ShortText | None = None
    proposal: ProposalView | None = None
    evidence: Annotated[list[EvidenceRef], msgspec.Meta(max_length=16)] = []
    # The run's `RunResult.version` as it now stands (a run still queued: 0).
    version: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Set when the run's input and evidence were erased by the retention policy or an
    # erasure ("payload expired"): `evidence` is then empty because it is gone, not because
    # the run had none.
    payload: Literal["expired"] | None = None


class RunEvents(msgspec.Struct, frozen=True, kw_only=True):
    """A run's timeline after a point: its committed steps (each `StepRecorded`, as the planner
    announces it: what happened, never the content), where the run stands, and its result once
    it has one. `GET /runs/{id}/events` streams them as Server-Sent Events."""

    run: RunView
    steps: list[StepRecorded] = []


class ResolveBody(Body, frozen=True):
    """`POST /reconciliation/{operation_id}/resolve`: what an operator established."""

    state: Literal["succeeded", "failed"]
    evidence: Annotated[str, msgspec.Meta(min_length=1, max_length=4000)]
    receipt: ShortText | None = None


class Problem(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An RFC 9457 problem document; `code` is the stable code of the README."""

    type: str  # "about:blank": the code and status say it all
    title: str
    status: int
    code: str
    detail: str = ""
    instance: str | None = None
