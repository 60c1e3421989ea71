"""`run_actor` against a real nats-server: ack / nak / term, dead letters, heartbeat, drain.

Every test owns a stream `T_<unique>` on `t.<unique>.>`, a durable `d<unique>` on it, and a
stream capturing that durable's dead letters (`writ.dlq.d<unique>`), all deleted at the end.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, TypeVar, overload

import anyio
import msgspec
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo, RawStreamMsg, StorageType
from nats.js.errors import BadRequestError, NotFoundError
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec, ensure_consumer, publish
from libs.errors import Fenced, PermanentError, RetryableError
from libs.telemetry import ActorMetrics
from schemas.subjects import dead_letter

pytestmark = pytest.mark.anyio

R = TypeVar("R")


class Note(msgspec.Struct, frozen=True):
    n: int


DECODER = msgspec.json.Decoder(Note)
_SUBJECT_OVERLAP = 10065  # JSStreamSubjectOverlapErr


class Bed:
    """One test's streams, consumer, metrics, and ways to look at them."""

    def __init__(self, js: JetStreamContext, unique: str) -> None:
        self.js = js
        self.unique = unique
        self.stream = f"T_{unique}"
        self.subject = f"t.{unique}.note"
        self.durable = f"d{unique}"
        self.dlq_subject = dead_letter(self.durable)
        self.dlq_stream = f"DLQ_{unique}"
        self.registry = CollectorRegistry()
        self.metrics = ActorMetrics(service=f"t{unique}", registry=self.registry)

    def spec(self, **overrides: Any) -> ConsumerSpec:
        return ConsumerSpec(
            stream=self.stream,
            durable=self.durable,
            filter_subjects=(f"t.{self.unique}.>",),
            **overrides,
        )

    async def publish_raw(self, data: bytes) -> int:
        return int((await self.js.publish(self.subject, data)).seq)

    async def publish(self, n: int) -> int:
        return await publish(self.js, self.subject, Note(n=n))

    async def consumer(self) -> ConsumerInfo:
        return await self.js.consumer_info(self.stream, self.durable)

    async def dead_letters(self) -> list[RawStreamMsg]:
        found: list[RawStreamMsg] = []
        seq = 1
        while True:
            try:
                msg = await self.js.get_msg(
                    self.dlq_stream, seq=seq, subject=self.dlq_subject, next=True
                )
            except NotFoundError:
                return found
            found.append(msg)
            seq = int(msg.seq or 0) + 1

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(
            f"writ_{name}",
            {"service": f"t{self.unique}", "consumer": self.durable, **labels},
        )
        return value or 0.0


@pytest.fixture
async def bed(nc: Client, unique: str) -> AsyncIterator[Bed]:
    js = nc.jetstream()
    b = Bed(js, unique)
    await js.add_stream(name=b.stream, subjects=[f"t.{unique}.>"], storage=StorageType.MEMORY)
    owns_dlq = True
    try:
        await js.add_stream(name=b.dlq_stream, subjects=[b.dlq_subject], storage=StorageType.MEMORY)
    except BadRequestError as exc:
        # Another suite's `writ.dlq.>` stream (WRIT_DLQ) already captures it: read from that.
        if exc.err_code != _SUBJECT_OVERLAP:
            raise
        b.dlq_stream = await js.find_stream_name_by_subject(b.dlq_subject)
        owns_dlq = False
    try:
        yield b
    finally:
        with anyio.CancelScope(shield=True):
            await js.delete_stream(b.stream)
            if owns_dlq:
                await js.delete_stream(b.dlq_stream)


@overload
async def eventually(check: Callable[[], Awaitable[R | None]], timeout: float = 10.0) -> R: ...
@overload
async def eventually(check: Callable[[], R | None], timeout: float = 10.0) -> R: ...
async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll `check` (sync or async) until it returns something truthy, and return that."""
    with anyio.fail_after(timeout):
        while True:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await anyio.sleep(0.02)


async def settled(b: Bed, *, delivered: int, pending: int = 0) -> ConsumerInfo:
    """Wait until the consumer has delivered `delivered` messages, has nothing unacked, and
    `pending` messages not yet delivered.

    Consumer info is eventually consistent: an ack published just before the request, or a
    message just stored, may not be counted yet, so it is polled, never read once.
    """

    async def check() -> ConsumerInfo | None:
        info = await b.consumer()
        assert info.delivered is not None
        if (
            info.delivered.consumer_seq >= delivered
            and info.num_ack_pending == 0
            and info.num_pending == pending
        ):
            return info
        return None

    return await eventually(check)


async def one_dead_letter(b: Bed) -> RawStreamMsg:
    letters = await eventually(b.dead_letters)
    assert len(letters) == 1, [m.headers for m in letters]
    return letters[0]


@asynccontextmanager
async def running(
    b: Bed,
    handler: Callable[[Delivery[Any]], Awaitable[None]],
    *,
    spec: ConsumerSpec | None = None,
    **kwargs: Any,
) -> AsyncIterator[None]:
    spec = spec or b.spec()
    await ensure_consumer(b.js, spec)  # provisioning's part (libs/provision.py)
    async with anyio.create_task_group() as tg:
        await tg.start(
            partial(
                run_actor,
                js=b.js,
                spec=spec,
                decoder=DECODER,
                handler=handler,
                metrics=b.metrics,
                **kwargs,
            )
        )
        try:
            yield
        finally:
            tg.cancel_scope.cancel()


async def test_decodable_message_is_handled_once_and_acked(bed: Bed) -> None:
    seen: list[Delivery[Note]] = []

    async def handler(d: Delivery[Note]) -> None:
        seen.append(d)

    seq = await bed.publish(7)
    async with running(bed, handler):
        info = await settled(bed, delivered=1)
        await eventually(lambda: bed.sample("messages_handled_total") == 1)

    assert [(d.message, d.subject, d.num_delivered) for d in seen] == [(Note(7), bed.subject, 1)]
    assert "traceparent" not in seen[0].headers  # no span was active at publish
    assert info.num_pending == 0 and info.num_redelivered == 0
    assert info.delivered is not None and info.delivered.consumer_seq == 1
    assert info.ack_floor is not None and info.ack_floor.stream_seq == seq
    assert bed.sample("handler_seconds_count") == 1
    assert await bed.dead_letters() == []


@pytest.mark.parametrize(
    "data", [b"\x00not json", b'{"n": "seven"}'], ids=["malformed", "wrong-type"]
)
async def test_undecodable_message_is_dead_lettered_and_terminated(bed: Bed, data: bytes) -> None:
    calls = 0

    async def handler(d: Delivery[Note]) -> None:
        nonlocal calls
        calls += 1

    seq = await bed.publish_raw(data)
    async with running(bed, handler):
        letter = await one_dead_letter(bed)
        # Settled after one delivery and not nak'ed: terminated, so never delivered again.
        info = await settled(bed, delivered=1)

    assert calls == 0
    assert letter.data == data
    assert letter.headers is not None
    assert letter.headers["Writ-Dlq-Reason"].startswith("undecodable: ")
    assert letter.headers["Writ-Dlq-Subject"] == bed.subject
    assert letter.headers["Writ-Dlq-Stream-Seq"] == str(seq)
    assert info.delivered is not None and info.delivered.consumer_seq == 1
    assert info.num_pending == 0 and info.num_redelivered == 0
    assert bed.sample("messages_failed_total", outcome="undecodable") == 1
    assert bed.sample("messages_handled_total") == 0


@pytest.mark.parametrize(
    "error",
    [PermanentError("no such tenant"), msgspec.ValidationError("bad field")],
    ids=["PermanentError", "ValidationError"],
)
async def test_permanent_error_is_dead_lettered_after_one_call(bed: Bed, error: Exception) -> None:
    calls = 0

    async def handler(d: Delivery[Note]) -> None:
        nonlocal calls
        calls += 1
        raise error

    seq = await bed.publish(1)
    # max_deliver=3 so that a wrongly retried message also ends in the DLQ, quickly.
    async with running(bed, handler, spec=bed.spec(max_deliver=3)):
        letter = await one_dead_letter(bed)
        info = await settled(bed, delivered=1)

    assert calls == 1
    assert letter.headers is not None
    assert letter.headers["Writ-Dlq-Reason"] == f"{type(error).__name__}: {error}"
    assert letter.headers["Writ-Dlq-Stream-Seq"] == str(seq)
    assert letter.data == msgspec.json.encode(Note(1))
    assert info.delivered is not None and info.delivered.consumer_seq == 1
    assert info.num_pending == 0 and info.num_redelivered == 0
    assert bed.sample("messages_failed_total", outcome="permanent") == 1
    assert bed.sample("messages_failed_total", outcome="retry") == 0


async def test_retryable_error_is_retried_until_success(bed: Bed) -> None:
    deliveries: list[tuple[float, int]] = []

    async def handler(d: Delivery[Note]) -> None:
        deliveries.append((time.monotonic(), d.num_delivered))
        if len(deliveries) < 3:
            raise RetryableError("database busy", delay=0.2)

    await bed.publish(1)
    async with running(bed, handler):
        await eventually(lambda: bed.sample("messages_handled_total") == 1)
        info = await settled(bed, delivered=3)

    assert [n for _, n in deliveries] == [1, 2, 3]
    gaps = [b - a for (a, _), (b, _) in zip(deliveries, deliveries[1:], strict=False)]
    assert all(gap >= 0.15 for gap in gaps), gaps  # nak'ed with a delay, not redelivered at once
    assert info.delivered is not None and info.delivered.consumer_seq == 3
    assert info.num_pending == 0
    assert bed.sample("messages_failed_total", outcome="retry") == 2
    assert await bed.dead_letters() == []


async def test_retryable_error_delay_is_the_nak_delay(bed: Bed) -> None:
    deliveries: list[float] = []

    async def handler(d: Delivery[Note]) -> None:
        deliveries.append(time.monotonic())
        if len(deliveries) == 1:
            raise RetryableError("rate limited", delay=1.5)

    await bed.publish(1)
    async with running(bed, handler):
        await eventually(lambda: bed.sample("messages_handled_total") == 1)

    # The nak delay is a lower bound the server enforces (the actor's own backoff would be 0.25 s).
    assert len(deliveries) == 2
    assert deliveries[1] - deliveries[0] >= 1.3


async def test_always_failing_handler_is_dead_lettered_after_max_deliver(bed: Bed) -> None:
    calls: list[int] = []

    async def handler(d: Delivery[Note]) -> None:
        calls.append(d.num_delivered)
        raise RuntimeError("boom")

    await bed.publish(1)
    async with running(bed, handler, spec=bed.spec(max_deliver=3)):
        letter = await one_dead_letter(bed)
        info = await settled(bed, delivered=3)

    assert calls == [1, 2, 3]
    assert letter.headers is not None
    reason = letter.headers["Writ-Dlq-Reason"]
    assert "exhausted 3 deliveries" in reason and "boom" in reason
    assert info.delivered is not None and info.delivered.consumer_seq == 3
    assert info.num_pending == 0
    assert bed.sample("messages_failed_total", outcome="retry") == 2
    assert bed.sample("messages_failed_total", outcome="exhausted") == 1
    assert bed.sample("messages_handled_total") == 0


async def test_fenced_delivery_is_left_alone_until_ack_wait(bed: Bed) -> None:
    deliveries: list[tuple[float, int]] = []

    async def handler(d: Delivery[Note]) -> None:
        deliveries.append((time.monotonic(), d.num_delivered))
        if len(deliveries) == 1:
            raise Fenced("lease taken over", operation_id="op-1")

    await bed.publish(1)
    async with running(bed, handler, spec=bed.spec(ack_wait_s=1.0)):
        await eventually(lambda: bed.sample("messages_handled_total") == 1)
        info = await settled(bed, delivered=2)

    # Neither nak'ed (it would come back at once) nor terminated (it would not come back):
    # JetStream redelivers it only when ack_wait runs out.
    assert [n for _, n in deliveries] == [1, 2]
    assert deliveries[1][0] - deliveries[0][0] >= 0.8
    assert info.num_pending == 0
    assert bed.sample("messages_failed_total", outcome="fenced") == 1
    assert bed.sample("messages_failed_total", outcome="retry") == 0
    assert await bed.dead_letters() == []


async def test_heartbeat_keeps_a_long_handler_s_delivery(bed: Bed) -> None:
    calls: list[int] = []

    async def handler(d: Delivery[Note]) -> None:
        calls.append(d.num_delivered)
        await anyio.sleep(2.5)

    await bed.publish(1)
    async with running(bed, handler, spec=bed.spec(ack_wait_s=1.0)):
        await eventually(lambda: bed.sample("messages_handled_total") == 1)
        info = await settled(bed, delivered=1)

    assert calls == [1]
    assert info.delivered is not None and info.delivered.consumer_seq == 1
    assert info.num_redelivered == 0 and info.num_pending == 0


@pytest.mark.parametrize("reports_progress", [True, False], ids=["progress", "silent"])
async def test_without_heartbeat_the_handler_reports_progress_itself(
    bed: Bed, reports_progress: bool
) -> None:
    calls: list[int] = []

    async def handler(d: Delivery[Note]) -> None:
        calls.append(d.num_delivered)
        if d.num_delivered > 1:
            return
        for _ in range(8):  # 2.4 s, well past ack_wait
            await anyio.sleep(0.3)
            if reports_progress:
                await d.progress()

    await bed.publish(1)
    async with running(bed, handler, spec=bed.spec(ack_wait_s=1.0), heartbeat=False):
        await eventually(lambda: bed.sample("messages_handled_total") >= 1)
        if reports_progress:
            await settled(bed, delivered=1)
        else:
            # Redelivered after ack_wait while the first handler still runs; both then ack.
            await eventually(lambda: bed.sample("messages_handled_total") == 2)
            await settled(bed, delivered=2)

    assert calls == ([1] if reports_progress else [1, 2])


async def test_stopping_drains_the_handler_in_flight(bed: Bed) -> None:
    entered, release, returned = anyio.Event(), anyio.Event(), anyio.Event()
    seen: list[int] = []

    async def handler(d: Delivery[Note]) -> None:
        seen.append(d.message.n)
        entered.set()
        await release.wait()

    stopping = anyio.Event()

    async def actor(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        await ensure_consumer(bed.js, bed.spec())
        await run_actor(
            js=bed.js,
            spec=bed.spec(),
            decoder=DECODER,
            handler=handler,
            metrics=bed.metrics,
            stopping=stopping,
            task_status=task_status,
        )
        returned.set()

    await bed.publish(1)
    async with anyio.create_task_group() as tg:
        await tg.start(actor)
        with anyio.fail_after(10):
            await entered.wait()
        stopping.set()
        # The fetch loop stops within its 1 s fetch timeout; the handler still holds it open.
        with anyio.move_on_after(1.5):
            await returned.wait()
        assert not returned.is_set()
        await bed.publish(2)  # after the loop stopped fetching: must stay in the stream
        release.set()
        with anyio.fail_after(10):
            await returned.wait()  # run_actor returned on its own; nobody cancelled it
        assert not tg.cancel_scope.cancel_called

    assert seen == [1]
    assert bed.sample("messages_handled_total") == 1
    info = await settled(bed, delivered=1, pending=1)
    assert info.delivered is not None and info.delivered.consumer_seq == 1


async def test_stopping_with_all_slots_busy_fetches_nothing_more(bed: Bed) -> None:
    entered, release, returned = anyio.Event(), anyio.Event(), anyio.Event()
    seen: list[int] = []

    async def handler(d: Delivery[Note]) -> None:
        seen.append(d.message.n)
        entered.set()
        await release.wait()

    stopping = anyio.Event()

    async def actor(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        await ensure_consumer(bed.js, bed.spec())
        await run_actor(
            js=bed.js,
            spec=bed.spec(),
            decoder=DECODER,
            handler=handler,
            metrics=bed.metrics,
            stopping=stopping,
            concurrency=1,
            task_status=task_status,
        )
        returned.set()

    await bed.publish(1)
    await bed.publish(2)
    async with anyio.create_task_group() as tg:
        await tg.start(actor)
        with anyio.fail_after(10):
            await entered.wait()
        stopping.set()
        release.set()
        with anyio.fail_after(10):
            await returned.wait()

    assert seen == [1]
    info = await settled(bed, delivered=1, pending=1)
    assert info.delivered is not None and info.delivered.consumer_seq == 1


@pytest.mark.parametrize(("concurrency", "count"), [(4, 6), (1, 3)])
async def test_concurrency_bounds_handlers_in_flight(
    bed: Bed, concurrency: int, count: int
) -> None:
    in_flight = peak = 0
    full = anyio.Event()
    seen: list[int] = []

    async def handler(d: Delivery[Note]) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight >= concurrency:
            full.set()
        try:
            with anyio.move_on_after(5):
                await full.wait()  # hold the slot until `concurrency` handlers overlap
            await anyio.sleep(0.05)
            seen.append(d.message.n)
        finally:
            in_flight -= 1

    for n in range(count):
        await bed.publish(n)
    async with running(bed, handler, concurrency=concurrency):
        await eventually(lambda: bed.sample("messages_handled_total") == count)
        await settled(bed, delivered=count)

    assert peak == concurrency
    assert sorted(seen) == list(range(count))


async def test_handler_span_continues_the_publisher_s_trace(bed: Bed) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    seen: list[trace.SpanContext] = []

    async def handler(d: Delivery[Note]) -> None:
        seen.append(trace.get_current_span().get_span_context())

    with tracer.start_as_current_span("host publish") as root:
        await bed.publish(1)
        published = root.get_span_context()

    name = f"{bed.durable} handle"

    def handle_span() -> Any:
        return next((s for s in exporter.get_finished_spans() if s.name == name), None)

    async with running(bed, handler, tracer=tracer):
        span = await eventually(handle_span)
    provider.shutdown()

    assert len(seen) == 1
    assert seen[0].trace_id == published.trace_id
    assert seen[0].span_id == span.context.span_id
    assert span.parent is not None and span.parent.is_remote
    assert span.parent.trace_id == published.trace_id
    assert span.parent.span_id == published.span_id
    assert span.kind is SpanKind.CONSUMER
    assert span.attributes["messaging.destination.name"] == bed.subject
    assert span.attributes["messaging.message.delivery_count"] == 1


async def test_a_batch_that_fails_is_handled_one_by_one_and_only_the_poison_fails(bed: Bed) -> None:
    batches: list[list[int]] = []
    singles: list[int] = []

    async def batch_handler(ds: list[Delivery[Note]]) -> list[BaseException | None]:
        batches.append([d.message.n for d in ds])
        if any(d.message.n == 3 for d in ds):
            raise RuntimeError("the batch's transaction failed")  # nothing committed
        return [None] * len(ds)

    async def handler(d: Delivery[Note]) -> None:
        if d.message.n == 3:
            raise PermanentError("poison")
        singles.append(d.message.n)

    seqs = [await bed.publish(n) for n in range(1, 6)]  # all stored before the first fetch
    async with running(
        bed, handler, batch_handler=batch_handler, batch_size=10, spec=bed.spec(max_deliver=3)
    ):
        letter = await one_dead_letter(bed)
        info = await settled(bed, delivered=5)
        await eventually(lambda: bed.sample("messages_handled_total") == 4)

    assert batches == [[1, 2, 3, 4, 5]]
    assert singles == [1, 2, 4, 5]  # each once, in order, after the batch failed
    assert letter.headers is not None
    assert letter.headers["Writ-Dlq-Stream-Seq"] == str(seqs[2])
    assert info.num_redelivered == 0 and info.num_pending == 0
    assert bed.sample("messages_failed_total", outcome="batch") == 1
    assert bed.sample("messages_failed_total", outcome="permanent") == 1


async def test_a_batch_settles_each_delivery_by_its_own_result(bed: Bed) -> None:
    batches: list[list[tuple[int, int]]] = []
    singles: list[tuple[int, int]] = []

    async def batch_handler(ds: list[Delivery[Note]]) -> list[BaseException | None]:
        batches.append([(d.message.n, d.num_delivered) for d in ds])
        return [
            RetryableError("not yet", delay=0.05)
            if d.message.n == 2
            else PermanentError("never")
            if d.message.n == 4
            else None
            for d in ds
        ]

    async def handler(d: Delivery[Note]) -> None:
        singles.append((d.message.n, d.num_delivered))  # a batch of one comes here

    for n in range(1, 5):
        await bed.publish(n)
    async with running(
        bed, handler, batch_handler=batch_handler, batch_size=10, spec=bed.spec(max_deliver=3)
    ):
        letter = await one_dead_letter(bed)
        info = await settled(bed, delivered=5)
        await eventually(lambda: bed.sample("messages_handled_total") == 3)

    assert batches == [[(1, 1), (2, 1), (3, 1), (4, 1)]]
    assert singles == [(2, 2)]  # only the nak'ed one came back
    assert letter.data == msgspec.json.encode(Note(4))
    assert info.num_pending == 0
    assert bed.sample("messages_failed_total", outcome="retry") == 1
    assert bed.sample("messages_failed_total", outcome="batch") == 0


async def test_an_idle_inbox_keeps_every_slot_for_the_messages_that_come_later(bed: Bed) -> None:
    """An idle inbox's fetches end without a message, most with a timeout and some (a pull
    request's 408 or a stale 404 arriving first) with an empty batch: neither may cost a slot.
    After many idle fetches, `concurrency` messages are still handled at once (a leak left
    the planner handling one delivery at a time after the command path's long idle spell)."""
    width = 4
    overlapped = anyio.Event()
    in_flight = peak = 0

    async def handler(d: Delivery[Note]) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight >= width:
            overlapped.set()
        try:
            with anyio.move_on_after(5):
                await overlapped.wait()
        finally:
            in_flight -= 1

    await ensure_consumer(bed.js, bed.spec())
    async with anyio.create_task_group() as tg:
        await tg.start(
            partial(
                run_actor,
                js=bed.js,
                spec=bed.spec(),
                decoder=DECODER,
                handler=handler,
                metrics=bed.metrics,
                concurrency=width,
                fetch_timeout_s=0.02,
            )
        )
        await anyio.sleep(6)  # about 300 idle fetches
        for n in range(width):
            await bed.publish(n)
        with anyio.fail_after(10):
            await overlapped.wait()
        tg.cancel_scope.cancel()
    assert peak == width
