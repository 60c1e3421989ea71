"""How `libs.actor` settles a delivery: ack, nak with backoff, dead-letter or leave alone, by
what its handling raised (the mapping `libs/actor.py` describes)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from libs.bus import ConsumerSpec
from libs.errors import Fenced, PermanentError, RetryableError, waits_out
from libs.telemetry import ActorMetrics, inject_context
from schemas.subjects import dead_letter

if TYPE_CHECKING:
    from libs.actor import Delivery

log = logging.getLogger("writ.actor")


def _backoff(num_delivered: int, spec: ConsumerSpec) -> float:
    return float(min(0.25 * 2 ** min(max(num_delivered - 1, 0), 16), spec.backoff_max_s))


def _age_s(msg: Msg) -> float:
    """Seconds since the message was stored in its stream."""
    return max(time.time() - msg.metadata.timestamp.timestamp(), 0.0)


def _exhausted(msg: Msg, spec: ConsumerSpec) -> bool:
    """Delivered past both limits and then some: nothing will handle it any more.

    A delivery waiting out an outage comes back within `backoff_max_s` of its last failure (or
    `ack_wait_s` if its nak was lost), so one that outlives the outage limit is handled at least
    once past it, fails again and is dead-lettered as `outage_exhausted`, which pages. Only a
    delivery that never settles at all (its handler kills the process every time) is still
    undecided that long after the limit, and is dead-lettered here, before it is handled again.
    """
    grace = spec.backoff_max_s + spec.ack_wait_s
    return (
        msg.metadata.num_delivered > spec.max_deliver and _age_s(msg) >= spec.outage_limit_s + grace
    )


async def _crashed(
    msgs: list[Msg], exc: Exception, *, spec: ConsumerSpec, metrics: ActorMetrics
) -> None:
    """The handling itself failed (not the handler): the loop goes on, the deliveries come
    back later (a message that keeps doing this ends in the dead-letter stream)."""
    log.error("%s: handling %d deliveries failed: %r", spec.durable, len(msgs), exc, exc_info=exc)
    metrics.failed.labels(spec.durable, "crashed").inc(len(msgs))
    for msg in msgs:
        try:
            delay = _backoff(msg.metadata.num_delivered, spec)
        except Exception:  # not even its metadata reads: the ack wait brings it back
            continue
        await _settle(msg.nak(delay=delay))


async def _settle_result(
    delivery: Delivery[Any],
    error: BaseException | None,
    *,
    js: JetStreamContext,
    spec: ConsumerSpec,
    metrics: ActorMetrics,
    ack_sync: bool,
    started: float,
) -> None:
    """Ack, nak, dead-letter or leave alone one delivery, by what its handling raised."""
    consumer, msg = spec.durable, delivery.msg
    if isinstance(error, Fenced):
        metrics.failed.labels(consumer, "fenced").inc()
        log.info("%s: fenced on %s, leaving the delivery alone", consumer, error.operation_id)
        return
    if isinstance(error, (msgspec.DecodeError, PermanentError)):
        metrics.failed.labels(consumer, "permanent").inc()
        await _dead_letter(js, msg, metrics, consumer, f"{type(error).__name__}: {error}")
        return
    if error is not None:
        if not isinstance(error, Exception):
            raise error  # cancellation and the like are never swallowed
        waiting = waits_out(error)
        if delivery.num_delivered >= spec.max_deliver:
            age = _age_s(msg)
            if not waiting:
                metrics.failed.labels(consumer, "exhausted").inc()
                await _dead_letter(
                    js,
                    msg,
                    metrics,
                    consumer,
                    f"exhausted {spec.max_deliver} deliveries: {error!r}",
                )
                return
            if age >= spec.outage_limit_s:
                metrics.failed.labels(consumer, "outage_exhausted").inc()
                await _dead_letter(
                    js,
                    msg,
                    metrics,
                    consumer,
                    f"still unavailable after {age:.0f} s "
                    f"({delivery.num_delivered} deliveries): {error!r}",
                )
                return
        metrics.failed.labels(consumer, "retry").inc()
        if waiting:
            metrics.waiting.labels(consumer).inc()
            log.info(
                "%s: waiting for a dependency (delivery %d): %r",
                consumer,
                delivery.num_delivered,
                error,
            )
        else:
            log.warning("%s: handler failed, will retry: %r", consumer, error)
        delay = _backoff(delivery.num_delivered, spec)
        if isinstance(error, RetryableError) and error.delay is not None:
            # The error's own delay (a lease's remaining time, a cooldown) first; a long
            # outage still backs off.
            delay = (
                error.delay
                if delivery.num_delivered < spec.max_deliver
                else max(error.delay, delay)
            )
        await _settle(msg.nak(delay=delay))
        return
    if ack_sync:
        await _settle(msg.ack_sync())
    else:
        await _settle(msg.ack())
    metrics.handled.labels(consumer).inc()
    metrics.latency.labels(consumer).observe(time.perf_counter() - started)


async def _settle(op: Awaitable[Any]) -> None:
    # Losing an ack/nak is harmless: the message is redelivered and handlers are idempotent.
    try:
        await op
    except Exception as exc:
        log.debug("ack/nak/progress lost: %r", exc)


async def _dead_letter(
    js: JetStreamContext, msg: Msg, metrics: ActorMetrics, consumer: str, reason: str
) -> None:
    headers = inject_context(
        {
            "Writ-Dlq-Reason": reason[:1000],
            "Writ-Dlq-Subject": msg.subject,
            "Writ-Dlq-Stream-Seq": str(msg.metadata.sequence.stream),
            "Nats-Msg-Id": f"dlq:{consumer}:{msg.metadata.sequence.stream}",
        }
    )
    # The dead letter is published before term(): if publishing fails, the message is retried
    # rather than lost.
    try:
        ack = await js.publish(dead_letter(consumer), msg.data, headers=headers)
    except Exception as exc:
        log.error("%s: dead-lettering failed, will retry: %r", consumer, exc)
        await _settle(msg.nak(delay=1.0))
        return
    if not ack.duplicate:  # an earlier try published it and only its term() was lost
        metrics.dead_lettered.labels(consumer).inc()
    log.warning(
        "%s: dead-lettered stream seq %s: %s", consumer, msg.metadata.sequence.stream, reason
    )
    await _settle(msg.term())
