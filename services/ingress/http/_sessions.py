"""`/sessions` and `/plans`: chat sessions (docs/design.md §10), owned by the planner.

Each write is authenticated by its token alone (tenant and principal come from it, never
from the body), answered once per Idempotency-Key, and handed to the planner as a `SessionOp`
(request/reply on `writ.int.planner.session`). The planner's refusal codes come back as
problem documents (`SESSION_BUSY`, `SESSION_CLOSED`, `SESSION_PAUSED`, `INVALID_TRANSITION`:
409). `GET /sessions/{id}/events` streams the session's JetStream subject as Server-Sent
Events whose `id` is the stream sequence, so `Last-Event-ID` resumes exactly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Final, cast

import msgspec
from litestar import Request, Response, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ConsumerConfig, DeliverPolicy

from schemas.sessions import (
    CHAT_STREAM,
    SESSION_OPS,
    ForkBody,
    InjectBody,
    MessageBody,
    OpenSession,
    PlanAnswered,
    PlanBody,
    SessionAccepted,
    SessionList,
    SessionOp,
    SessionOpKind,
    SessionReply,
    SessionView,
    chat_subject,
)
from services.ingress.http._api import Api, Caller
from services.ingress.http._problems import (
    ApiError,
    IdempotencyKey,
    LastEventId,
    event_id,
    problems,
)
from services.ingress.logic import APPROVER_ROLE

__all__ = ["session_handlers"]

_TAG: Final = msgspec.json.Decoder(dict[str, Any])
_AUTH: Final = "UNAUTHENTICATED, UNKNOWN_TENANT, BAD_SIGNATURE, TOKEN_EXPIRED or INVALID_TOKEN"
_WRITE_ERRORS: Final = problems(
    s401=_AUTH,
    s404="NOT_FOUND: no such session of the caller",
    s409="SESSION_BUSY (a turn is in flight: nothing applied), SESSION_PAUSED, "
    "SESSION_CLOSED, INVALID_TRANSITION, PLAN_ANSWERED (the plan was approved or "
    "rejected already), or CONFLICT (the Idempotency-Key was used with another body)",
    s413="TOO_LARGE",
)


class _NoBody(msgspec.Struct, frozen=True):
    """A POST without a body: its route alone is its fingerprint."""


def session_handlers(api: Api, *, keepalive_s: float = 15.0) -> list[HTTPRouteHandler]:
    """The session and plan routes over `api`."""

    async def _ask(op: SessionOp) -> SessionReply:
        reply: SessionReply = await api.ask(SESSION_OPS, op, SessionReply)
        if not reply.ok:
            raise ApiError(reply.code or "INVALID_REQUEST", reply.message)
        return reply

    def _op(caller: Caller, op: str, **fields: Any) -> SessionOp:
        return SessionOp(
            op=cast(SessionOpKind, op),  # the routes name only kinds it lists
            tenant=caller.tenant,
            principal=caller.principal,
            **fields,
        )

    async def _write(
        request: Request[Any, Any, Any],
        body: msgspec.Struct,
        op: str,
        status: int,
        **fields: Any,
    ) -> Response[Any]:
        caller = api.caller(request)
        key = request.headers.get("idempotency-key", "")

        if op.endswith("_plan"):  # a tenant's approver may answer any of its plans
            fields["approver"] = APPROVER_ROLE in caller.roles

        async def answer() -> tuple[int, msgspec.Struct]:
            reply = await _ask(_op(caller, op, key=key, **fields))
            if reply.plan is not None:
                return status, reply.plan
            assert reply.accepted is not None
            return status, reply.accepted

        return await api.write(request, caller=caller, body=body, answer=answer)

    @post(
        "/sessions",
        status_code=201,
        summary="Open a chat session",
        tags=["sessions"],
        responses=_WRITE_ERRORS,
    )
    async def open_session(
        request: Request[Any, Any, Any],
        data: JSONBody[OpenSession],
        idempotency_key: IdempotencyKey,
    ) -> Response[SessionAccepted]:
        """A conversation of the token's principal with one agent; the same key opens the
        same session."""
        return await _write(request, data, "open", 201, agent=data.agent, plan_mode=data.plan_mode)

    @post(
        "/sessions/{session_id:str}/messages",
        status_code=202,
        summary="Send a message",
        tags=["sessions"],
        responses=_WRITE_ERRORS,
    )
    async def send(
        request: Request[Any, Any, Any],
        session_id: FromPath[str],
        data: JSONBody[MessageBody],
        idempotency_key: IdempotencyKey,
    ) -> Response[SessionAccepted]:
        """Starts a turn on an `active` session (it is `processing` until the turn ends); a
        second message meanwhile is `409 SESSION_BUSY` and changes nothing."""
        return await _write(request, data, "message", 202, session_id=session_id, text=data.text)

    @get(
        "/sessions",
        summary="The caller's sessions",
        tags=["sessions"],
        responses=problems(s401=_AUTH),
    )
    async def list_sessions(
        request: Request[Any, Any, Any],
        cursor: Annotated[str | None, QueryParameter(max_length=128)] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=100)] = 50,
    ) -> SessionList:
        """The token's principal's sessions, newest first (not the child sessions of agent
        calls), a page at a time: `next` is the `cursor` of the page after."""
        caller = api.caller(request)
        reply = await _ask(_op(caller, "list", cursor=cursor, limit=limit))
        assert reply.sessions is not None
        return reply.sessions

    @get(
        "/sessions/{session_id:str}",
        summary="A session and its history",
        tags=["sessions"],
        responses=problems(s401=_AUTH, s404="NOT_FOUND: no such session of the caller"),
    )
    async def view(request: Request[Any, Any, Any], session_id: FromPath[str]) -> SessionView:
        """State, what it waits for, the conversation, forks and children."""
        caller = api.caller(request)
        reply = await _ask(_op(caller, "get", session_id=session_id))
        assert reply.view is not None
        return reply.view

    def _simple(name: str, summary: str, doc: str) -> HTTPRouteHandler:
        async def handler(
            request: Request[Any, Any, Any],
            session_id: FromPath[str],
            idempotency_key: IdempotencyKey,
        ) -> Response[SessionAccepted]:
            return await _write(request, _NoBody(), name, 202, session_id=session_id)

        handler.__doc__ = doc
        handler.__name__ = f"{name}_session"
        return post(
            f"/sessions/{{session_id:str}}/{name}",
            status_code=202,
            summary=summary,
            tags=["sessions"],
            responses=_WRITE_ERRORS,
        )(handler)

    pause = _simple(
        "pause",
        "Pause a session",
        "The turn stops before its next model decision (a call in flight "
        "completes and is recorded); durable across restarts.",
    )
    resume = _simple(
        "resume", "Resume a paused session", "The turn goes on from its recorded step."
    )
    close = _simple(
        "close",
        "Close a session",
        "Terminal: the turn in flight is cancelled (an admitted command runs to "
        "its recorded outcome); the history stays readable.",
    )

    @post(
        "/sessions/{session_id:str}/inject",
        status_code=202,
        summary="Inject a message",
        tags=["sessions"],
        responses=_WRITE_ERRORS,
    )
    async def inject(
        request: Request[Any, Any, Any],
        session_id: FromPath[str],
        data: JSONBody[InjectBody],
        idempotency_key: IdempotencyKey,
    ) -> Response[SessionAccepted]:
        """A user message the model sees at its next decision, marked as injected."""
        return await _write(request, data, "inject", 202, session_id=session_id, text=data.text)

    @post(
        "/sessions/{session_id:str}/fork",
        status_code=201,
        summary="Fork a session",
        tags=["sessions"],
        responses=_WRITE_ERRORS,
    )
    async def fork(
        request: Request[Any, Any, Any],
        session_id: FromPath[str],
        data: JSONBody[ForkBody],
        idempotency_key: IdempotencyKey,
    ) -> Response[SessionAccepted]:
        """A new session whose history is this one's up to a recorded turn (or step): what
        the parent committed is history there, never executed again."""
        return await _write(
            request, data, "fork", 201, session_id=session_id, turn=data.turn, step=data.step
        )

    def _plan(answer: str) -> HTTPRouteHandler:
        async def handler(
            request: Request[Any, Any, Any],
            plan_id: FromPath[str],
            idempotency_key: IdempotencyKey,
            data: JSONBody[PlanBody | None] = None,
        ) -> Response[PlanAnswered]:
            body = data if data is not None else PlanBody()  # no body: no reason given
            return await _write(
                request, body, f"{answer}_plan", 200, plan_id=plan_id, reason=body.reason
            )

        handler.__doc__ = (
            f"{answer.capitalize()} a proposed plan by its id only. Approving "
            "is consent to proceed, not an authorisation: every call of every "
            "step is still decided where it is made."
        )
        handler.__name__ = f"{answer}_plan"
        return post(
            f"/plans/{{plan_id:str}}/{answer}",
            status_code=200,
            summary=f"{answer.capitalize()} a plan",
            tags=["sessions"],
            responses=_WRITE_ERRORS,
        )(handler)

    @get(
        "/sessions/{session_id:str}/events",
        summary="A session's events (Server-Sent Events)",
        tags=["sessions"],
        media_type="text/event-stream",
        responses=problems(s401=_AUTH, s404="NOT_FOUND: no such session of the caller"),
    )
    async def events(
        request: Request[Any, Any, Any],
        session_id: FromPath[str],
        last_event_id: LastEventId = None,
        after: Annotated[int | None, QueryParameter(ge=0)] = None,
    ) -> ServerSentEvent:
        """Each event as `event: <type>` with `id:` its stream sequence and the event (with
        its number `n` in the session) as data; `Last-Event-ID` (or `after`) resumes right
        after that event: no gap, no duplicate."""
        caller = api.caller(request)
        await _ask(_op(caller, "get", session_id=session_id))  # the caller's, or 404
        resumed = event_id(last_event_id, least=0)
        start = resumed if resumed is not None else (after or 0)
        js = api.nc.jetstream()
        config = (
            ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start + 1)
            if start
            else ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
        )
        sub = await js.subscribe(
            chat_subject(caller.tenant, session_id),
            stream=CHAT_STREAM,
            ordered_consumer=True,
            config=config,
            idle_heartbeat=5.0,
        )

        async def stream() -> AsyncIterator[ServerSentEventMessage]:
            try:
                while True:
                    try:
                        msg = await sub.next_msg(timeout=keepalive_s)
                    except (NatsTimeoutError, TimeoutError):
                        yield ServerSentEventMessage(comment="keep-alive")
                        continue
                    kind = str(_TAG.decode(msg.data).get("type", "event"))
                    yield ServerSentEventMessage(
                        data=msg.data.decode(), event=kind, id=msg.metadata.sequence.stream
                    )
            finally:
                await sub.unsubscribe()

        return ServerSentEvent(stream(), headers={"Cache-Control": "no-store"})

    return [
        open_session,
        send,
        list_sessions,
        view,
        pause,
        resume,
        close,
        inject,
        fork,
        events,
        _plan("approve"),
        _plan("reject"),
    ]
