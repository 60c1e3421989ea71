"""An endpoint that fell behind spends nothing on requests nobody waits for (the soak's
metastable overload, docs/soak.md): a request past its caller's `Writ-Deadline` is dropped
unhandled, and beyond `max_pending` waiting requests one is refused at once with a retryable
503 — against a real nats-server, through `libs.runtime.in_tasks` as `serve` runs it; the same
for a `BatchEndpoint`, whose requests that waited behind a busy batch go together in the
next."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import anyio
import anyio.abc
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.micro import add_service
from nats.micro.request import Request
from prometheus_client import CollectorRegistry

from libs.deadline import HEADER, timed_request
from libs.runtime import BatchEndpoint, Endpoint, in_tasks
from libs.telemetry import ActorMetrics

pytestmark = pytest.mark.anyio


class Busy:
    """An endpoint's handler that holds the request `b"first"` until `release` is set."""

    def __init__(self) -> None:
        self.handled: list[bytes] = []
        self.started, self.release = anyio.Event(), anyio.Event()

    async def __call__(self, request: Request) -> None:
        self.handled.append(request.data)
        if request.data == b"first":
            self.started.set()
            await self.release.wait()
        await request.respond(request.data)


@pytest.fixture
async def served(
    private_nc: Client, unique: str
) -> AsyncIterator[tuple[anyio.abc.TaskGroup, CollectorRegistry, str]]:
    async with anyio.create_task_group() as tg:
        yield tg, CollectorRegistry(), f"test.{unique}.probe"
        tg.cancel_scope.cancel()


async def _serve(
    nc: Client,
    tg: anyio.abc.TaskGroup,
    registry: CollectorRegistry,
    endpoint: Endpoint | BatchEndpoint,
) -> None:
    micro = await add_service(
        nc, name=f"writ-probe-{endpoint.subject.split('.')[1]}", version="0.1.0"
    )
    metrics = ActorMetrics(service="probe", registry=registry)
    await micro.add_endpoint(
        name=endpoint.name,
        subject=endpoint.subject,
        handler=in_tasks(endpoint, tg, metrics),
        queue_group="probe",
    )


async def _sent(nc: Client, count: int) -> None:
    """Until `count` more messages left this client (so they reach the server in order)."""
    target = nc.stats["out_msgs"] + count
    with anyio.fail_after(30):
        while nc.stats["out_msgs"] < target:
            await anyio.sleep(0.01)


async def _answered(answers: dict[bytes, Any], count: int) -> None:
    """Wait until `count` requests have their answer."""
    with anyio.fail_after(30):
        while len(answers) < count:
            await anyio.sleep(0.01)


def _asker(
    nc: Client, subject: str, answers: dict[bytes, bytes]
) -> Callable[[bytes], Coroutine[Any, Any, None]]:
    """A request with `data` whose answer goes into `answers[data]`."""

    async def ask(data: bytes) -> None:
        answers[data] = (await timed_request(nc, subject, data, timeout=60)).data

    return ask


def _assert_overloaded(reply: Msg) -> None:
    """`reply` is the endpoint's retryable refusal."""
    assert reply.headers is not None
    assert reply.headers["Nats-Service-Error-Code"] == "503"
    assert reply.headers["Nats-Service-Error"] == "probe overloaded: retry"


def _dropped(registry: CollectorRegistry, reason: str) -> float:
    return (
        registry.get_sample_value(
            "writ_requests_dropped_total",
            {"service": "probe", "endpoint": "probe", "reason": reason},
        )
        or 0.0
    )


async def test_requests_whose_callers_gave_up_are_dropped_and_the_next_one_is_answered(
    private_nc: Client, served: tuple[anyio.abc.TaskGroup, CollectorRegistry, str]
) -> None:
    tg, registry, subject = served
    busy = Busy()
    await _serve(private_nc, tg, registry, Endpoint("probe", subject, busy, concurrency=1))
    first: list[bytes] = []

    async def ask_first() -> None:
        first.append((await timed_request(private_nc, subject, b"first", timeout=60)).data)

    tg.start_soon(ask_first)
    await busy.started.wait()
    # The one handler is busy: five requests queue behind it and their callers give up.
    for i in range(5):
        with pytest.raises(NatsTimeoutError):
            await timed_request(private_nc, subject, f"late-{i}".encode(), timeout=0.2)
    # One that arrives already past its deadline (it waited in a frozen process's socket).
    with pytest.raises(NatsTimeoutError):
        await private_nc.request(
            subject, b"stale", timeout=0.5, headers={HEADER: f"{time.time() - 1:.3f}"}
        )
    busy.release.set()
    fresh = await timed_request(private_nc, subject, b"fresh", timeout=30)
    # A request without a deadline (an operator's tool) is served as before.
    plain = await private_nc.request(subject, b"plain", timeout=30)

    assert (fresh.data, plain.data, first) == (b"fresh", b"plain", [b"first"])
    assert busy.handled == [b"first", b"fresh", b"plain"]  # none of the abandoned ones
    assert _dropped(registry, "expired") == 6
    assert _dropped(registry, "shed") == 0


async def test_beyond_max_pending_a_request_is_refused_at_once_with_a_retryable_503(
    private_nc: Client, served: tuple[anyio.abc.TaskGroup, CollectorRegistry, str]
) -> None:
    tg, registry, subject = served
    busy = Busy()
    await _serve(
        private_nc, tg, registry, Endpoint("probe", subject, busy, concurrency=1, max_pending=2)
    )
    answers: dict[bytes, bytes] = {}
    ask = _asker(private_nc, subject, answers)

    tg.start_soon(ask, b"first")
    await busy.started.wait()
    tg.start_soon(ask, b"second")  # waits its turn: two pending, the bound
    await _sent(private_nc, 1)  # sent before the third, so it arrives before it
    refused = await timed_request(private_nc, subject, b"third", timeout=30)
    busy.release.set()
    await _answered(answers, 2)

    _assert_overloaded(refused)
    assert answers == {b"first": b"first", b"second": b"second"}
    assert busy.handled == [b"first", b"second"]  # the refused one did no work
    assert _dropped(registry, "shed") == 1


# -- a batch endpoint ---------------------------------------------------------------------------


class BusyBatches:
    """A `BatchEndpoint`'s handler: holds the batch holding `b"first"` until `release` is set,
    answers each request with its data, and raises for a batch holding `b"boom"`."""

    def __init__(self) -> None:
        self.batches: list[list[bytes]] = []
        self.started, self.release = anyio.Event(), anyio.Event()

    async def __call__(self, requests: list[Request]) -> None:
        self.batches.append([r.data for r in requests])
        if b"boom" in self.batches[-1]:
            raise RuntimeError("the store went away")
        if b"first" in self.batches[-1]:
            self.started.set()
            await self.release.wait()
        for request in requests:
            await request.respond(request.data)


async def test_requests_that_arrive_while_a_batch_is_busy_go_together_in_the_next(
    private_nc: Client, served: tuple[anyio.abc.TaskGroup, CollectorRegistry, str]
) -> None:
    tg, registry, subject = served
    busy = BusyBatches()
    await _serve(
        private_nc, tg, registry, BatchEndpoint("probe", subject, busy, concurrency=1, max_batch=4)
    )
    answers: dict[bytes, bytes] = {}
    ask = _asker(private_nc, subject, answers)

    tg.start_soon(ask, b"first")
    await busy.started.wait()
    for i in range(6):  # wait behind the busy batch: four in the next, two in the one after
        tg.start_soon(ask, f"next-{i}".encode())
    await _sent(private_nc, 6)
    await anyio.sleep(0.2)  # the server has handed them over
    busy.release.set()
    await _answered(answers, 7)

    assert answers == {data: data for data in answers}
    assert busy.batches[0] == [b"first"]
    assert [len(b) for b in busy.batches[1:]] == [4, 2]
    assert sorted(sum(busy.batches[1:], [])) == [f"next-{i}".encode() for i in range(6)]
    assert _dropped(registry, "expired") == _dropped(registry, "shed") == 0


async def test_a_batch_drops_requests_whose_callers_gave_up_and_sheds_beyond_max_pending(
    private_nc: Client, served: tuple[anyio.abc.TaskGroup, CollectorRegistry, str]
) -> None:
    tg, registry, subject = served
    busy = BusyBatches()
    await _serve(
        private_nc,
        tg,
        registry,
        BatchEndpoint("probe", subject, busy, concurrency=1, max_pending=4),
    )
    answers: dict[bytes, bytes] = {}
    ask = _asker(private_nc, subject, answers)

    tg.start_soon(ask, b"first")
    await busy.started.wait()
    for i in range(2):  # they queue behind the busy batch, and their callers give up
        with pytest.raises(NatsTimeoutError):
            await timed_request(private_nc, subject, f"late-{i}".encode(), timeout=0.2)
    tg.start_soon(ask, b"kept")  # the fourth in hand: the bound
    await _sent(private_nc, 1)
    refused = await timed_request(private_nc, subject, b"refused", timeout=30)
    busy.release.set()
    await _answered(answers, 2)

    _assert_overloaded(refused)
    assert answers == {b"first": b"first", b"kept": b"kept"}
    assert busy.batches == [[b"first"], [b"kept"]]  # neither the abandoned nor the refused
    assert (_dropped(registry, "expired"), _dropped(registry, "shed")) == (2, 1)


async def test_a_batch_that_raises_is_handled_one_by_one_and_only_the_poison_one_fails(
    private_nc: Client, served: tuple[anyio.abc.TaskGroup, CollectorRegistry, str]
) -> None:
    tg, registry, subject = served
    busy = BusyBatches()
    await _serve(private_nc, tg, registry, BatchEndpoint("probe", subject, busy, concurrency=1))
    replies: dict[bytes, Any] = {}

    async def ask(data: bytes) -> None:
        replies[data] = await timed_request(private_nc, subject, data, timeout=60)

    tg.start_soon(ask, b"first")
    await busy.started.wait()
    for data in (b"before", b"boom", b"beside"):  # one batch behind the busy one
        tg.start_soon(ask, data)
        await _sent(private_nc, 1)
    await anyio.sleep(0.2)
    busy.release.set()
    await _answered(replies, 4)
    after = await timed_request(private_nc, subject, b"after", timeout=30)

    failed = replies.pop(b"boom")
    assert failed.headers is not None
    assert (failed.headers["Nats-Service-Error-Code"], failed.headers["Nats-Service-Error"]) == (
        "500",
        "probe failed",
    )
    assert {data: r.data for data, r in replies.items()} == {
        b"first": b"first",
        b"before": b"before",
        b"beside": b"beside",
    }
    assert busy.batches[1:] == [
        [b"before", b"boom", b"beside"],
        [b"before"],
        [b"boom"],
        [b"beside"],
        [b"after"],
    ]
    assert after.data == b"after"
