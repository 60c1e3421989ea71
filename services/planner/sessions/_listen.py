"""Core-NATS progress a session's planner hears (no stream: one lost is no loss, something
durable records the same later), decoded and kept to each tenant's own subject."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
from nats.aio.client import Client

__all__ = ["listen"]

log = logging.getLogger("writ.planner.sessions")


async def listen(
    nc: Client,
    pattern: str,
    decoder: msgspec.json.Decoder[Any],
    subject_of: Callable[[str], str],
    handle: Callable[[Any], Awaitable[None]],
    *,
    queue: str = "",
) -> None:
    """Hand each message on `pattern` to `handle`, decoded, until cancelled; a message that
    does not decode, or came on another subject than its tenant's own (`subject_of(tenant)`),
    is skipped."""
    sub = await nc.subscribe(pattern, queue=queue)
    try:
        async for msg in sub.messages:
            try:
                event = decoder.decode(msg.data)
            except msgspec.DecodeError as exc:
                log.warning("%s: a message that does not decode: %r", pattern, exc)
                continue
            if msg.subject == subject_of(event.tenant):
                await handle(event)
    finally:
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await sub.unsubscribe()  # (the connection may be closing already)
