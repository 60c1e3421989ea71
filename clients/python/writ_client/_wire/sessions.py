# A copy of schemas/sessions.py made by clients/python/copy_wire.py: do not edit.
"""Chat sessions (docs/design.md §10), owned by the planner: the HTTP bodies of `/api/v1/sessions`
and `/api/v1/plans`, what ingress asks the planner (`SESSION_OPS`, request/reply) and the
numbered events of a session's stream (`writ.chat.<tenant>.<session>`).

A session belongs to one tenant, one principal (both from the token, never from a body) and
one agent. Its states are `active`, `processing`, `paused` and `closed` (terminal), moved only
by the planner's transition table (`services/planner/sessions/logic.py`). Each turn is a run of
the planner's loop (`run_id` = `<session_id>-t<turn>`), governed exactly like one.

Bodies refuse unknown fields and bound their sizes. Events are `Event`s: a client skips the
fields (and event types) it does not know. Every durable event carries `n`, its number in the
session (1, 2, ...; no gap); text deltas and resets carry `n` = 0 and their own `attempt` and
`index`, since they are many and not kept in the planner's tables (the answer is, once
decided: `TurnEnded.answer`). Over SSE each event's `id` is its JetStream stream sequence, so
`Last-Event-ID` resumes exactly.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

from .base import (
    AgentName,
    Command,
    Digest,
    Event,
    Id,
    Principal,
    ShortText,
    Tenant,
    Token,
)
from .subjects import SESSION_OPS as SESSION_OPS
from .subjects import TURN_CANCELLING as TURN_CANCELLING
from .subjects import chat_subject as chat_subject
from .subjects import turn_cancelling as turn_cancelling

__all__ = [
    "CHAT_STREAM",
    "HOST_SESSION",
    "HostSessionOp",
    "SequencedEvent",
    "SessionEventBatch",
    "TURN_CANCELLING",
    "TurnCancelling",
    "turn_cancelling",
    "AnySessionEvent",
    "PlanDecided",
    "PlanState",
    "SessionOpKind",
    "SessionList",
    "SessionSummary",
    "MAX_SESSION_TEXT",
    "PLAN_OPS",
    "SESSION_OPS",
    "SESSION_STATES",
    "CapabilitySelected",
    "ChildSession",
    "DecisionAsked",
    "DecisionTaken",
    "ForkBody",
    "InjectBody",
    "MessageBody",
    "Observed",
    "OpenSession",
    "PlanAnswered",
    "PlanBody",
    "PlanProposed",
    "PlanStep",
    "PlanStepOutcome",
    "PlanView",
    "ProposalMade",
    "SessionAccepted",
    "SessionClosed",
    "SessionEvent",
    "SessionForked",
    "SessionInjected",
    "SessionMessage",
    "SessionOp",
    "SessionOpened",
    "SessionPaused",
    "SessionReply",
    "SessionResumed",
    "SessionState",
    "SessionView",
    "StepAdmitted",
    "StepDispatched",
    "StepOutcome",
    "TextDelta",
    "TextReset",
    "TurnEnded",
    "TurnStarted",
    "UserMessage",
    "WaitingFor",
    "WriterNote",
    "chat_subject",
]

# Hosts over NATS: a `HostSessionOp` to `writ.api.<tenant>.session` (request/reply, answered by
# ingress as the HTTP routes are).
HOST_SESSION: Final = "session"
PLAN_OPS: Final = SESSION_OPS  # plans are answered through the same endpoint
CHAT_STREAM: Final = "WRIT_CHAT"
MAX_SESSION_TEXT: Final = 8192

SessionState = Literal["active", "processing", "paused", "closed"]
SESSION_STATES: Final = ("active", "processing", "paused", "closed")
PlanState = Literal["proposed", "approved", "rejected", "superseded"]
SessionText = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SESSION_TEXT)]
Count = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]


class TurnCancelling(Event, frozen=True):
    """A turn's run was cancelled (its session closed): a model call in flight for it is
    abandoned now rather than answered into a closed session. Progress only: one lost leaves
    the call to finish, and the run ends cancelled at its next step."""

    tenant: Tenant
    run_id: Id


# --- HTTP bodies (`/api/v1/sessions`, `/api/v1/plans`) ------------------------------------


class _Body(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A request body: unknown fields are an error."""


class OpenSession(_Body, frozen=True):
    """`POST /sessions`: a conversation with one agent. `plan_mode`: every turn that would act
    first proposes a plan for the user to approve (an agent's manifest may ask for it too)."""

    agent: AgentName
    plan_mode: bool = False


class MessageBody(_Body, frozen=True):
    """`POST /sessions/{id}/messages`: the user's next message; it starts a turn."""

    text: SessionText


class InjectBody(_Body, frozen=True):
    """`POST /sessions/{id}/inject`: a user message the model sees at its next decision of the
    turn in flight (or of the next turn), marked as injected."""

    text: SessionText


class ForkBody(_Body, frozen=True):
    """`POST /sessions/{id}/fork`: a new session whose history is this one's up to the end of
    turn `turn` (or, with `step`, up to and including that recorded step of that turn)."""

    turn: Annotated[int, msgspec.Meta(ge=1, le=10_000)]
    step: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None


class PlanBody(_Body, frozen=True):
    """`POST /plans/{plan_id}/approve|reject`: a note (approve) or the reason (reject), which
    is the next turn's context."""

    reason: ShortText = ""


# --- Views ---------------------------------------------------------------------------------


class PlanStep(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a plan: the capability it will use and, for an action, the arguments and
    preview the action's contract resolves (from the facts it reads, for an action that stands
    on them); `request` is what is sent when the step is taken (the request as the contract
    decodes it, NFC-normalised), whatever the model writes then (None in a plan frozen before
    it was kept)."""

    index: Annotated[int, msgspec.Meta(ge=0, le=100)]
    capability: ShortText
    arguments: dict[str, Any] = {}
    preview: dict[str, Any] = {}
    request: dict[str, Any] | None = None


class PlanStepOutcome(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What became of one step of an approved plan by the turn's end: `succeeded` (or another
    command state), `read`, `answered`, `refused: <check>`, or `not_run` (the plan ended
    before it); `operation_id` is its command's, if it had one."""

    index: Annotated[int, msgspec.Meta(ge=0, le=100)]
    capability: ShortText
    outcome: Annotated[str, msgspec.Meta(max_length=128)]
    operation_id: ShortText | None = None


class PlanView(msgspec.Struct, frozen=True, kw_only=True):
    """A frozen plan: answered by its opaque `plan_id` only; `digest` is the sha256 of its
    canonical steps."""

    plan_id: Id
    session_id: Id
    turn: Count
    state: PlanState
    digest: Digest
    steps: list[PlanStep]
    reason: ShortText = ""


class SessionMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of the conversation: the user's message, an injected one, the agent's answer,
    or what Writ itself wrote from a typed outcome (`writ`, no model call)."""

    n: Count  # the event number that recorded it
    turn: Count
    role: Literal["user", "injected", "agent", "writ"]
    text: str


class WaitingFor(msgspec.Struct, frozen=True, kw_only=True):
    """What a session waits for: the model, a person's decision (`pending_id`), a plan's
    approval (`plan_id`), a command's outcome, or a resume."""

    kind: Literal["model", "person", "plan", "outcome", "resume"]
    pending_id: ShortText | None = None
    plan_id: Id | None = None
    message: ShortText = ""


class SessionView(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /sessions/{id}`: where the session stands and its history."""

    session_id: Id
    agent: AgentName
    principal: Principal
    state: SessionState
    plan_mode: bool
    turn: Count  # the last turn started (0: none yet)
    run_id: Id | None = None  # the turn in flight, or the last one
    waiting_for: WaitingFor | None = None
    parent_session_id: Id | None = None
    fork_turn: Count | None = None
    fork_step: Count | None = None
    children: list[Id] = []
    messages: list[SessionMessage] = []
    plans: list[PlanView] = []
    last_event: Count = 0  # the `n` of the session's last durable event


class SessionSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One session of a principal, as `GET /sessions` lists it."""

    session_id: Id
    agent: AgentName
    state: SessionState
    plan_mode: bool
    turn: Count
    parent_session_id: Id | None = None


class SessionList(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /sessions`: the caller's sessions, newest first; `next` is the cursor of the page
    after this one (None: this is the last)."""

    sessions: list[SessionSummary]
    next: Id | None = None


class SessionAccepted(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to a write on a session: where it stands now (`turn`/`run_id`: the turn a
    message started) and where to follow it."""

    session_id: Id
    state: SessionState
    turn: Count = 0
    run_id: Id | None = None
    links: dict[str, str] = {}


class PlanAnswered(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to `POST /plans/{plan_id}/approve|reject`."""

    plan_id: Id
    session_id: Id
    state: PlanState


# --- ingress -> planner (request/reply on SESSION_OPS) ------------------------------------

SessionOpKind = Literal[
    "open",
    "message",
    "get",
    "pause",
    "resume",
    "inject",
    "close",
    "fork",
    "approve_plan",
    "reject_plan",
    "list",
]


class SessionOp(Command, frozen=True):
    """One verified operation on a session, from ingress (tenant and principal from the
    token). `key` is the caller's Idempotency-Key: a write re-sent under it returns the first
    acceptance. `session_id` names the session (for `open`, the new session's id ingress
    derived from the key); `plan_id` the plan of a plan answer."""

    op: SessionOpKind
    tenant: Tenant
    principal: Principal
    key: Id | None = None
    session_id: Id | None = None
    plan_id: Id | None = None
    agent: AgentName | None = None
    plan_mode: bool = False
    text: SessionText | None = None
    reason: ShortText = ""
    turn: Annotated[int, msgspec.Meta(ge=1, le=10_000)] | None = None
    step: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    # A plan answer: the principal holds the tenant's `approver` role (from the token).
    approver: bool = False
    # `list`: the page after this cursor (a session id), of at most `limit` sessions.
    cursor: Id | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=100)] = 50


class SessionReply(msgspec.Struct, frozen=True, kw_only=True):
    """The planner's answer to a `SessionOp`: the view or acceptance, or a stable error code
    (`SESSION_BUSY`, `SESSION_CLOSED`, `INVALID_TRANSITION`, `NOT_FOUND`, `CONFLICT`, ...)."""

    ok: bool
    code: str | None = None
    message: ShortText = ""
    accepted: SessionAccepted | None = None
    view: SessionView | None = None
    plan: PlanAnswered | None = None
    events: SessionEventBatch | None = None
    sessions: SessionList | None = None


# --- the session's events (writ.chat.<tenant>.<session>) ----------------------------------


class SessionEvent(Event, frozen=True):
    """Base of every event of a session's stream."""

    session_id: Id
    n: Count


class SessionOpened(SessionEvent, frozen=True):
    agent: AgentName
    principal: Principal
    plan_mode: bool = False
    parent_session_id: Id | None = None


class UserMessage(SessionEvent, frozen=True):
    turn: Count
    text: str


class TurnStarted(SessionEvent, frozen=True):
    turn: Count
    run_id: Id


class TextDelta(SessionEvent, frozen=True):
    """Model text as it streams, batched (tens a second, not one per token). `n` is 0;
    `attempt` numbers the model call's attempts (from 1); `index` orders deltas within one."""

    turn: Count
    step: Count
    attempt: Count
    index: Count
    text: str


class TextReset(SessionEvent, frozen=True):
    """A model attempt was abandoned and is retried: discard the text of (`turn`, `step`)
    shown so far. `attempt` 0: the step's model call is made again (the planner restarted
    during an earlier one)."""

    turn: Count
    step: Count
    attempt: Count
    reason: ShortText = ""


class CapabilitySelected(SessionEvent, frozen=True):
    turn: Count
    step: Count
    capability: ShortText


class Observed(SessionEvent, frozen=True):
    """A read's (or a refusal's) observation, summarised and bounded: no content."""

    turn: Count
    step: Count
    summary: ShortText


class PlanProposed(SessionEvent, frozen=True):
    turn: Count
    plan: PlanView


class PlanDecided(SessionEvent, frozen=True):
    plan_id: Id
    answer: Literal["approved", "rejected", "superseded"]
    reason: ShortText = ""


class DecisionAsked(SessionEvent, frozen=True):
    """The turn waits for a person (attended: 5 minutes, then deny)."""

    turn: Count
    step: Count
    pending_id: ShortText
    message: ShortText = ""


class DecisionTaken(SessionEvent, frozen=True):
    turn: Count
    step: Count
    pending_id: ShortText
    answer: ShortText


class ProposalMade(SessionEvent, frozen=True):
    turn: Count
    step: Count
    action: ShortText
    proposal_id: Id | None = None
    preview: dict[str, Any] = {}


class StepAdmitted(SessionEvent, frozen=True):
    turn: Count
    step: Count
    operation_id: Id


class StepDispatched(SessionEvent, frozen=True):
    turn: Count
    step: Count
    operation_id: Id


class StepOutcome(SessionEvent, frozen=True):
    """A command's typed outcome, as Writ wrote it into the session (no model call)."""

    turn: Count
    step: Count
    action: ShortText
    state: ShortText
    outcome: ShortText | None = None
    correlation_id: ShortText | None = None
    text: ShortText = ""


class WriterNote(SessionEvent, frozen=True):
    """What Writ wrote into the conversation itself, from a typed outcome or a plan's answer."""

    turn: Count
    text: ShortText


class TurnEnded(SessionEvent, frozen=True):
    turn: Count
    run_id: Id
    status: ShortText  # succeeded | failed | cancelled | rejected
    answer: str | None = None
    code: ShortText | None = None
    correlation_id: ShortText | None = None
    # Under an approved plan: every one of its steps with its outcome.
    plan_steps: list[PlanStepOutcome] | None = None


class SessionPaused(SessionEvent, frozen=True):
    reason: ShortText = ""


class SessionResumed(SessionEvent, frozen=True):
    pass


class SessionInjected(SessionEvent, frozen=True):
    turn: Count
    text: str


class SessionClosed(SessionEvent, frozen=True):
    reason: ShortText = ""


class SessionForked(SessionEvent, frozen=True):
    """Recorded in the parent and in the fork: `fork_session_id` started from
    `parent_session_id` at (`turn`, `step`)."""

    parent_session_id: Id
    fork_session_id: Id
    turn: Count
    step: Count | None = None


class ChildSession(SessionEvent, frozen=True):
    """An agent call in one of the session's turns started a branch run: readable as a child."""

    turn: Count
    child_session_id: Id
    run_id: Id
    agent: AgentName


AnySessionEvent = (
    SessionOpened
    | UserMessage
    | TurnStarted
    | TextDelta
    | TextReset
    | CapabilitySelected
    | Observed
    | PlanProposed
    | PlanDecided
    | DecisionAsked
    | DecisionTaken
    | ProposalMade
    | StepAdmitted
    | StepDispatched
    | StepOutcome
    | WriterNote
    | TurnEnded
    | SessionPaused
    | SessionResumed
    | SessionInjected
    | SessionClosed
    | SessionForked
    | ChildSession
)


class HostSessionOp(Command, frozen=True):
    """A host's operation on a session over NATS (`writ.api.<tenant>.session`): the HTTP
    routes' bodies with the token and, for a write, the Idempotency-Key as `key`. `events`
    reads the session's stream after stream sequence `after` (at most `limit` events).
    Answered with a `SessionReply` (`events`: a `SessionEventBatch`), or a NATS micro error
    ("<CODE>: <detail>")."""

    token: Token
    op: SessionOpKind | Literal["events"]
    key: Id | None = None
    session_id: Id | None = None
    plan_id: Id | None = None
    agent: AgentName | None = None
    plan_mode: bool = False
    text: SessionText | None = None
    reason: ShortText = ""
    turn: Annotated[int, msgspec.Meta(ge=1, le=10_000)] | None = None
    step: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    # A plan answer: the principal holds the tenant's `approver` role (from the token).
    approver: bool = False
    # `list`: the page after this cursor (a session id), of at most `limit` sessions.
    cursor: Id | None = None
    after: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 100


class SequencedEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One event of a session's stream with its stream sequence (SSE's `id`)."""

    seq: Annotated[int, msgspec.Meta(ge=1)]
    event: AnySessionEvent


class SessionEventBatch(msgspec.Struct, frozen=True, kw_only=True):
    """A session's events after a stream sequence, in order; `last` is the last one's
    sequence (the next read's `after`)."""

    session_id: Id
    events: list[SequencedEvent] = []
    last: Annotated[int, msgspec.Meta(ge=0)] = 0
