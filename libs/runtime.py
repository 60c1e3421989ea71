"""A service process's lifecycle: connect, declare, serve, drain on SIGTERM.

Every service's `__main__` calls `serve()` with its name, its settings and its `main`, which
starts its actors and returns once they have drained. The process registers as a NATS micro
service (`$SRV.PING` / `$SRV.STATS` / `$SRV.INFO` see it) only after `main` reports it started,
so a ping answer means the service's consumers exist.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import anyio.abc
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.micro import add_service
from nats.micro.request import Request
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer
from prometheus_client import CollectorRegistry

from libs.bus import connect
from libs.deadline import expired
from libs.errors import ConfigError
from libs.faults import Faults
from libs.health import Health
from libs.natsauth import JOURNALED, SEAL_JS_API, seal_user
from libs.replies import reply_allowed
from libs.settings import BaseSettings, read_secret
from libs.telemetry import (
    ActorMetrics,
    JsonLinesSpanExporter,
    MetricsServer,
    PassThroughTracer,
    make_tracer_provider,
    otlp_configured,
    service_registry,
)

__all__ = [
    "BatchEndpoint",
    "Batches",
    "Endpoint",
    "Runtime",
    "guarded",
    "in_tasks",
    "record_connection",
    "run_service",
    "serve",
]

VERSION = "0.1.0"
# Beyond its drains and span flush, how long a process asked to stop may take before it ends
# itself (`stop_bound_s`).
EXIT_MARGIN_S = 5.0
log = logging.getLogger("writ.runtime")
# Why an endpoint drops a request unhandled: past its requester's deadline, beyond its queue
# bound, or naming a reply subject that is no inbox (libs/replies.py).
_DROPPED = ("expired", "shed", "reply")


class Endpoint:
    """A request/reply endpoint of the service's NATS micro service.

    Requests are handled concurrently, up to `concurrency` at a time: nats-py awaits a
    subscription's handler before it delivers the next message, which would make a service
    answer one request at a time however many callers wait.

    `handler` is kept behind `guarded`: whatever it raises fails that request (answered
    500), never the process that serves it.

    A service that fell behind must not spend itself on requests nobody waits for (the soak's
    metastable overload, docs/soak.md): a request past its requester's deadline
    (`libs.deadline`, the `Writ-Deadline` header) is dropped unanswered before any work, when
    it arrives and again when its turn comes; and at most `max_pending` requests wait or run
    at once (default 8 × `concurrency`), a request beyond that answered at once with
    `503 <name> overloaded: retry`. A request whose reply subject is no inbox is dropped
    unanswered before anything else (libs/replies.py). All are counted in
    `writ_requests_dropped_total{service, endpoint, reason="expired"|"shed"|"reply"}`.
    """

    __slots__ = ("concurrency", "handler", "max_pending", "name", "subject")

    def __init__(
        self,
        name: str,
        subject: str,
        handler: Callable[[Request], Awaitable[None]],
        *,
        concurrency: int = 64,
        max_pending: int | None = None,
    ):
        self.name, self.subject = name, subject
        self.handler = guarded(name, handler)
        self.concurrency = concurrency
        self.max_pending = max_pending if max_pending is not None else 8 * concurrency


def guarded(
    name: str, handler: Callable[[Request], Awaitable[None]]
) -> Callable[[Request], Awaitable[None]]:
    """`handler`, answering `500 <name> failed` for an error of any type it lets out.

    An endpoint runs in its service's task group: an error escaping it would end the process
    for every tenant. The requester gets the error instead; the details go to the log.
    """

    async def handle(request: Request) -> None:
        try:
            await handler(request)
        except Exception as exc:
            await _failed(request, name, exc)

    handle.__wrapped__ = handler  # type: ignore[attr-defined]
    return handle


class BatchEndpoint:
    """An endpoint whose requests are handled together: `handler` is given every request that
    arrived while the batches under way were busy (at most `max_batch`), and answers each.

    Like group commit: with no load a request goes at once, in a batch of one; under load one
    statement, one commit and one task serve many requests, where `Endpoint` would spend a task,
    a turn of its limiter and a statement on each. At most `concurrency` batches run at a time;
    expired requests are dropped and requests beyond `max_pending` shed as `Endpoint` does.
    A batch that raises is handled again one request at a time, and a request that raises
    alone is answered `500 <name> failed`.
    """

    __slots__ = ("concurrency", "handler", "max_batch", "max_pending", "name", "subject")

    def __init__(
        self,
        name: str,
        subject: str,
        handler: Callable[[list[Request]], Awaitable[None]],
        *,
        concurrency: int = 2,
        max_batch: int = 256,
        max_pending: int | None = None,
    ):
        self.name, self.subject, self.handler = name, subject, handler
        self.concurrency, self.max_batch = concurrency, max_batch
        self.max_pending = max_pending if max_pending is not None else 4 * max_batch


class Batches:
    """A `BatchEndpoint`'s requests waiting for their batch, and the batches under way; called
    with each request as it arrives (the micro service's handler)."""

    def __init__(
        self, endpoint: BatchEndpoint, tg: anyio.abc.TaskGroup, metrics: ActorMetrics
    ) -> None:
        self._endpoint, self._tg = endpoint, tg
        self._dropped = metrics.requests_dropped
        for reason in _DROPPED:  # exported at 0 from the start
            self._dropped.labels(endpoint.name, reason)
        self._queue: list[Request] = []
        self._running = 0
        self.in_hand = 0  # requests queued or in a batch under way (tests, the shedding bound)
        self.batches = 0  # how many batches ran, and how many requests they held
        self.requests = 0

    @property
    def waiting(self) -> int:
        """Requests queued for a batch not started yet."""
        return len(self._queue)

    async def __call__(self, request: Request) -> None:
        if not reply_allowed(request._msg.reply):  # libs/replies.py: answered nowhere
            self._dropped.labels(self._endpoint.name, "reply").inc()
            return
        if expired(request.headers):  # it waited in the bus (the process frozen, or busy)
            self._dropped.labels(self._endpoint.name, "expired").inc()
            return
        if self.in_hand >= self._endpoint.max_pending:
            self._dropped.labels(self._endpoint.name, "shed").inc()
            await _answer_error(
                request, self._endpoint.name, "503", f"{self._endpoint.name} overloaded: retry"
            )
            return
        self.in_hand += 1
        self._queue.append(request)
        if self._running < self._endpoint.concurrency:
            # It runs once the bus has handed over every request already read: they go together.
            self._running += 1
            self._tg.start_soon(self._drain)

    async def _drain(self) -> None:
        try:
            while self._queue:
                size = self._endpoint.max_batch
                batch, self._queue = self._queue[:size], self._queue[size:]
                try:
                    live = []
                    for request in batch:
                        if expired(request.headers):  # it waited its turn longer than its caller
                            self._dropped.labels(self._endpoint.name, "expired").inc()
                        else:
                            live.append(request)
                    if live:
                        self.batches, self.requests = self.batches + 1, self.requests + len(live)
                        await self._handle(live)
                finally:
                    self.in_hand -= len(batch)
        finally:
            self._running -= 1

    async def _handle(self, batch: list[Request]) -> None:
        """The batch; if it raises, each of its requests alone (one poison request fails
        itself, not its neighbours), a request that still raises answered 500."""
        try:
            await self._endpoint.handler(batch)
            return
        except Exception as exc:
            if len(batch) == 1:
                await _failed(batch[0], self._endpoint.name, exc)
                return
            log.warning(
                "endpoint %s: a batch of %d failed (%r): one by one",
                self._endpoint.name,
                len(batch),
                exc,
            )
        for request in batch:
            await self._handle([request])


async def _failed(request: Request, name: str, exc: Exception) -> None:
    """The handler raised for `request`: logged, and answered `500 <name> failed`."""
    log.error("endpoint %s failed: %r", name, exc, exc_info=exc)
    await _answer_error(request, name, "500", f"{name} failed")


async def _answer_error(request: Request, name: str, code: str, description: str) -> None:
    try:
        await request.respond_error(code, description)
    except Exception as lost:  # the bus away: the requester times out instead
        log.warning("endpoint %s: answering %s failed: %r", name, code, lost)


class Runtime:
    """What a service's `main` is given: the bus, telemetry, and the signal to stop."""

    def __init__(
        self,
        *,
        name: str,
        nc: Client,
        js: JetStreamContext,
        registry: CollectorRegistry,
        tracer_provider: TracerProvider,
        faults: Faults | None = None,
        health: Health | None = None,
        stream_replicas: int = 1,
        retry_backoff_max_s: float | None = None,
        outage_limit_s: float | None = None,
        recording: bool = True,
        record_js: JetStreamContext | None = None,
    ) -> None:
        self.name = name
        # Every actor's longest redelivery backoff (WRIT_RETRY_BACKOFF_MAX_S; None: 30 s).
        self.retry_backoff_max_s = retry_backoff_max_s
        # Every actor's outage limit (WRIT_OUTAGE_LIMIT_S; None: 15 minutes).
        self.outage_limit_s = outage_limit_s
        # Replicas of Writ's streams (WRIT_STREAM_REPLICAS), as provisioning made them.
        self.stream_replicas = stream_replicas
        # `/livez` and `/readyz`: actors given it fetch only while NATS and PostgreSQL answer;
        # `main` registers its pools with `health.watch_pool`.
        self.health = health or Health(nc=nc, js=js)
        self.faults = faults or Faults()
        self.nc, self.js = nc, js
        # Where a journaled service's sealer reaches the audit record: its sealer's own
        # connection (`record_connection`), or, on a server without authentication, `js`.
        self.record_js = record_js if record_js is not None else js
        self.registry = registry
        self.tracer_provider = tracer_provider
        # `recording`: whether spans go anywhere (a span file, an OTLP endpoint); if not, the
        # process's tracer carries the trace on and builds no span (`PassThroughTracer`).
        self.tracer: Tracer = (
            tracer_provider.get_tracer(f"writ.{name}") if recording else PassThroughTracer()
        )
        self.metrics = ActorMetrics(service=name, registry=registry)
        self.stopping = anyio.Event()
        self.endpoints: list[Endpoint | BatchEndpoint] = []


Main = Callable[..., Awaitable[None]]


async def serve(
    name: str,
    settings: BaseSettings,
    main: Main,
    *,
    description: str,
    metrics_port_file: str | None = None,
) -> None:
    """Run one service process until SIGTERM/SIGINT, then drain within `drain_timeout_s`."""
    registry = service_registry(name)
    exporter = (
        JsonLinesSpanExporter(f"{settings.otel_spans_file}.{settings.instance or name}")
        if settings.otel_spans_file
        else None
    )
    provider = make_tracer_provider(name, exporter=exporter)
    password = read_secret(settings.nats_password_file) if settings.nats_password_file else ""
    nc = await connect(
        settings.nats_url, name=f"writ-{name}", user=settings.nats_user, password=password
    )
    js = nc.jetstream()
    seal_nc = await record_connection(name, settings)
    health = Health(
        nc=nc,
        js=js,
        every_s=settings.health_every_s,
        timeout_s=settings.health_timeout_s,
        stale_s=settings.live_stale_s,
    )
    metrics = MetricsServer(
        registry=registry, host=settings.metrics_host, port=settings.metrics_port, health=health
    )
    micro: Any = None
    try:
        metrics.start()
        if metrics_port_file:
            _write_atomically(metrics_port_file, str(metrics.port))
        rt = Runtime(
            name=name,
            nc=nc,
            js=js,
            registry=registry,
            tracer_provider=provider,
            faults=Faults(settings.faults_file or None),
            health=health,
            stream_replicas=settings.stream_replicas,
            retry_backoff_max_s=settings.retry_backoff_max_s,
            outage_limit_s=settings.outage_limit_s,
            recording=exporter is not None or otlp_configured(os.environ),
            record_js=seal_nc.jetstream(prefix=SEAL_JS_API) if seal_nc is not None else None,
        )
        async with anyio.create_task_group() as tg:
            done = anyio.Event()
            await tg.start(health.run)
            tg.start_soon(_watch_signals, rt, stop_bound_s(settings.drain_timeout_s))
            await tg.start(_run_main, main, rt, done)
            micro = await add_service(
                nc,
                name=f"writ-{name}",
                version=VERSION,
                description=description,
                metadata={"metrics_port": str(metrics.port)},
            )
            for endpoint in rt.endpoints:
                await micro.add_endpoint(
                    name=endpoint.name,
                    subject=endpoint.subject,
                    handler=in_tasks(endpoint, tg, rt.metrics),
                    queue_group=f"writ-{name}",
                )
            log.info("writ-%s ready (metrics on :%s)", name, metrics.port)
            await rt.stopping.wait()
            # Actors stop fetching when `stopping` is set and finish what they hold; after the
            # grace period the rest is cancelled and will be redelivered to another instance.
            with anyio.move_on_after(settings.drain_timeout_s):
                await done.wait()
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if micro is not None:
                await micro.stop()
            try:
                with anyio.fail_after(settings.drain_timeout_s):
                    await nc.drain()
            except Exception as exc:
                log.warning("drain of writ-%s incomplete: %r", name, exc)
            if seal_nc is not None:
                await seal_nc.close()
            metrics.stop()
            provider.shutdown()


async def record_connection(name: str, settings: BaseSettings) -> Client | None:
    """A journaled service's second connection, as its sealer's user (libs/natsauth.py): the
    only identity that may put anything on its journal's record. None on a server without
    authentication (the record is then in the one account there is).

    Raises:
        ConfigError: the service connects as a user but was given no sealer's password.
    """
    if name not in JOURNALED or not settings.nats_user:
        return None
    if not settings.seal_nats_password_file:
        raise ConfigError(
            f"{name} keeps an audit journal: WRIT_SEAL_NATS_PASSWORD_FILE must name the "
            f"password of its sealer's NATS user {seal_user(name)}"
        )
    return await connect(
        settings.nats_url,
        name=f"writ-{name}-sealer",
        user=seal_user(name),
        password=read_secret(settings.seal_nats_password_file),
    )


def in_tasks(
    endpoint: Endpoint | BatchEndpoint, tg: anyio.abc.TaskGroup, metrics: ActorMetrics
) -> Callable[[Request], Awaitable[None]]:
    """`endpoint`'s handler run in a task per request (a `BatchEndpoint`'s: in a task per batch,
    `Batches`), within its concurrency and queue bound, each request dropped unhandled once its
    requester's deadline has passed."""
    if isinstance(endpoint, BatchEndpoint):
        return Batches(endpoint, tg, metrics)
    limiter = anyio.CapacityLimiter(endpoint.concurrency)
    dropped = metrics.requests_dropped
    for reason in _DROPPED:  # exported at 0 from the start, for rates and alerts
        dropped.labels(endpoint.name, reason)
    pending = 0

    async def handle(request: Request) -> None:
        nonlocal pending
        try:
            async with limiter:
                if expired(request.headers):  # it waited its turn longer than its caller
                    dropped.labels(endpoint.name, "expired").inc()
                    return
                await endpoint.handler(request)
        finally:
            pending -= 1

    async def dispatch(request: Request) -> None:
        nonlocal pending
        if not reply_allowed(request._msg.reply):  # libs/replies.py: answered nowhere
            dropped.labels(endpoint.name, "reply").inc()
            return
        if expired(request.headers):  # it waited in the bus (the process frozen, or busy)
            dropped.labels(endpoint.name, "expired").inc()
            return
        if pending >= endpoint.max_pending:
            dropped.labels(endpoint.name, "shed").inc()
            await _answer_error(request, endpoint.name, "503", f"{endpoint.name} overloaded: retry")
            return
        pending += 1
        tg.start_soon(handle, request)

    return dispatch


async def _run_main(
    main: Main,
    rt: Runtime,
    done: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    try:
        await main(rt, task_status=task_status)
    finally:
        done.set()


async def _watch_signals(rt: Runtime, exit_after_s: float) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            log.info("writ-%s stopping: draining", rt.name)
            _exit_after(exit_after_s, rt.name)
            rt.health.stopping()
            rt.stopping.set()
            return


def stop_bound_s(drain_timeout_s: float, environ: Mapping[str, str] = os.environ) -> float:
    """How long a process asked to stop may take: its two drains (the actors', then the
    connection's), the span exporter's flush when spans are exported (OTEL_BSP_EXPORT_TIMEOUT,
    in ms, 30 s by default), and a margin: the chart's termination grace period, before its
    preStop delay, is computed the same way."""
    flush_s = 0.0
    if otlp_configured(environ):
        flush_s = float(environ.get("OTEL_BSP_EXPORT_TIMEOUT") or 30000) / 1000
    return 2 * drain_timeout_s + flush_s + EXIT_MARGIN_S


def _exit_after(seconds: float, name: str) -> None:
    """End the process `seconds` from now if it has not ended by itself. The drain is bounded
    step by step, but a step can still wait on what is gone: a start-up still connecting to a
    NATS server that went away with the process that started both (`writ run` killed), a span
    exporter retrying. A process asked to stop always stops."""

    def hard_exit() -> None:
        log.error("writ-%s did not stop within %.0f s of being asked to: exiting", name, seconds)
        os._exit(1)

    timer = threading.Timer(seconds, hard_exit)
    timer.daemon = True
    timer.start()


def _write_atomically(path: str, text: str) -> None:
    import os

    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        out.write(text)
    os.replace(tmp, path)


def run_service(name: str, settings: BaseSettings, main: Main, *, description: str) -> None:
    """Blocking entry point of a service's `__main__`: logging, then `serve` on asyncio (on
    uvloop unless the settings say `asyncio`)."""
    import functools
    import os

    logging.basicConfig(
        level=os.environ.get("WRIT_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s {name:<10} %(levelname)s %(message)s",
    )
    # One line per connector request would drown what matters (and carry URLs with ids).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    log.info("writ-%s starting on %s", name, settings.event_loop)
    anyio.run(
        functools.partial(
            serve,
            name,
            settings,
            main,
            description=description,
            metrics_port_file=settings.metrics_port_file or None,
        ),
        backend="asyncio",
        backend_options={"use_uvloop": settings.event_loop == "uvloop"},
    )
