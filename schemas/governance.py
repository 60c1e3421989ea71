"""Governance's messages: `decide` for every capability call, runs it must know about, the
pending decisions people answer, and the budgets a run's steps reserve and settle."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from schemas.base import (
    AgentName,
    Command,
    Digest,
    Event,
    Family,
    Id,
    Principal,
    ShortText,
    Tenant,
)

__all__ = [
    "AGENT_CALL_PREFIX",
    "Answer",
    "AnswerDecision",
    "ApprovalCounted",
    "BudgetKind",
    "BudgetRefused",
    "BudgetReserved",
    "BudgetSettled",
    "CapSpend",
    "DecideBatch",
    "DecideRequest",
    "Decision",
    "Decisions",
    "DecisionAnswered",
    "ListPending",
    "ListSpend",
    "PendingDecision",
    "PendingDecisions",
    "SpendReport",
    "RegisterRun",
    "RegisterTurn",
    "LeaseAmounts",
    "ReserveBudget",
    "RunBudget",
    "RunRegistered",
    "SettleBudget",
    "Settlement",
    "Verdict",
]

Verdict = Literal["allow", "deny", "ask"]
Answer = Literal["once", "always", "deny"]
# The budgets a reservation can run out of (a bounded metric label). `wall_time` counts the
# run's seconds since it was registered, less the time it waited for a person.
BudgetKind = Literal[
    "provider_calls", "tokens", "capability_calls", "wall_time", "concurrent_steps", "spend"
]
# `DecideRequest.tool` of a call to another agent (the planner's multi-agent branches):
# `agent:<name>`. No action contract or read tool has a colon in its name.
AGENT_CALL_PREFIX: Final = "agent:"
MAX_AMOUNT: Final = 1_000_000_000
Amount = Annotated[int, msgspec.Meta(ge=0, le=MAX_AMOUNT)]
SpendName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[^\s]+$")]
SpendAmount = Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,12}(\.[0-9]{1,6})?$")]
SpendCurrency = Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{3}(?!\n)$")]


class DecideRequest(Command, frozen=True):
    """May this agent, for this principal, call this tool now?"""

    tenant: Tenant
    principal: Principal
    agent: AgentName
    run_id: Id
    tool: ShortText
    first_argument: ShortText = ""
    # The proposal an ask would be about (admission's id), so the answer can find it.
    proposal_id: Id | None = None
    # At dispatch: the decision the command was admitted under. If it is a person's answer to
    # exactly this call, it stands in for a grant (denials and revocations still come first).
    approval_id: Id | None = None
    # For an `mcp:` tool: the digest of the tool as retrieval listed it just now. A digest that
    # is not the one the operator classified is refused (the tool changed, or was never listed).
    tool_digest: Digest | None = None
    # How long an ask about this call stays open (a proposal's time to live): past it, the
    # pending decision is closed as a deny by the clock, so nothing answers an expired one.
    ask_open_s: Annotated[int, msgspec.Meta(ge=1, le=366 * 86400)] | None = None


class Decision(Event, frozen=True):
    """The answer, naming the line of `decide` that gave it and the policy version it read.

    An `ask` comes with a `pending_id` (the decision id) and the answers a person may give.
    """

    decision_id: Id
    verdict: Verdict
    line: Annotated[int, msgspec.Meta(ge=1, le=6)]
    family: ShortText
    reason: ShortText
    policy_version: ShortText
    options: Annotated[list[Answer], msgspec.Meta(max_length=3)] = []
    pending_id: Id | None = None


# The most calls one `DecideBatch` may carry (admission asks per fetched batch).
MAX_DECIDE_BATCH: Final = 256


class DecideBatch(Command, frozen=True):
    """Several `DecideRequest`s answered in one request/reply (admission's batches): each is
    decided exactly as alone, and all are recorded together."""

    requests: Annotated[
        list[DecideRequest], msgspec.Meta(min_length=1, max_length=MAX_DECIDE_BATCH)
    ]


class Decisions(Event, frozen=True):
    """The answers to a `DecideBatch`, one per request, in the same order."""

    decisions: list[Decision]


class RunBudget(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Limits asked for a run (by its host, or its agent's manifest). Each can only lower
    governance's limit for the agent, never raise it; a field left out asks nothing."""

    provider_calls: Amount | None = None
    tokens: Amount | None = None
    capability_calls: Amount | None = None
    # Seconds of the run's clock, which stops while the run waits for a person.
    wall_time_s: Annotated[int, msgspec.Meta(ge=1, le=7 * 86400)] | None = None
    max_concurrent_steps: Annotated[int, msgspec.Meta(ge=1, le=256)] | None = None


class RegisterRun(Command, frozen=True):
    """Ingress tells governance, before the run starts, what only a verified host may say
    (`subjects.REGISTER_RUN`, which only ingress may publish)."""

    tenant: Tenant
    run_id: Id
    principal: Principal
    agent: AgentName
    attended: bool = False
    grants: Annotated[list[Family], msgspec.Meta(max_length=5)] = []
    # What the host asked for the run: lowers governance's limits for the agent, never raises
    # them. None: those limits as they are.
    budget: RunBudget | None = None


class RegisterTurn(Command, frozen=True):
    """The planner tells governance a chat turn's run is starting. It says nothing of grants:
    a turn holds what governance itself holds for its session's agent, never more than a
    verified host gave; governance refuses one that would widen a run it already knows."""

    tenant: Tenant
    run_id: Id  # `<session_id>-t<turn>`
    session_id: Id
    principal: Principal
    agent: AgentName
    attended: bool = True  # a person is in the chat


class RunRegistered(Event, frozen=True):
    """The run is known to governance."""

    run_id: Id


class AnswerDecision(Command, frozen=True):
    """A verified approver's answer to a pending decision (from ingress)."""

    tenant: Tenant
    principal: Principal
    request_id: Id
    pending_id: Id
    answer: Answer
    reason: ShortText = ""
    # Admission's answer for a proposal it showed (its internal id): only such an answer may
    # settle a decision about a proposal; a person's bare answer to it is refused.
    proposal_id: Id | None = None
    # Four eyes: how many distinct approvers the proposal's contract asks for, and who else
    # approved it so far. Governance checks each of them again (an approver revoked since no
    # longer counts, nor the requester); while they and this principal are fewer than
    # `approvers_needed`, this approval is checked and counted, and the decision stays open.
    approvers_needed: Annotated[int, msgspec.Meta(ge=1, le=8)] = 1
    approved_by: Annotated[list[Principal], msgspec.Meta(max_length=8)] = []


class ApprovalCounted(Event, frozen=True):
    """Governance's reply to an approval that does not complete a four-eyes proposal's
    approvers: checked like any answer (the approver not revoked, of the tenant, not the
    requester, the decision still open) and counted; nothing is answered yet."""

    tenant: Tenant
    pending_id: Id
    approvers: Annotated[list[Principal], msgspec.Meta(max_length=8)]  # those that count
    needed: Annotated[int, msgspec.Meta(ge=1, le=8)]


class DecisionAnswered(Event, frozen=True):
    """A pending decision was answered (by a person, or by the clock: unanswered is deny)."""

    tenant: Tenant
    pending_id: Id
    run_id: Id
    proposal_id: Id | None
    answer: Answer
    reason: ShortText
    answered_by: ShortText
    decision_id: Id  # the decision the answer became: what admission stores with the command
    line: int
    policy_version: ShortText


class ListPending(Command, frozen=True):
    """Ask governance for a tenant's unanswered decisions (`writ pending`): oldest first by
    default, a page of `limit` after `cursor`, filtered (`about_proposal=False`: only those
    about calls no proposal stands for; None: all; `pending_id`: only that one)."""

    tenant: Tenant
    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 500
    cursor: ShortText | None = None
    newest_first: bool = False
    about_proposal: bool | None = None
    agent: ShortText | None = None
    tool: ShortText | None = None
    principal: ShortText | None = None
    older_than_s: Annotated[int, msgspec.Meta(ge=0, le=366 * 86400)] | None = None
    pending_id: Id | None = None  # that one decision, if it still waits (a lookup by id)


class PendingDecision(msgspec.Struct, frozen=True, kw_only=True):
    """One decision waiting for a person."""

    pending_id: Id
    run_id: Id
    agent: ShortText
    principal: ShortText
    tool: ShortText
    family: ShortText
    first_argument: ShortText
    reason: ShortText
    options: list[Answer]
    attended: bool
    deadline: ShortText | None
    created_at: ShortText
    # About a proposal: answered on the proposal, where its frozen preview is shown.
    about_proposal: bool = False


class PendingDecisions(Event, frozen=True):
    """The answer to `ListPending`: a page, how many match in all, and the next page's cursor
    (None: this is the last)."""

    decisions: Annotated[list[PendingDecision], msgspec.Meta(max_length=500)]
    total: int | None = None
    next_cursor: ShortText | None = None


class Settlement(Command, frozen=True):
    """One earlier reservation of the same run, closed with what its step used, in the
    transaction of the `ReserveBudget` that carries it (before it reserves)."""

    reservation_id: Id
    provider_calls: Amount = 0
    tokens: Amount = 0
    capability_calls: Amount = 0
    # What the step used of `tokens`, read and written (priced apiece by a spend cap's price
    # table; without them every token is priced at the dearer rate).
    input_tokens: Amount | None = None
    output_tokens: Amount | None = None


class LeaseAmounts(Command, frozen=True):
    """The most a lease asks of each countable budget (`ReserveBudget.up_to`)."""

    provider_calls: Amount = 0
    tokens: Amount = 0
    capability_calls: Amount = 0


class ReserveBudget(Command, frozen=True):
    """Reserve, before a step starts, what it may spend of its run's budgets.

    One reservation per (run, step key): a step that calls a model reserves its provider call
    and its tokens together, so it gets both or neither. Asking again with the same step key
    returns the same reservation (whatever the amounts asked the second time). Each open
    reservation is one of the run's concurrent steps.

    `settle`: earlier reservations of this run whose steps are over, closed first in the same
    transaction (as `SettleBudget` would close each), so the step that follows another pays
    one round trip and one transaction for both. They are closed even if the reservation is
    then refused; if governance fails, neither happens.
    """

    tenant: Tenant
    run_id: Id
    step_key: Id
    provider_calls: Amount = 0
    tokens: Amount = 0
    capability_calls: Amount = 0
    # The caller's own limits for the run (the root agent's manifest budgets): governance
    # lowers the run's limits to them before it reserves, and never raises one. Sent with
    # every reservation, so no step can start before they apply.
    limit: RunBudget | None = None
    settle: Annotated[list[Settlement], msgspec.Meta(max_length=16)] = []
    # A lease (the planner's, for the steps of one run): reserve up to these amounts where the
    # run has them left, never less than the amounts above (which alone decide a refusal).
    # The answer says what was reserved; the caller spends it over several steps and settles
    # the reservation once, with what they used together.
    up_to: LeaseAmounts | None = None
    # What the step's cost is read from, where the tenant has spend caps: the model called
    # ("provider/model"), the action contract called, and the amount its frozen arguments
    # carry (decimal text, read only where the table says so) with its currency, which must
    # be the table's: an amount in another currency, or none where the table reads one,
    # cannot be priced and is refused.
    model: SpendName | None = None
    action: SpendName | None = None
    amount: SpendAmount | None = None
    currency: SpendCurrency | None = None


class BudgetReserved(Event, frozen=True):
    """The reservation (new, or the one this step key already had: `status` says which state
    it is in, so a redelivered step can see it was already settled)."""

    reservation_id: Id
    run_id: Id
    step_key: Id
    status: Literal["open", "settled", "released"]
    provider_calls: int
    tokens: int
    capability_calls: int
    # Seconds left on the run's clock when this answer was given (it stops while waiting).
    wall_time_left_s: float = 0.0
    # The `settle` reservations now closed (or found closed, or unknown to governance).
    settled: list[str] = []


class BudgetRefused(Event, frozen=True):
    """No reservation: `budget` names what ran out, or why governance cannot tell.

    `unavailable`: governance cannot read its store (fail closed: nothing is reserved);
    `unknown_run`: no budget was recorded for this run.
    """

    run_id: Id
    step_key: Id
    budget: BudgetKind | Literal["unavailable", "unknown_run"]
    reason: ShortText
    # The spend cap that would be exceeded (`budget` is `spend`).
    cap: SpendName | None = None
    # The `settle` reservations closed all the same (none if governance failed).
    settled: list[str] = []


class SettleBudget(Command, frozen=True):
    """Close a reservation with what the step really used (more than reserved is recorded as
    it is). `release`: the step was abandoned; what it used (usually nothing) is recorded.
    `credit`: instead, the capability call was definitely not carried out (denied, rejected,
    expired, failed, sent back): what its spend charge holds or took from its caps is given
    back, once; the reservation is closed by its own settlement, as any other."""

    tenant: Tenant
    run_id: Id
    reservation_id: Id
    provider_calls: Amount = 0
    tokens: Amount = 0
    capability_calls: Amount = 0
    # What the step used of `tokens`, read and written (priced apiece by a spend cap's price
    # table; without them every token is priced at the dearer rate).
    input_tokens: Amount | None = None
    output_tokens: Amount | None = None
    release: bool = False
    credit: bool = False


class BudgetSettled(Event, frozen=True):
    """The closed reservation. Settling it again returns what was recorded the first time.
    (`open`: only in the answer to a credit that came before the reservation's settlement.)"""

    reservation_id: Id
    run_id: Id
    status: Literal["settled", "released", "open"]
    provider_calls: int
    tokens: int
    capability_calls: int


class ListSpend(Command, frozen=True):
    """Ask governance for a tenant's spend against its caps (`writ spend`)."""

    tenant: Tenant
    cap: SpendName | None = None


class CapSpend(msgspec.Struct, frozen=True, kw_only=True):
    """One cap's spend in one window, in micros (millionths) of the table's currency."""

    cap: SpendName
    window: Annotated[str, msgspec.Meta(max_length=16)]
    reserved_micros: int
    used_micros: int
    # The cap as the tenant's current price table states it (None: no longer in it).
    limit: SpendAmount | None = None
    agent: SpendName | None = None
    currency: Annotated[str, msgspec.Meta(max_length=3)] | None = None


class SpendReport(Event, frozen=True):
    """The answer to `ListSpend`: newest windows first."""

    spend: Annotated[list[CapSpend], msgspec.Meta(max_length=500)]
