# A copy of schemas/host.py made by clients/python/copy_wire.py: do not edit.
"""The host-facing contract (version `subjects.HOST_API_VERSION`): what a host sends and reads.

A host publishes `RunRequest` on `writ.in.requests.<tenant>` with `Nats-Msg-Id` set to its
`request_id`, and reads `RunResult` on `writ.out.results.<tenant>`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from .base import AgentName, Command, Event, Family, Id, ShortText, Text, Token
from .governance import RunBudget

__all__ = [
    "ActionResult",
    "ApprovalResult",
    "ApproveProposal",
    "ProposalVerdict",
    "OutcomeKind",
    "ProposalView",
    "CommandResult",
    "CommandStatus",
    "DecisionResult",
    "ErrorCode",
    "ErrorInfo",
    "HumanDecision",
    "ReviewDecision",
    "ReviewResult",
    "RunRequest",
    "RunResult",
    "RunStatus",
    "SubmitCommand",
]

ApprovalAnswer = Literal["approve", "reject"]
# `revise`: send the proposal back with a reason (required), what the agent must revise.
ProposalVerdict = Literal["approve", "reject", "revise"]
ApprovalStatus = Literal[
    "claimed", "rejected", "already_completed", "not_approvable", "approval_recorded"
]
RunStatus = Literal["succeeded", "failed", "rejected", "awaiting_human", "cancelled"]
CommandStatus = Literal[
    # Recorded states of an admitted command, as a replay returns them.
    "pending",
    "dispatching",
    "succeeded",
    "denied",
    "expired",
    "revision_required",
    "unknown",
    "failed",
    # Answers about the submission itself.
    "rejected",
    "conflict",
    "awaiting_human",
]


class RunRequest(Command, frozen=True):
    """Ask Writ to run an agent on behalf of the principal named by `token`.

    Tenant and principal come from the signed token only, never from the body.
    """

    request_id: Id
    token: Token
    agent: AgentName
    input: Annotated[str, msgspec.Meta(min_length=1, max_length=8192)]
    # Someone is watching: an ask waits for them (5 minutes, then deny). Unattended runs stop
    # at the first ask and list a pending decision instead.
    attended: bool = False
    # Families the principal grants this agent for this run only (decide's line 5).
    grants: Annotated[list[Family], msgspec.Meta(max_length=5)] = []
    # Limits for this run: each lowers governance's limit for the agent (and the agent's
    # manifest's), never raises it.
    budget: RunBudget | None = None


class SubmitCommand(Command, frozen=True):
    """A host that knows what it wants done asks for one action, under its own operation key.

    Published on `writ.in.commands.<tenant>` with `Nats-Msg-Id` = `request_id`. The same
    `operation_key` with the same payload is a replay (the recorded state and outcome come back);
    with another payload it is a `conflict`, and the stored command is untouched.
    """

    request_id: Id
    token: Token
    agent: AgentName
    operation_key: Id
    action: Annotated[str, msgspec.Meta(max_length=128)]
    arguments: Annotated[dict[str, Any], msgspec.Meta(max_length=32)]
    expected_revision: Annotated[str, msgspec.Meta(max_length=128)] | None = None


class HumanDecision(Command, frozen=True):
    """An approver answers a pending decision, on `writ.in.decisions.<tenant>`.

    The token must carry the `approver` role for the same tenant. `always` is offered only where
    the pending decision lists it among its options.
    """

    request_id: Id
    token: Token
    pending_id: Id
    answer: Literal["once", "always", "deny"]
    reason: ShortText = ""
    # A decision about a call that has an action contract is answered on its proposal, whose
    # frozen preview the approver was shown: it must name that proposal (`GET /runs/{id}` and
    # the run's `RunResult` carry it), or it is refused with `PROPOSAL_REQUIRED`. Naming it
    # makes the answer an approval of the proposal (once or always) or its rejection (deny).
    proposal_id: Id | None = None


class ApproveProposal(Command, frozen=True):
    """An approver approves or rejects one proposal, on `writ.in.approvals.<tenant>`.

    It names the proposal and nothing else: the approved operation is the one Writ froze and
    showed. The token must carry the `approver` role for the proposal's tenant.
    """

    request_id: Id
    token: Token
    proposal_id: Id
    answer: ProposalVerdict
    reason: ShortText = ""
    # `always`: approve, and let this agent's calls of the same family run without asking from
    # now on, where the decision offers it (never for a contract that moves money, changes
    # access or sends outside: that is refused with `INVALID_ANSWER` and grants nothing).
    grant: Literal["once", "always"] = "once"


class ReviewDecision(Command, frozen=True):
    """An approver answers the review a run's agent asked for, on `writ.in.reviews.<tenant>`.

    `pending_id` is the run's `review-<run>-<step>`; approve resumes the run with the answer
    (and `comment`) as its next observation, reject fails it with `REJECTED`. The reviewer is
    the token's principal, which must carry the `approver` role for the run's tenant.
    """

    request_id: Id
    token: Token
    pending_id: Id
    answer: ApprovalAnswer
    comment: ShortText = ""


OutcomeKind = Literal[
    "pending",
    "succeeded",
    "needs_reconciliation",
    "revision_required",
    "denied",
    "expired",
    "terminal_failure",
]


class ProposalView(msgspec.Struct, frozen=True, kw_only=True):
    """A proposal waiting for a person: its opaque id and exactly what approving it does."""

    proposal_id: Id
    action: ShortText
    preview: Annotated[dict[str, Any], msgspec.Meta(max_length=32)]
    expires_at: ShortText
    # "expired": its preview was erased by the retention policy or an erasure (`{}` above).
    payload: Literal["expired"] | None = None


# A stable error code of the host contract (the README lists them all).
ErrorCode = Annotated[str, msgspec.Meta(pattern=r"^[A-Z][A-Z_]{0,63}(?!\n)$")]


class ApprovalResult(Event, frozen=True):
    """What became of an `ApproveProposal`, on `writ.out.results.<tenant>`.

    `claimed`: this approval started the one execution; `rejected`: the proposal is refused;
    `already_completed`: it was approved before (the recorded outcome, not a second execution);
    `not_approvable`: why nothing happened, `code` saying it as data; `approval_recorded`: the
    proposal needs two distinct approvers (four eyes) and this is the first approval, recorded;
    nothing executes until another approver approves.
    """

    request_id: ShortText
    proposal_id: ShortText
    status: ApprovalStatus
    outcome: OutcomeKind | None = None
    receipt: ShortText | None = None
    reason: ShortText | None = None
    correlation_id: ShortText | None = None
    api_version: str = "1"
    code: ErrorCode | None = None  # set with `not_approvable` (and a rejection by ingress)


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Why a request was rejected or a run failed; `code` is stable, `message` is for people."""

    code: ErrorCode
    message: ShortText


class ActionResult(msgspec.Struct, frozen=True, kw_only=True):
    """What is known about one action the run asked for."""

    action: ShortText
    operation_id: Id
    state: ShortText
    receipt: ShortText | None = None
    reason: ShortText | None = None
    # What may be done next, classified by Writ (never by the model); a terminal failure
    # carries a correlation id instead of details.
    outcome: OutcomeKind | None = None
    correlation_id: ShortText | None = None


class RunResult(Event, frozen=True):
    """The end of a run, or the rejection of a request, as the host sees it."""

    request_id: ShortText
    status: RunStatus
    run_id: Id | None = None
    error: ErrorInfo | None = None
    answer: Text | None = None
    actions: Annotated[list[ActionResult], msgspec.Meta(max_length=64)] = []
    pending_id: Id | None = None  # set when the run waits for a person's decision
    proposal: ProposalView | None = None  # set when that decision is a proposal to approve
    api_version: str = "1"
    # Monotonic per run: each change of what the host sees of the run (its status, answer,
    # error or pending decision) counts one more. `wait` with `after=<version>` returns only
    # a newer result. 0 for a request refused before it became a run.
    version: Annotated[int, msgspec.Meta(ge=0)] = 0


class CommandResult(Event, frozen=True):
    """What is known about a host's command, on `writ.out.results.<tenant>`."""

    request_id: ShortText
    operation_key: ShortText
    status: CommandStatus
    operation_id: Id | None = None
    receipt: ShortText | None = None
    error: ErrorInfo | None = None
    pending_id: Id | None = None  # set with `awaiting_human`: the decision a person must take
    proposal: ProposalView | None = None  # with `awaiting_human`: what approving it does
    outcome: OutcomeKind | None = None
    correlation_id: ShortText | None = None
    api_version: str = "1"


class DecisionResult(Event, frozen=True):
    """Whether an approver's `HumanDecision` was taken, on `writ.out.results.<tenant>`; when
    it was not, `code` says why as data."""

    request_id: ShortText
    pending_id: ShortText
    accepted: bool
    message: ShortText
    api_version: str = "1"
    code: ErrorCode | None = None


class ReviewResult(Event, frozen=True):
    """Whether an approver's `ReviewDecision` was taken, on `writ.out.results.<tenant>`.

    The run's own `RunResult` (resumed, or failed `REJECTED`) follows under its request id.
    When the answer was not taken, `code` says why as data.
    """

    request_id: ShortText
    pending_id: ShortText
    accepted: bool
    message: ShortText
    api_version: str = "1"
    code: ErrorCode | None = None
