"""Pull requests that cannot be mistaken for one another: what the actor loop fetches with.

nats-py's `PullSubscription.fetch` sends every pull request of a subscription with the same
reply subject. The server expires a request 100 µs before the client's own timeout, so on an
idle consumer the request's `408` often arrives just after the client gave up on it: the next
fetch takes that stale `408` for its own answer and sends a second, lingering request (no
`no_wait`). That request outlives the fetch that sent it; when a message finally comes, the
server hands it to this orphan, which (lingering) is not ended after it, and the fetch that
receives the message waits for "the rest of its batch" until the orphan expires: up to a
second on a consumer that was idle. Measured on a fresh deployment: one lone run in a few took
300-750 ms instead of 45, held in one service's fetch (docs/benchmarks.md).

`Puller` gives each request its own reply subject under one subscription. A status (404, 408,
409) ends only the request it answers; a stale one is ignored. A message is a message whichever
request it came on: it goes to the fetch under way, or waits for the next, so none is held for
another request's expiry.
"""

from __future__ import annotations

import json
import time

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeoutError

__all__ = ["PullError", "Puller"]

# After the first message, how long a fetch waits for its request to end (the server ends a
# `no_wait` request at once when nothing more is pending, but not while the consumer is at
# its max_ack_pending): the batch so far is returned then, the request's later messages go to
# the next fetch.
_SETTLE_S = 0.05
_HEARTBEAT = "100"
_ENDED = ("404", "408")  # no messages / expired: anything else is a refusal (409, 503...)


class PullError(Exception):
    """The server refused this pull request: a 409 (too many requests waiting, a leader
    changing...) or a 503 (no consumer answers: it was deleted)."""


class Puller:
    """Fetches from one durable pull consumer, each request on its own reply subject."""

    def __init__(self, nc: Client, stream: str, durable: str) -> None:
        self._nc = nc
        self._next = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._prefix = ""
        self._sub: Subscription | None = None
        self._seq = 0

    async def start(self) -> None:
        """Subscribe to this puller's reply subjects (one inbox, one token per request)."""
        self._prefix = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(f"{self._prefix}.*")

    async def stop(self) -> None:
        """Unsubscribe; requests still open on the server expire there."""
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        """Up to `batch` messages: those already delivered, else what one request (`no_wait`,
        expiring after `timeout`) brings; [] if it brought none.

        Raises:
            nats.errors.TimeoutError: no answer at all within `timeout` (the bus away).
            PullError: the server refused the request.
        """
        assert self._sub is not None, "start() first"
        msgs: list[Msg] = []
        while self._sub.pending_msgs and len(msgs) < batch:  # delivered to an earlier request
            if (msg := await self._sub.next_msg()).reply:
                msgs.append(msg)
        if msgs:
            return msgs
        self._seq += 1
        reply = f"{self._prefix}.{self._seq}"
        request = {"batch": batch, "expires": int(timeout * 1e9), "no_wait": True}
        await self._nc.publish(self._next, json.dumps(request).encode(), reply=reply)
        # The server answers by `timeout` (a 408 if nothing came): a little longer here, so its
        # answer, not this side's clock, ends an idle request.
        deadline = time.monotonic() + timeout + 0.25
        while len(msgs) < batch:
            wait = deadline - time.monotonic()
            if msgs:
                wait = min(wait, _SETTLE_S)
            try:
                msg = await self._sub.next_msg(timeout=max(wait, 0.001))
            except NatsTimeoutError:
                if msgs:
                    return msgs
                raise
            if msg.reply:  # a delivery (its ack subject), whichever request it came on
                msgs.append(msg)
                continue
            # A status: the server's own (a delivery's headers are the publisher's, and may
            # say anything). Only this request's ends this fetch.
            status = (msg.headers or {}).get("Status", "")
            if msg.subject != reply or status == _HEARTBEAT:
                continue
            if status in _ENDED or msgs:
                return msgs  # this request is over
            raise PullError(f"{status} {(msg.headers or {}).get('Description', '')}".strip())
        return msgs
