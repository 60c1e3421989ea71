"""Request/reply with the requester's deadline, so that nobody works for a caller who left.

A caller of a service endpoint waits `timeout` seconds, then gives up (and usually retries).
Without more, a responder that fell behind (frozen, or slow on PostgreSQL) would wake to a
backlog of requests whose callers are gone, spend itself answering them while the retries pile
up behind, and never catch up: metastable overload. So every request carries its deadline, as
an absolute time in a `Writ-Deadline` header, and `libs.runtime`'s endpoints drop a request
past it before doing any work (counted in `writ_requests_dropped_total{service}`).

    reply = await timed_request(nc, subjects.DECIDE, payload, timeout=2.0)  # as nc.request

Clocks: the deadline is wall-clock time (`time.time()`), compared on the responder's host;
Writ's processes share a host or NTP-synchronised ones, and a skew only moves the cut-off.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from nats.aio.client import Client
from nats.aio.msg import Msg

from libs.telemetry import inject_context
from schemas.host_reads import DEADLINE_HEADER

__all__ = ["HEADER", "expired", "timed_request", "with_deadline"]

HEADER = DEADLINE_HEADER  # defined with the host contract: the SDK sends it too


def with_deadline(headers: dict[str, str], timeout: float) -> dict[str, str]:
    """`headers` with the deadline of a request its caller waits `timeout` seconds for."""
    headers[HEADER] = f"{time.time() + timeout:.3f}"
    return headers


async def timed_request(
    nc: Client,
    subject: str,
    payload: bytes,
    *,
    timeout: float,
    headers: Mapping[str, str] | None = None,
) -> Msg:
    """`nc.request`, carrying the current trace context and the caller's deadline."""
    sent = with_deadline(inject_context(dict(headers or {})), timeout)
    return await nc.request(subject, payload, timeout=timeout, headers=sent)


def expired(headers: Mapping[str, str] | None, now: float | None = None) -> bool:
    """Whether a request's requester has given up on it. A request without a deadline (an
    operator's CLI, an older caller) or with one that does not parse never expires."""
    value = (headers or {}).get(HEADER)
    if not value:
        return False
    try:
        deadline = float(value)
    except ValueError:
        return False
    if not math.isfinite(deadline):
        return False
    return (time.time() if now is None else now) > deadline
