"""Governance's `decide` from the caller's side (admission, the dispatcher's re-check,
retrieval's reads, the planner's agent calls): one request/reply, and no answer is never an
allow.

    decision = await decide(nc, DecideRequest(...), timeout=2.0)  # DecideUnavailable: retry
    decisions = await decide_batch(nc, [DecideRequest(...), ...], timeout=2.0)  # same order
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from libs.deadline import timed_request
from libs.errors import RetryableError
from schemas import subjects
from schemas.governance import DecideBatch, DecideRequest, Decision, Decisions

__all__ = ["DecideUnavailable", "decide", "decide_batch"]

_ENCODER: Final = msgspec.json.Encoder()
_DECISION: Final = msgspec.json.Decoder(Decision)
_DECISIONS: Final = msgspec.json.Decoder(Decisions)


class DecideUnavailable(RetryableError):
    """Governance gave no usable answer (none in time, an error, or one that does not decode):
    whether the call is allowed is not known, so it is not allowed now."""


async def decide(nc: Client, ask: DecideRequest, *, timeout: float) -> Decision:
    """Governance's decision on one call, in the caller's trace."""
    return await _request(nc, subjects.DECIDE, ask, timeout)  # type: ignore[no-any-return]


async def decide_batch(nc: Client, asks: list[DecideRequest], *, timeout: float) -> list[Decision]:
    """Governance's decisions on several calls (at most `MAX_DECIDE_BATCH`), in order, in one
    request/reply: each decided as `decide` would."""
    answer: Decisions = await _request(
        nc, subjects.DECIDE_BATCH, DecideBatch(requests=asks), timeout, decoder=_DECISIONS
    )
    if len(answer.decisions) != len(asks):
        raise DecideUnavailable(f"{len(answer.decisions)} decisions for {len(asks)} calls")
    return answer.decisions


async def _request(
    nc: Client,
    subject: str,
    ask: msgspec.Struct,
    timeout: float,
    decoder: msgspec.json.Decoder[Any] = _DECISION,
) -> Any:
    try:
        reply = await timed_request(nc, subject, _ENCODER.encode(ask), timeout=timeout)
    except (NatsTimeoutError, NoRespondersError) as exc:
        raise DecideUnavailable(
            f"governance did not answer: {type(exc).__name__}", delay=1.0
        ) from exc
    if reply.headers and reply.headers.get("Nats-Service-Error-Code"):
        raise DecideUnavailable(
            f"governance error: {reply.headers.get('Nats-Service-Error')}"[:500]
        )
    try:
        return decoder.decode(reply.data)
    except msgspec.DecodeError as exc:
        raise DecideUnavailable("governance's answer did not decode") from exc
