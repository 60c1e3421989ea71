"""The actor loop: pull-consume an inbox, decode, handle, then ack / nak / term.

`run_actor` is the only place that maps errors to what happens to a message:

- undecodable (`msgspec.DecodeError`) or `PermanentError`: dead-letter with the reason, `term()`;
- `Fenced`: nothing at all (the lease belongs to another worker; a stale ack would settle its
  delivery, because JetStream matches acks by stream sequence only);
- `RetryableError`, or a dependency unavailable (`libs.errors.waits_out`: a Writ service not
  answering, NATS or PostgreSQL away): `nak` with backoff (capped at the consumer's
  `backoff_max_s`, 30 s unless `WRIT_RETRY_BACKOFF_MAX_S` says otherwise) for as long as the
  outage lasts, up to the consumer's `outage_limit_s` (15 minutes from when the message was
  stored; counted in `writ_messages_waiting_total{service}`), then dead-letter;
- anything else, of any type: `nak` with backoff until the consumer's `max_deliver` is
  reached, then dead-letter (a poison message).

Nothing a message does stops the loop: an error escaping the handling itself (not the
handler: the settling, the tracing) is logged, counted (`outcome="crashed"`) and the delivery
nak'ed, and the loop goes on. A message delivered past both limits (a handler that kills its
process every time) is dead-lettered before it is handled again.

Alongside the loop a small task reads the consumer's info every `lag_every_s` and sets its lag
gauges (not yet delivered, delivered but unacked); failing to read it changes nothing else.

While a handler runs, `in_progress()` is sent every third of `ack_wait` so a long handler keeps
its delivery; the heartbeat stops the moment the handler ends or is fenced. A handler whose
progress must be conditioned on something else (the dispatcher's fenced lease) turns the
heartbeat off and calls `Delivery.progress()` itself.

Readiness: given the process's `Health`, the loop fetches only while NATS and PostgreSQL pass
their checks (a handler failing makes it check at once), beats for `/livez` each time round,
and reports its consumer bound for `/readyz`.

Batches: given a `batch_handler`, the loop hands each fetched batch (up to `batch_size`
decoded deliveries) to it in one call, so a service can commit the whole batch in one
transaction. It answers one result per delivery, in order: None (done: acked after it
returns, so after its commit), or the exception that delivery alone failed with, mapped as
above (a `Fenced` delivery is left alone, a `RetryableError` nak'ed...). If the batch handler
itself raises, nothing of the batch was done as a batch: the loop falls back to `handler`, one
delivery at a time, so a poison message fails alone instead of failing its batch forever.
`concurrency` then bounds the batches in flight.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import anyio
import msgspec
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Tracer

from libs.bus import ConsumerSpec, ensure_consumer
from libs.errors import Fenced, PermanentError, RetryableError, single_error, waits_out
from libs.health import Health
from libs.pull import Puller
from libs.telemetry import ActorMetrics, extract_context, inject_context
from schemas.subjects import dead_letter

__all__ = ["Delivery", "run_actor"]

T = TypeVar("T")
log = logging.getLogger("writ.actor")


class Delivery(Generic[T]):
    """One delivered message and what a handler may know about it."""

    __slots__ = ("headers", "message", "msg", "num_delivered", "span", "subject")

    def __init__(self, msg: Msg, message: T) -> None:
        # In a batch: this delivery's own handle span, in its publisher's trace (not current:
        # the batch handler enters it, `trace.use_span(d.span)`, for the work done for it).
        self.span: trace.Span = trace.INVALID_SPAN
        self.msg = msg
        self.message = message
        self.subject = msg.subject
        self.headers: dict[str, str] = dict(msg.headers or {})
        self.num_delivered = int(msg.metadata.num_delivered)

    async def progress(self) -> None:
        """Tell JetStream the handler is still working (resets the delivery's ack timer)."""
        await _settle(self.msg.in_progress())


Handler = Callable[[Delivery[Any]], Awaitable[None]]
# One result per delivery, in order: None (acked), or the exception that delivery failed with.
BatchHandler = Callable[[list[Delivery[Any]]], Awaitable[Sequence[BaseException | None]]]


def _backoff(num_delivered: int, spec: ConsumerSpec) -> float:
    return float(min(0.25 * 2 ** min(max(num_delivered - 1, 0), 16), spec.backoff_max_s))


def _age_s(msg: Msg) -> float:
    """Seconds since the message was stored in its stream."""
    return max(time.time() - msg.metadata.timestamp.timestamp(), 0.0)


def _exhausted(msg: Msg, spec: ConsumerSpec) -> bool:
    """Delivered past both limits: nothing will handle it any more."""
    return msg.metadata.num_delivered > spec.max_deliver and _age_s(msg) >= spec.outage_limit_s


async def run_actor(
    *,
    js: JetStreamContext,
    spec: ConsumerSpec,
    decoder: msgspec.json.Decoder[Any] | None,
    handler: Handler,
    metrics: ActorMetrics,
    tracer: Tracer | None = None,
    stopping: anyio.Event | None = None,
    concurrency: int = 16,
    ack_sync: bool = False,
    heartbeat: bool = True,
    lag_every_s: float = 5.0,
    batch_handler: BatchHandler | None = None,
    batch_size: int = 64,
    health: Health | None = None,
    backoff_max_s: float | None = None,
    fetch_timeout_s: float = 1.0,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Consume `spec`'s durable consumer until cancelled or `stopping` is set.

    When `stopping` is set the loop fetches nothing more and returns once the handlers in
    flight have finished: that is the graceful drain a SIGTERM asks for.
    """
    if backoff_max_s is not None:  # the process's setting over the consumer's default
        spec = msgspec.structs.replace(spec, backoff_max_s=backoff_max_s)
    await ensure_consumer(js, spec)
    # Each pull request on its own reply subject (libs/pull.py: nats-py's `fetch` can leave a
    # request behind that holds a later message for up to `fetch_timeout_s`).
    sub = Puller(js._nc, spec.stream, spec.durable)
    await sub.start()
    if health is not None:
        handler, batch_handler = _suspecting(health, handler, batch_handler)
        health.consumer_bound(spec.stream, spec.durable)
    tracer = tracer or trace.get_tracer("writ.actor")
    slots = anyio.Semaphore(concurrency)
    stopping = stopping or anyio.Event()
    # Every consumer is on the dashboard from the start (rate() needs the zero too).
    metrics.redelivered.labels(spec.durable)
    metrics.waiting.labels(spec.durable)
    metrics.dead_lettered.labels(spec.durable)
    task_status.started()

    async def process(msg: Msg) -> None:
        try:
            await _process(
                msg,
                js=js,
                spec=spec,
                decoder=decoder,
                handler=handler,
                metrics=metrics,
                tracer=tracer,
                ack_sync=ack_sync,
                heartbeat=heartbeat,
            )
        except Exception as exc:
            await _crashed([msg], exc, spec=spec, metrics=metrics)
        finally:
            slots.release()

    async def process_batch(msgs: list[Msg]) -> None:
        assert batch_handler is not None
        try:
            await _process_batch(
                msgs,
                js=js,
                spec=spec,
                decoder=decoder,
                handler=handler,
                batch_handler=batch_handler,
                metrics=metrics,
                tracer=tracer,
                ack_sync=ack_sync,
                heartbeat=heartbeat,
            )
        except Exception as exc:
            await _crashed(msgs, exc, spec=spec, metrics=metrics)
        finally:
            slots.release()

    try:
        async with anyio.create_task_group() as tg:
            # Watching the lag stops with the fetching; the handlers in flight still finish.
            watching = anyio.CancelScope()
            tg.start_soon(_watch_lag, js, spec, metrics, lag_every_s, watching)
            while not stopping.is_set():
                if health is not None:
                    # Not ready: fetch nothing, so an outage burns no deliveries.
                    await health.wait_dependencies(spec.durable, stopping)
                    await _acquire_beating(slots, health, spec.durable)
                else:
                    await slots.acquire()
                if stopping.is_set():  # set while every slot was busy: fetch nothing more
                    slots.release()
                    break
                free = batch_size if batch_handler is not None else slots.value + 1
                try:
                    msgs = await sub.fetch(free, timeout=fetch_timeout_s)
                except (NatsTimeoutError, TimeoutError):
                    # An idle inbox; nats-py raises either its own or the builtin timeout.
                    slots.release()
                    continue
                except Exception as exc:  # connection trouble: wait for the client to reconnect
                    slots.release()
                    log.warning("fetch on %s failed: %r", spec.durable, exc)
                    await anyio.sleep(0.5)
                    continue
                if not msgs:
                    # The request ended (its 408) with nothing: an idle inbox, as a timeout
                    # is. The slot is free again (kept, it leaked, and a long idle spell left
                    # the actor one delivery at a time).
                    slots.release()
                    continue
                if batch_handler is not None:  # one slot per batch
                    tg.start_soon(process_batch, msgs)
                    continue
                # One slot is held already; take one more for every extra message.
                for index, msg in enumerate(msgs):
                    if index:
                        await slots.acquire()
                    tg.start_soon(process, msg)
            watching.cancel()
    finally:
        if health is not None:
            health.loop_ended(spec.durable)
        with anyio.CancelScope(shield=True):
            await sub.stop()


async def _acquire_beating(slots: anyio.Semaphore, health: Health, durable: str) -> None:
    """Take a slot; every second spent waiting for one is still the loop alive."""
    while True:
        health.beat(durable)
        with anyio.move_on_after(1.0):
            await slots.acquire()
            return


def _suspecting(
    health: Health, handler: Handler, batch_handler: BatchHandler | None
) -> tuple[Handler, BatchHandler | None]:
    """The handlers, telling `health` to check the dependencies when one fails."""

    async def one(delivery: Delivery[Any]) -> None:
        try:
            await handler(delivery)
        except Exception:
            health.suspect()
            raise

    if batch_handler is None:
        return one, None
    inner = batch_handler

    async def batch(deliveries: list[Delivery[Any]]) -> Sequence[BaseException | None]:
        try:
            results = await inner(deliveries)
        except Exception:
            health.suspect()
            raise
        if any(result is not None for result in results):
            health.suspect()
        return results

    return one, batch


async def _watch_lag(
    js: JetStreamContext,
    spec: ConsumerSpec,
    metrics: ActorMetrics,
    every: float,
    scope: anyio.CancelScope,
) -> None:
    """Refresh the consumer's lag gauges now and every `every` seconds, until `scope` ends."""
    consumer = spec.durable
    with scope:
        while True:
            try:
                with anyio.fail_after(max(every, 1.0)):
                    info = await js.consumer_info(spec.stream, consumer)
            except Exception as exc:  # the bus away for a moment: keep the last values
                log.debug("%s: reading consumer info failed: %r", consumer, exc)
            else:
                metrics.pending.labels(consumer).set(info.num_pending or 0)
                metrics.ack_pending.labels(consumer).set(info.num_ack_pending or 0)
            await anyio.sleep(every)


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


def _decode(
    msg: Msg, decoder: msgspec.json.Decoder[Any] | None, metrics: ActorMetrics, consumer: str
) -> Delivery[Any]:
    """The delivery, decoded (raises `msgspec.DecodeError`)."""
    if msg.metadata.num_delivered > 1:
        metrics.redelivered.labels(consumer).inc()
    # No decoder: the handler takes the raw bytes and answers bad input itself (ingress).
    return Delivery(msg, msg.data if decoder is None else decoder.decode(msg.data))


async def _admit(
    msg: Msg,
    *,
    js: JetStreamContext,
    spec: ConsumerSpec,
    decoder: msgspec.json.Decoder[Any] | None,
    metrics: ActorMetrics,
) -> Delivery[Any] | None:
    """The delivery to handle, or None once a message past its bounds or undecodable has been
    dead-lettered (single and batch paths alike)."""
    consumer = spec.durable
    if _exhausted(msg, spec):
        metrics.failed.labels(consumer, "exhausted").inc()
        await _dead_letter(
            js,
            msg,
            metrics,
            consumer,
            f"exhausted {msg.metadata.num_delivered - 1} deliveries over {_age_s(msg):.0f} s",
        )
        return None
    try:
        return _decode(msg, decoder, metrics, consumer)
    except msgspec.DecodeError as exc:
        metrics.failed.labels(consumer, "undecodable").inc()
        await _dead_letter(js, msg, metrics, consumer, f"undecodable: {exc}")
        return None


async def _process(
    msg: Msg,
    *,
    js: JetStreamContext,
    spec: ConsumerSpec,
    decoder: msgspec.json.Decoder[Any] | None,
    handler: Handler,
    metrics: ActorMetrics,
    tracer: Tracer,
    ack_sync: bool,
    heartbeat: bool,
) -> None:
    delivery = await _admit(msg, js=js, spec=spec, decoder=decoder, metrics=metrics)
    if delivery is None:
        return
    await _handle_one(
        delivery,
        js=js,
        spec=spec,
        handler=handler,
        metrics=metrics,
        tracer=tracer,
        ack_sync=ack_sync,
        heartbeat=heartbeat,
    )


async def _handle_one(
    delivery: Delivery[Any],
    *,
    js: JetStreamContext,
    spec: ConsumerSpec,
    handler: Handler,
    metrics: ActorMetrics,
    tracer: Tracer,
    ack_sync: bool,
    heartbeat: bool,
) -> None:
    started = time.perf_counter()
    msg = delivery.msg
    parent = extract_context(delivery.headers)
    error: BaseException | None = None
    with tracer.start_as_current_span(
        f"{spec.durable} handle", context=parent, kind=SpanKind.CONSUMER
    ) as span:
        span.set_attribute("messaging.destination.name", msg.subject)
        span.set_attribute("messaging.message.delivery_count", delivery.num_delivered)
        try:
            await _run_handler(handler, delivery, spec.ack_wait_s / 3 if heartbeat else None)
        except Exception as exc:
            error = exc
        # Inside the span: a dead letter carries the handling's trace context.
        await _settle_result(
            delivery, error, js=js, spec=spec, metrics=metrics, ack_sync=ack_sync, started=started
        )


async def _process_batch(
    msgs: list[Msg],
    *,
    js: JetStreamContext,
    spec: ConsumerSpec,
    decoder: msgspec.json.Decoder[Any] | None,
    handler: Handler,
    batch_handler: BatchHandler,
    metrics: ActorMetrics,
    tracer: Tracer,
    ack_sync: bool,
    heartbeat: bool,
) -> None:
    consumer = spec.durable
    started = time.perf_counter()
    deliveries: list[Delivery[Any]] = []
    for msg in msgs:
        delivery = await _admit(msg, js=js, spec=spec, decoder=decoder, metrics=metrics)
        if delivery is not None:
            deliveries.append(delivery)
    if not deliveries:
        return
    if len(deliveries) == 1:  # a batch of one is handled as one
        await _handle_one(
            deliveries[0],
            js=js,
            spec=spec,
            handler=handler,
            metrics=metrics,
            tracer=tracer,
            ack_sync=ack_sync,
            heartbeat=heartbeat,
        )
        return
    for delivery in deliveries:
        delivery.span = tracer.start_span(
            f"{consumer} handle", context=extract_context(delivery.headers), kind=SpanKind.CONSUMER
        )
        delivery.span.set_attribute("messaging.destination.name", delivery.subject)
        delivery.span.set_attribute("messaging.message.delivery_count", delivery.num_delivered)
        delivery.span.set_attribute("messaging.batch.message_count", len(deliveries))
    try:
        try:
            results = await _run_batch(
                batch_handler, deliveries, spec.ack_wait_s / 3 if heartbeat else None
            )
            if len(results) != len(deliveries):
                raise RuntimeError(f"{len(results)} results for {len(deliveries)} deliveries")
        except Exception as exc:
            # Nothing of it committed as a batch: each delivery on its own, so one poison
            # message fails alone.
            log.info(
                "%s: batch of %d failed (%r), handling it one by one",
                consumer,
                len(deliveries),
                exc,
            )
            metrics.failed.labels(consumer, "batch").inc()
            for delivery in deliveries:
                delivery.span.end()
                delivery.span = trace.INVALID_SPAN
                await _handle_one(
                    delivery,
                    js=js,
                    spec=spec,
                    handler=handler,
                    metrics=metrics,
                    tracer=tracer,
                    ack_sync=ack_sync,
                    heartbeat=heartbeat,
                )
            return
        async with anyio.create_task_group() as tg:  # acks (and naks) in parallel
            for delivery, error in zip(deliveries, results, strict=True):
                tg.start_soon(
                    functools.partial(
                        _settle_result,
                        delivery,
                        error,
                        js=js,
                        spec=spec,
                        metrics=metrics,
                        ack_sync=ack_sync,
                        started=started,
                    )
                )
    finally:
        for delivery in deliveries:
            delivery.span.end()


async def _run_batch(
    batch_handler: BatchHandler, deliveries: list[Delivery[Any]], every: float | None
) -> Sequence[BaseException | None]:
    if every is None:
        return await batch_handler(deliveries)
    try:
        async with anyio.create_task_group() as beat:
            for delivery in deliveries:
                beat.start_soon(_heartbeat, delivery.msg, every)
            try:
                return await batch_handler(deliveries)
            finally:
                beat.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise single_error(group) from None


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


async def _run_handler(handler: Handler, delivery: Delivery[Any], every: float | None) -> None:
    if every is None:
        await handler(delivery)
        return
    try:
        async with anyio.create_task_group() as beat:
            beat.start_soon(_heartbeat, delivery.msg, every)
            try:
                await handler(delivery)
            finally:
                beat.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise single_error(group) from None


async def _heartbeat(msg: Msg, every: float) -> None:
    while True:
        await anyio.sleep(every)
        await _settle(msg.in_progress())


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
