"""No message can stop a service; an outage waits, a poison message does not.

A handler or endpoint that raises, whatever the error's type, fails that delivery or request
and nothing else: the loop and the endpoint keep serving the next one. A delivery failing
because a dependency is away is retried past `max_deliver`, up to the consumer's outage limit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any

import anyio
import asyncpg
import msgspec
import nats.errors
import pytest
from nats.aio.client import Client
from nats.micro.request import Request
from opentelemetry import trace

from libs.actor import Delivery
from libs.errors import Fenced, RetryableError, waits_out
from libs.runtime import Endpoint, in_tasks
from libs.telemetry import ActorMetrics
from tests.integration.conftest import serve
from tests.integration.test_actor import (
    Bed,
    Note,
    bed,  # noqa: F401  (the fixture)
    eventually,
    one_dead_letter,
    running,
    settled,
)

pytestmark = pytest.mark.anyio


class Odd(Exception):
    """An error nobody anticipated."""


# One of each kind of thing a handler might let out, nothing of Writ's own among them.
ERRORS: list[Callable[[], Exception]] = [
    lambda: asyncpg.CharacterNotInRepertoireError("invalid byte sequence for encoding UTF8"),
    lambda: KeyError("missing"),
    lambda: UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
    lambda: AttributeError("none has no attribute"),
    lambda: ExceptionGroup("several", [ValueError("a"), Odd("b")]),
    lambda: Odd("odd"),
]


@pytest.mark.parametrize("make", ERRORS, ids=lambda m: type(m()).__name__)
async def test_a_raising_handler_fails_its_delivery_and_the_loop_serves_on(
    bed: Bed,  # noqa: F811
    make: Callable[[], Exception],
) -> None:
    handled: list[int] = []

    async def handler(d: Delivery[Note]) -> None:
        if d.message.n == 1:
            raise make()
        handled.append(d.message.n)

    await bed.publish(1)
    async with running(bed, handler, spec=bed.spec(max_deliver=2)):
        letter = await one_dead_letter(bed)
        for n in (2, 3):
            await bed.publish(n)
        await eventually(lambda: handled == [2, 3])
        await settled(bed, delivered=4)
    assert letter.headers is not None
    assert "exhausted 2 deliveries" in letter.headers["Writ-Dlq-Reason"]


class _Exploding:
    """A tracer whose span for one message raises: an error outside the handler itself."""

    def __init__(self) -> None:
        self.real = trace.get_tracer("test")
        self.exploded = 0

    def start_as_current_span(
        self, name: str, *, context: Any = None, **kw: Any
    ) -> AbstractContextManager[Any]:
        if self.exploded < 2:
            self.exploded += 1
            raise Odd("tracing broke")
        return self.real.start_as_current_span(name, context=context, **kw)

    def start_span(self, *args: Any, **kw: Any) -> Any:
        return self.real.start_span(*args, **kw)


async def test_an_error_outside_the_handler_naks_and_the_loop_serves_on(
    bed: Bed,  # noqa: F811
) -> None:
    handled: list[tuple[int, int]] = []

    async def handler(d: Delivery[Note]) -> None:
        handled.append((d.message.n, d.num_delivered))

    tracer = _Exploding()
    await bed.publish(1)
    async with running(bed, handler, tracer=tracer):
        await eventually(lambda: handled == [(1, 3)])
        await bed.publish(2)
        await eventually(lambda: handled == [(1, 3), (2, 1)])
        await settled(bed, delivered=4)
    assert bed.sample("messages_failed_total", outcome="crashed") == 2
    assert await bed.dead_letters() == []


@pytest.mark.parametrize(
    "make",
    [
        lambda: nats.errors.NoRespondersError(),
        lambda: nats.errors.TimeoutError(),
        lambda: asyncpg.CannotConnectNowError("the database system is starting up"),
        lambda: ConnectionRefusedError(111, "refused"),
        lambda: RetryableError("governance did not answer", delay=0.05),
    ],
    ids=["no_responders", "nats_timeout", "pg_starting", "refused", "retryable"],
)
async def test_an_outage_is_waited_out_past_max_deliver(
    bed: Bed,  # noqa: F811
    make: Callable[[], Exception],
) -> None:
    calls: list[int] = []

    async def handler(d: Delivery[Note]) -> None:
        calls.append(d.num_delivered)
        if d.num_delivered < 5:
            raise make()

    await bed.publish(1)
    async with running(bed, handler, spec=bed.spec(max_deliver=2)):
        await eventually(lambda: bed.sample("messages_handled_total") == 1, timeout=20)
        await settled(bed, delivered=5)
    assert calls == [1, 2, 3, 4, 5]
    assert await bed.dead_letters() == []
    assert bed.sample("messages_waiting_total") == 4


async def test_an_outage_longer_than_the_limit_is_dead_lettered_saying_so(bed: Bed) -> None:  # noqa: F811
    calls: list[int] = []

    async def handler(d: Delivery[Note]) -> None:
        calls.append(d.num_delivered)
        raise nats.errors.NoRespondersError()

    await bed.publish(1)
    spec = bed.spec(max_deliver=2, outage_limit_s=1.5, backoff_max_s=0.5)
    async with running(bed, handler, spec=spec):
        letter = await one_dead_letter(bed)
    assert letter.headers is not None
    reason = letter.headers["Writ-Dlq-Reason"]
    # Past max_deliver (2) it waited; its first failure past the limit dead-lettered it as an
    # outage (WritOutageLimitReached reads that outcome), not as a poison message.
    assert len(calls) > 2
    assert reason.startswith("still unavailable after"), reason
    assert bed.sample("messages_failed_total", outcome="outage_exhausted") == 1
    assert bed.sample("messages_failed_total", outcome="exhausted") == 0


async def test_a_delivery_that_never_settles_is_dead_lettered_past_both_limits(bed: Bed) -> None:  # noqa: F811
    """As if its handler killed the process every time: JetStream redelivers without a limit,
    and the actor dead-letters it before handling it again."""
    calls: list[int] = []

    async def handler(d: Delivery[Note]) -> None:
        calls.append(d.num_delivered)
        raise Fenced("gone", operation_id="x")  # leaves the delivery alone, like a crash

    await bed.publish(1)
    async with running(
        bed,
        handler,
        spec=bed.spec(max_deliver=2, outage_limit_s=1.0, ack_wait_s=1.0, backoff_max_s=0.5),
    ):
        letter = await one_dead_letter(bed)
    assert letter.headers is not None
    assert "exhausted" in letter.headers["Writ-Dlq-Reason"]
    assert len(calls) >= 2


def test_what_waits_and_what_is_poison() -> None:
    assert waits_out(RetryableError("later"))
    assert waits_out(nats.errors.NoRespondersError())
    assert waits_out(asyncpg.ConnectionDoesNotExistError("closed"))
    assert waits_out(ExceptionGroup("g", [nats.errors.TimeoutError()]))
    assert not waits_out(asyncpg.CharacterNotInRepertoireError("nul"))
    assert not waits_out(KeyError("k"))
    assert not waits_out(ExceptionGroup("g", [nats.errors.TimeoutError(), KeyError("k")]))


# -- request/reply endpoints ---------------------------------------------------------------


def _endpoint(subject: str, make: Callable[[], Exception]) -> Endpoint:
    async def handle(request: Request) -> None:
        if request.data == b"boom":
            raise make()
        await request.respond(b"pong:" + request.data)

    return Endpoint("probe", subject, handle)


def _metrics() -> ActorMetrics:
    """Counters of their own for the endpoints a test serves (never the process's registry)."""
    from prometheus_client import CollectorRegistry

    return ActorMetrics(service="probe", registry=CollectorRegistry())


async def _ask(nc: Client, subject: str, data: bytes) -> tuple[bytes, dict[str, str]]:
    reply = await nc.request(subject, data, timeout=5)
    return reply.data, dict(reply.headers or {})


@pytest.mark.parametrize("make", ERRORS, ids=lambda m: type(m()).__name__)
async def test_a_raising_endpoint_answers_500_and_its_process_serves_on(
    nc: Client, unique: str, make: Callable[[], Exception]
) -> None:
    """As `libs.runtime.serve` runs endpoints: each request a task of the service's task
    group, where an escaping error would end the process."""
    subject = f"t.{unique}.probe"
    endpoint = _endpoint(subject, make)
    async with anyio.create_task_group() as tg:
        sub = await nc.subscribe(subject, cb=_as_request(in_tasks(endpoint, tg, _metrics())))
        try:
            data, headers = await _ask(nc, subject, b"boom")
            assert headers.get("Nats-Service-Error-Code") == "500"
            assert headers.get("Nats-Service-Error") == "probe failed"
            for n in range(3):
                data, headers = await _ask(nc, subject, b"%d" % n)
                assert data == b"pong:%d" % n and "Nats-Service-Error-Code" not in headers
        finally:
            await sub.unsubscribe()
            tg.cancel_scope.cancel()


def _as_request(handler: Callable[[Request], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
    async def cb(msg: Any) -> None:
        await handler(Request(msg))

    return cb


async def test_a_raising_micro_endpoint_answers_500_and_serves_on(nc: Client, unique: str) -> None:
    """The same through a NATS micro service, as the integration tests serve endpoints."""
    subject = f"t.{unique}.micro"
    micro = await serve(nc, "probe", [_endpoint(subject, lambda: Odd("x"))], unique)
    try:
        _, headers = await _ask(nc, subject, b"boom")
        assert headers.get("Nats-Service-Error-Code") == "500"
        data, _ = await _ask(nc, subject, b"again")
        assert data == b"pong:again"
    finally:
        await micro.stop()


async def test_an_existing_consumer_with_a_redelivery_limit_is_updated_to_none(bed: Bed) -> None:  # noqa: F811
    """A deployment upgraded in place: its consumers were created with JetStream's own
    max_deliver (10), which would leave a message undelivered, not dead-lettered."""
    from nats.js.api import AckPolicy, ConsumerConfig

    from libs.bus import ensure_consumer

    spec = bed.spec()
    await bed.js.add_consumer(
        bed.stream,
        ConsumerConfig(
            durable_name=spec.durable,
            ack_policy=AckPolicy.EXPLICIT,
            max_deliver=10,
            filter_subjects=list(spec.filter_subjects),
            ack_wait=spec.ack_wait_s,
        ),
    )
    await ensure_consumer(bed.js, spec)
    assert (await bed.consumer()).config.max_deliver == -1


# -- every endpoint of a real service, its store failing in a way nobody anticipated ---------


class _BrokenStore:
    """Every store call fails as Postgres does on text it cannot hold (defect 1)."""

    def __getattr__(self, name: str) -> Any:
        async def fail(*args: Any, **kwargs: Any) -> Any:
            raise asyncpg.CharacterNotInRepertoireError("invalid byte sequence")

        return fail


async def test_every_governance_endpoint_with_a_failing_store_answers_and_serves_on(
    private_nc: Client,
) -> None:
    """governance's endpoints as `serve` runs them (tasks of the process's task group), with a
    store that raises: each request gets an answer (a reply or an error), never a dead
    process; `answer` (the endpoint a NUL in a reason killed) included."""
    import msgspec.inspect as mi
    from prometheus_client import CollectorRegistry

    from libs.runtime import Runtime
    from libs.telemetry import make_tracer_provider
    from services.governance.service import GovernanceService
    from tests.unit.test_text_safety import example

    rt = Runtime(
        name="governance",
        nc=private_nc,
        js=private_nc.jetstream(),
        registry=CollectorRegistry(),
        tracer_provider=make_tracer_provider("governance"),
    )
    svc = GovernanceService(rt=rt, store=_BrokenStore())  # type: ignore[arg-type]
    endpoints = svc.endpoints()
    kinds = {
        "decide": "DecideRequest",
        "decide_batch": "DecideBatch",
        "register_run": "RegisterRun",
        "register_turn": "RegisterTurn",
        "pending": "ListPending",
        "answer": "AnswerDecision",
        "reserve": "ReserveBudget",
        "settle": "SettleBudget",
        "spend": "ListSpend",
    }
    assert {e.name for e in endpoints} == set(kinds)
    import schemas.governance as g

    async with anyio.create_task_group() as tg:
        subs = [
            await private_nc.subscribe(e.subject, cb=_as_request(in_tasks(e, tg, _metrics())))
            for e in endpoints
        ]
        try:
            for _ in range(2):  # and again: still there
                for endpoint in endpoints:
                    kind = getattr(g, kinds[endpoint.name])
                    body = msgspec.json.encode(example(mi.type_info(kind)))
                    reply = await private_nc.request(endpoint.subject, body, timeout=5)
                    code = (reply.headers or {}).get("Nats-Service-Error-Code")
                    # (an example turn's run id is not of its session: refused, not crashed)
                    assert code in (None, "500") or (endpoint.name, code) == (
                        "register_turn",
                        "403",
                    ), (endpoint.name, reply.headers)
            # The one that used to kill the process: an error reply, not silence.
            answer = next(e for e in endpoints if e.name == "answer")
            reply = await private_nc.request(
                answer.subject,
                msgspec.json.encode(example(mi.type_info(g.AnswerDecision))),
                timeout=5,
            )
            assert (reply.headers or {}).get("Nats-Service-Error-Code") == "500"
        finally:
            for sub in subs:
                await sub.unsubscribe()
            tg.cancel_scope.cancel()


async def test_a_batch_handler_raising_or_answering_odd_errors_fails_only_those(bed: Bed) -> None:  # noqa: F811
    """The batch handler raises an error nobody anticipated: the batch is handled one by
    one; one of those raises too (a poison message, dead-lettered); a later batch's odd
    per-delivery error fails that delivery alone. The loop serves on throughout."""
    singles: list[int] = []
    batches: list[list[int]] = []

    async def batch_handler(ds: list[Delivery[Note]]) -> list[BaseException | None]:
        batches.append([d.message.n for d in ds])
        if len(batches) == 1:
            raise Odd("the batch itself broke")
        return [KeyError("odd") if d.message.n == 6 else None for d in ds]

    async def handler(d: Delivery[Note]) -> None:
        if d.message.n == 3:
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        singles.append(d.message.n)

    for n in range(1, 5):
        await bed.publish(n)
    async with running(
        bed, handler, batch_handler=batch_handler, batch_size=10, spec=bed.spec(max_deliver=1)
    ):
        letter = await one_dead_letter(bed)
        assert letter.data == msgspec.json.encode(Note(3))
        assert sorted(singles) == [1, 2, 4]
    # A batch of several, one of them failing oddly: only that one comes back.
    for n in (5, 6, 7):
        await bed.publish(n)
    async with running(
        bed, handler, batch_handler=batch_handler, batch_size=10, spec=bed.spec(max_deliver=1)
    ):
        await eventually(lambda: len(batches) >= 2)
        letters = await eventually(lambda: _two(bed))
    assert [letter.data for letter in letters][-1] == msgspec.json.encode(Note(6))
    assert batches[1] == [5, 6, 7]


async def _two(bed: Bed) -> list[Any] | None:  # noqa: F811
    letters = await bed.dead_letters()
    return letters if len(letters) == 2 else None
