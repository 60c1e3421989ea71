"""The actor loop: pull-consume an inbox, decode, handle, then ack / nak / term.

`run_actor` is the only place that maps errors to what happens to a message:

- undecodable (`msgspec.DecodeError`) or `PermanentError`: dead-letter with the reason, `term()`;
- `Fenced`: nothing at all (the lease belongs to another worker; a stale ack would settle its
  delivery, because JetStream matches acks by stream sequence only);
- `RetryableError`, or a dependency unavailable (`libs.errors.waits_out`: a Writ service not
  answering, NATS or PostgreSQL away): `nak` with backoff (capped at the consumer's
  `backoff_max_s`, 30 s unless `WRIT_RETRY_BACKOFF_MAX_S` says otherwise) for as long as the
  outage lasts, up to the consumer's `outage_limit_s` (`WRIT_OUTAGE_LIMIT_S`, 15 minutes from
  when the message was stored; counted in `writ_messages_waiting_total{service}`), then dead-letter;
- anything else, of any type: `nak` with backoff until the consumer's `max_deliver` is
  reached, then dead-letter (a poison message).

Nothing a message does stops the loop: an error escaping the handling itself (not the
handler: the settling, the tracing) is logged, counted (`outcome="crashed"`) and the delivery
nak'ed, and the loop goes on. A message delivered past both limits (a handler that kills its
process every time) is dead-lettered before it is handled again.

Alongside the loop a small task (`libs.stall.ConsumerWatch`) reads the consumer's info every
`lag_every_s` and sets its lag gauges (not yet delivered, delivered but unacked); failing to
read it changes nothing else. Messages waiting and none delivered for `stall_after_s` is a
stall: it is exported (`writ_consumer_stalled_seconds`), readiness says so, and the loop binds
the consumer again and pulls on a fresh subscription. So does a loop whose pulls go
unanswered (no status, no message) several times in a row, and a pull the server refuses
(a 409 or 503 while a leader is elected) is sent again after a short backoff: no reconnect
or leader change leaves the loop fetching from nothing.

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

from libs._settle import (
    _age_s,
    _crashed,
    _dead_letter,
    _exhausted,
    _settle,
    _settle_result,
)
from libs.bus import ConsumerSpec
from libs.errors import single_error
from libs.health import Health
from libs.provision import bind_consumer
from libs.pull import Puller, PullError
from libs.stall import ConsumerWatch
from libs.telemetry import ActorMetrics, extract_context

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
    outage_limit_s: float | None = None,
    fetch_timeout_s: float = 1.0,
    stall_after_s: float = 20.0,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Consume `spec`'s durable consumer until cancelled or `stopping` is set.

    When `stopping` is set the loop fetches nothing more and returns once the handlers in
    flight have finished: that is the graceful drain a SIGTERM asks for.
    """
    if backoff_max_s is not None:  # the process's setting over the consumer's default
        spec = msgspec.structs.replace(spec, backoff_max_s=backoff_max_s)
    if outage_limit_s is not None:  # likewise WRIT_OUTAGE_LIMIT_S
        spec = msgspec.structs.replace(spec, outage_limit_s=outage_limit_s)
    await bind_consumer(js, spec)  # provisioned (libs/provision.py): a process never creates one
    # Each pull request on its own reply subject (libs/pull.py: nats-py's `fetch` can leave a
    # request behind that holds a later message for up to `fetch_timeout_s`).
    sub = Puller(js._nc, spec.stream, spec.durable)
    await sub.start()
    watch = ConsumerWatch(
        js=js,
        stream=spec.stream,
        durable=spec.durable,
        metrics=metrics,
        health=health,
        every_s=lag_every_s,
        stall_after_s=stall_after_s,
    )
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
            tg.start_soon(watch.run, watching)
            unanswered = refused = 0
            while not stopping.is_set():
                if watch.rebind.is_set() or unanswered >= _UNANSWERED_REBIND:
                    sub = await _rebind(js, spec, sub)
                    watch.rebound()
                    unanswered = 0
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
                    # No answer at all, not even the request's expiry: the server lost the
                    # request (a reconnect, a consumer leader gone). Pulled again at once;
                    # several in a row and the consumer is bound again.
                    slots.release()
                    unanswered += 1
                    continue
                except PullError as exc:  # a 409 / 503: a leader is being elected
                    slots.release()
                    refused += 1
                    log.log(
                        logging.WARNING if refused % 20 == 1 else logging.DEBUG,
                        "pull on %s refused (%d in a row), pulling again: %s",
                        spec.durable,
                        refused,
                        exc,
                    )
                    await anyio.sleep(min(0.1 * refused, 1.0))
                    continue
                except Exception as exc:  # connection trouble: wait for the client to reconnect
                    slots.release()
                    log.warning("fetch on %s failed: %r", spec.durable, exc)
                    await anyio.sleep(0.5)
                    continue
                unanswered = refused = 0
                if msgs:
                    watch.delivered()
                else:
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


# Pulls in a row that got no answer at all before the consumer is bound again.
_UNANSWERED_REBIND = 5


async def _rebind(js: JetStreamContext, spec: ConsumerSpec, sub: Puller) -> Puller:
    """The consumer bound again (it must still exist: provisioning made it, a process never
    creates one) and a fresh subscription to pull on: what a stall or unanswered pulls call
    for. Failing, the old subscription is kept and the next stall asks again."""
    try:
        await bind_consumer(js, spec, patience_s=10.0)
        fresh = Puller(js._nc, spec.stream, spec.durable)
        await fresh.start()
    except Exception as exc:
        log.warning("%s: binding the consumer again failed: %r", spec.durable, exc)
        return sub
    with anyio.CancelScope(shield=True):
        await sub.stop()
    log.info("%s: consumer bound again, pulling on a fresh subscription", spec.durable)
    return fresh


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
                errors = await batch_handler(deliveries)
            finally:
                beat.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise single_error(group) from None
    return errors


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
