"""A consumer's lag, and whether it stalled: work waiting and nothing delivered for a while.

A fetch loop can go quiet with work waiting and nothing failing: a consumer whose leader moved
while the client reconnected, a pull subscription that no longer hears its answers. Each fetch
then ends as an idle one does. `ConsumerWatch` reads the consumer's info every `every_s` (its
lag gauges), and when messages are waiting (`num_pending`) and none was delivered for
`stall_after_s` it calls the consumer stalled: `writ_consumer_stalled_seconds` says for how
long (exported at 0), the process's readiness says so, and the actor loop is asked to bind
its consumer again and pull on a fresh subscription (`rebind`). Deliveries end the stall.
"""

from __future__ import annotations

import logging
import time

import anyio
from nats.js import JetStreamContext
from prometheus_client import Gauge

from libs.health import Health
from libs.telemetry import ActorMetrics

__all__ = ["ConsumerWatch"]

log = logging.getLogger("writ.actor")


class ConsumerWatch:
    """The lag gauges and the stall detector of one durable consumer."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        stream: str,
        durable: str,
        metrics: ActorMetrics,
        health: Health | None,
        every_s: float,
        stall_after_s: float,
    ) -> None:
        self._js, self._stream, self._durable = js, stream, durable
        self._metrics, self._health = metrics, health
        self._every, self._after = max(every_s, 0.1), stall_after_s
        self._stalled: Gauge = metrics.stalled.labels(metrics.service, durable)
        self._stalled.set(0)
        self._last_delivery = time.monotonic()
        self._rebinds = 0
        self.rebind = anyio.Event()  # set: the loop binds again and pulls on a new subscription

    def delivered(self) -> None:
        """A fetch brought messages: the consumer moves."""
        self._last_delivery = time.monotonic()

    def rebound(self) -> None:
        """The loop bound the consumer again; the next stall asks anew."""
        self.rebind = anyio.Event()
        self._last_delivery = time.monotonic()

    def observe(self, num_pending: int) -> float:
        """Record what the consumer's info said; returns how long it has been stalled (0 when
        it is not)."""
        quiet = time.monotonic() - self._last_delivery
        stalled = quiet if num_pending > 0 and quiet >= self._after else 0.0
        self._stalled.set(round(stalled, 1))
        if self._health is not None:
            self._health.consumer_stalled(self._durable, stalled, num_pending)
        if stalled and not self.rebind.is_set():
            self._rebinds += 1
            log.warning(
                "%s: %d messages waiting and none delivered for %.0f s: binding the consumer "
                "again (%d)",
                self._durable,
                num_pending,
                stalled,
                self._rebinds,
            )
            self.rebind.set()
        return stalled

    async def run(self, scope: anyio.CancelScope) -> None:
        """Refresh the gauges now and every `every_s`, until `scope` ends."""
        consumer = self._durable
        with scope:
            while True:
                try:
                    with anyio.fail_after(max(self._every, 1.0)):
                        info = await self._js.consumer_info(self._stream, consumer)
                except Exception as exc:  # the bus away for a moment: keep the last values
                    log.debug("%s: reading consumer info failed: %r", consumer, exc)
                else:
                    self._metrics.pending.labels(consumer).set(info.num_pending or 0)
                    self._metrics.ack_pending.labels(consumer).set(info.num_ack_pending or 0)
                    self.observe(info.num_pending or 0)
                await anyio.sleep(self._every)
