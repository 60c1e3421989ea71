"""Chat sessions for hosts on NATS (`writ.api.<tenant>.session`, request/reply): the same token
check, the same Idempotency-Key rule and the same questions to the planner as the HTTP routes
(`_sessions.py`); `events` reads the session's stream after a stream sequence, so a host
resumes exactly as `Last-Event-ID` does over SSE (a host never reads JetStream's chat stream
itself: its permissions could not keep it to its own tenant's sessions)."""

from __future__ import annotations

import logging
from typing import Final

import msgspec
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.micro.request import Request

from libs.runtime import Endpoint
from schemas.host_reads import host_read
from schemas.sessions import (
    CHAT_STREAM,
    HOST_SESSION,
    SESSION_OPS,
    AnySessionEvent,
    HostSessionOp,
    SequencedEvent,
    SessionEventBatch,
    SessionOp,
    SessionReply,
    chat_subject,
)
from services.ingress.http._api import Api
from services.ingress.http._idempotency import fingerprint
from services.ingress.http._nats_reads import answer_host
from services.ingress.http._problems import ApiError
from services.ingress.logic import Rejection

__all__ = ["read_events", "session_endpoint"]

log = logging.getLogger("writ.ingress")
_DECODER: Final = msgspec.json.Decoder(HostSessionOp)
_EVENT: Final = msgspec.json.Decoder(AnySessionEvent)
_ENCODER: Final = msgspec.json.Encoder()
_READS: Final = frozenset({"get", "events", "list"})


async def read_events(
    api: Api, tenant: str, session_id: str, *, after: int, limit: int, wait_s: float = 0.5
) -> SessionEventBatch:
    """The session's events after stream sequence `after` that are there now (at most
    `limit`): read with an ordered consumer until it has nothing pending."""
    config = (
        ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1)
        if after
        else ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    )
    sub = await api.nc.jetstream().subscribe(
        chat_subject(tenant, session_id), stream=CHAT_STREAM, ordered_consumer=True, config=config
    )
    events: list[SequencedEvent] = []
    try:
        while len(events) < limit:
            try:
                msg = await sub.next_msg(timeout=wait_s)
            except (NatsTimeoutError, TimeoutError):
                break  # nothing there (yet)
            events.append(
                SequencedEvent(seq=msg.metadata.sequence.stream, event=_EVENT.decode(msg.data))
            )
            if msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return SessionEventBatch(
        session_id=session_id, events=events, last=events[-1].seq if events else after
    )


async def _answer(api: Api, tenant: str, ask: HostSessionOp) -> bytes:
    checked = api.door.check_token(ask.token, tenant=tenant)
    if isinstance(checked, Rejection):
        raise ApiError(checked.code, checked.message)
    fields = {
        f: getattr(ask, f)
        for f in ask.__struct_fields__
        if f not in ("token", "op", "after", "limit")
    }
    op = SessionOp(
        op="get" if ask.op == "events" else ask.op, tenant=tenant, principal=checked[0], **fields
    )

    async def planner() -> SessionReply:
        reply: SessionReply = await api.ask(SESSION_OPS, op, SessionReply)
        if not reply.ok:
            raise ApiError(reply.code or "INVALID_REQUEST", reply.message)
        return reply

    if ask.op in _READS:
        reply = await planner()  # the caller's session, or NOT_FOUND
        if ask.op == "events":
            assert ask.session_id is not None
            reply = SessionReply(
                ok=True,
                events=await read_events(
                    api, tenant, ask.session_id, after=ask.after, limit=ask.limit
                ),
            )
        return _ENCODER.encode(reply)
    if not ask.key:
        raise ApiError("INVALID_REQUEST", "a write carries its Idempotency-Key as `key`")
    print_ = fingerprint(
        op.principal, f"NATS session {ask.op} {ask.session_id or ask.plan_id or ''}", op
    )
    held = await api.idempotency.claim(tenant, ask.key, print_)
    if held is not None:
        return held.body
    encoded = _ENCODER.encode(await planner())
    await api.idempotency.remember(tenant, ask.key, print_, 200, encoded)
    return encoded


def session_endpoint(api: Api) -> Endpoint:
    """The micro endpoint on `writ.api.*.session`."""

    async def handle(request: Request) -> None:
        await answer_host(
            request,
            "operation on a session",
            lambda tenant: _answer(api, tenant, _DECODER.decode(request.data)),
        )

    return Endpoint("session", host_read("*", HOST_SESSION), handle, concurrency=32)
