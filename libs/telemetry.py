"""Tracing with W3C context carried in NATS headers, and a Prometheus endpoint per process.

One `TracerProvider` and one `CollectorRegistry` per process, created by its `__main__` and
passed down; nothing here is global.

Spans go to an OTLP/HTTP collector when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variable is set. This is the one place below `__main__` that
reads the environment: the OpenTelemetry exporter reads its endpoint, headers, TLS files, timeout
and compression (and the batch processor its `OTEL_BSP_*` tuning) from `OTEL_*` variables
itself, so the switch reads the same variables rather than a `WRIT_*` copy that could disagree.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from socketserver import ThreadingMixIn
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import anyio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Link
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)

from libs.health import Health

__all__ = [
    "ALERTED_OUTCOMES",
    "ActorMetrics",
    "JsonLinesSpanExporter",
    "MetricsServer",
    "OTLP_ENDPOINT_VARIABLES",
    "PassThroughTracer",
    "ServiceFamily",
    "extract_context",
    "inject_context",
    "links_to",
    "make_tracer_provider",
    "otlp_configured",
    "refresh_every",
    "service_registry",
]

# The standard variables that turn OTLP export on; the traces one wins when both are set.
OTLP_ENDPOINT_VARIABLES: Final = (
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)
_PROPAGATOR = TraceContextTextMapPropagator()
log = logging.getLogger("writ.telemetry")


def otlp_configured(environ: Mapping[str, str]) -> bool:
    """Whether `environ` names an OTLP endpoint for traces."""
    return any(environ.get(name, "").strip() for name in OTLP_ENDPOINT_VARIABLES)


def make_tracer_provider(
    service: str, *, exporter: SpanExporter | None = None, environ: Mapping[str, str] | None = None
) -> TracerProvider:
    """A tracer provider for one process, exporting to `exporter` as each span ends and, when
    `environ` (the process's environment by default) names an OTLP endpoint, to that collector
    in batches over HTTP/protobuf.

    Batched spans leave only on the processor's schedule (`OTEL_BSP_SCHEDULE_DELAY`, 5 s by
    default): call `shutdown()` on the provider before the process exits, or they are lost.
    """
    provider = TracerProvider(resource=Resource.create({"service.name": f"writ-{service}"}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if otlp_configured(os.environ if environ is None else environ):
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


class PassThroughTracer(trace.Tracer):
    """The tracer of a process with nowhere to send its spans (no span file, no OTLP endpoint).

    It records nothing, since nothing would receive it, and carries on the trace it is in
    unchanged: a span it starts is the parent's context as it came (the host's `traceparent`
    from a message's headers, ids and sampled flag alike), so what this process publishes and
    stores (NATS headers, the outbox's `traceparent`) names the same trace as with recording
    on. An SDK tracer with no processor builds every span in full and then drops it: in
    governance's `decide` that was a sixth of the process's CPU (as profiled).
    """

    def start_span(
        self, name: str, context: otel_context.Context | None = None, *args: Any, **kwargs: Any
    ) -> trace.Span:
        """The parent's context, as a span that records nothing."""
        return trace.NonRecordingSpan(trace.get_current_span(context).get_span_context())

    @contextlib.contextmanager
    def start_as_current_span(  # type: ignore[override]
        self, name: str, context: otel_context.Context | None = None, *args: Any, **kwargs: Any
    ) -> Iterator[trace.Span]:
        """`start_span`, current for the block (so that `inject_context` in it carries the
        parent on)."""
        if context is None:  # the current span already: nothing to attach
            yield trace.get_current_span()
            return
        with trace.use_span(self.start_span(name, context), end_on_exit=False) as span:
            yield span


class JsonLinesSpanExporter(SpanExporter):
    """Append finished spans to a file, one JSON object per line (tests and local debugging).

    It records ids, names, timing and attributes only: span attributes carry ids and digests,
    never payloads.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Write the spans; a line per span, appended."""
        lines = []
        for span in spans:
            context = span.get_span_context()
            if context is None:  # a span always has one once started; nothing to write
                continue
            parent = span.parent
            lines.append(
                json.dumps(
                    {
                        "trace_id": f"{context.trace_id:032x}",
                        "span_id": f"{context.span_id:016x}",
                        "parent_span_id": f"{parent.span_id:016x}" if parent else None,
                        "name": span.name,
                        "service": span.resource.attributes.get("service.name"),
                        "start": span.start_time,
                        "end": span.end_time,
                        "attributes": {
                            k: v
                            for k, v in (span.attributes or {}).items()
                            if isinstance(v, str | int | float | bool)
                        },
                        "links": [
                            {
                                "trace_id": f"{link.context.trace_id:032x}",
                                "span_id": f"{link.context.span_id:016x}",
                                "attributes": dict(link.attributes or {}),
                            }
                            for link in span.links
                        ],
                    }
                )
            )
        with self._lock, open(self._path, "a") as out:
            out.write("".join(f"{line}\n" for line in lines))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


def inject_context(headers: dict[str, str]) -> dict[str, str]:
    """Add the current span's `traceparent` (and `tracestate`) to outgoing NATS headers."""
    _PROPAGATOR.inject(headers)
    return headers


def extract_context(headers: Mapping[str, str] | None) -> otel_context.Context:
    """The remote parent context carried by an incoming message's headers."""
    return _PROPAGATOR.extract(dict(headers or {}))


# `*_created` series double every counter's series and no dashboard or alert reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus-client


def service_registry(service: str, *, version: str = "") -> CollectorRegistry:
    """A service process's registry: its own metrics, the process's (`process_*`: CPU, memory,
    open descriptors), the interpreter's (`python_*`: GC, version) and `writ_build_info`."""
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    if not version:
        try:
            version = importlib.metadata.version("writ")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
    Gauge(
        "writ_build_info",
        "Always 1: the service and the version of Writ it runs",
        ["service", "version"],
        registry=registry,
    ).labels(service, version).set(1)
    return registry


# The outcomes of `writ_messages_failed_total` an alert reads: each consumer exports them at 0
# from the first time the service names the consumer, so `increase()` sees the first failure.
ALERTED_OUTCOMES: Final = (
    "undecodable",
    "permanent",
    "exhausted",
    "outage_exhausted",
    "error",
    "retry",
)


class ServiceFamily:
    """One metric family shared by every service (`service` its first label), bound to one
    service: `labels(...)` takes the family's other label values, positionally or by name.

    The first time a value of the first other label (a consumer, an endpoint) appears,
    `on_new` is told, so the caller can export that consumer's series at 0 from the start."""

    def __init__(
        self, metric: Any, service: str, on_new: Callable[[str], None] | None = None
    ) -> None:
        self._metric, self._service, self._on_new = metric, service, on_new
        self._seen: set[str] = set()

    def labels(self, *values: str, **named: str) -> Any:
        """The child for this service and `values` (or `named`)."""
        if named:
            child = self._metric.labels(service=self._service, **named)
            first = next(iter(named.values()))
        else:
            child = self._metric.labels(self._service, *values)
            first = values[0] if values else ""
        if self._on_new is not None and first not in self._seen:
            self._seen.add(first)
            self._on_new(first)
        return child

    def inc(self, amount: float = 1) -> None:
        """Increment the unlabelled (service-only) child."""
        self._metric.labels(self._service).inc(amount)

    def set(self, value: float) -> None:
        """Set the unlabelled (service-only) child."""
        self._metric.labels(self._service).set(value)


class ActorMetrics:
    """Messages handled / failed / redelivered / dead-lettered, handler latency and the
    consumer's lag, per consumer, on one registry.

    Every family is named once for all services (`writ_messages_handled_total`) with the service
    as a label (`service="planner"`), so a dashboard panel or an alert is written once. The
    only other label values are consumer/endpoint names and fixed outcomes: never a message's
    ids. A consumer's counters are exported at 0 from the first time it is named.
    """

    def __init__(self, *, service: str, registry: CollectorRegistry) -> None:
        self.service = service
        self._declared: set[str] = set()
        declare = self._declare
        self.handled = ServiceFamily(
            Counter(
                "writ_messages_handled",
                "Messages handled and acked",
                ["service", "consumer"],
                registry=registry,
            ),
            service,
            declare,
        )
        self.failed = ServiceFamily(
            Counter(
                "writ_messages_failed",
                "Messages whose handling failed, by outcome",
                ["service", "consumer", "outcome"],
                registry=registry,
            ),
            service,
            declare,
        )
        self.latency = ServiceFamily(
            Histogram(
                "writ_handler_seconds",
                "Handler latency",
                ["service", "consumer"],
                registry=registry,
                buckets=(
                    0.001,
                    0.0025,
                    0.005,
                    0.01,
                    0.025,
                    0.05,
                    0.1,
                    0.25,
                    0.5,
                    1.0,
                    2.5,
                    5.0,
                    10.0,
                    30.0,
                ),
            ),
            service,
            declare,
        )
        self.redelivered = ServiceFamily(
            Counter(
                "writ_messages_redelivered",
                "Deliveries of a message delivered before (num_delivered > 1)",
                ["service", "consumer"],
                registry=registry,
            ),
            service,
            declare,
        )
        self.dead_lettered = ServiceFamily(
            Counter(
                "writ_messages_dead_lettered",
                "Dead letters published to writ.dlq.<consumer>",
                ["service", "consumer"],
                registry=registry,
            ),
            service,
            declare,
        )
        self.waiting = ServiceFamily(
            Counter(
                "writ_messages_waiting",
                "Deliveries nak'ed to wait out an unavailable dependency (a Writ "
                "service, NATS, PostgreSQL)",
                ["service", "consumer"],
                registry=registry,
            ),
            service,
            declare,
        )
        # Request/reply: requests an endpoint dropped before any work, `expired` (past the
        # requester's `Writ-Deadline`: nobody waits for the answer), `shed` (its queue full)
        # or `reply` (its reply subject is no inbox: libs/replies.py).
        self.requests_dropped = ServiceFamily(
            Counter(
                "writ_requests_dropped",
                "Requests an endpoint dropped unhandled, by reason",
                ["service", "endpoint", "reason"],
                registry=registry,
            ),
            service,
            declare,
        )
        self.pending = ServiceFamily(
            Gauge(
                "writ_consumer_pending",
                "Messages on the consumer's stream not yet delivered (num_pending)",
                ["service", "consumer"],
                registry=registry,
            ),
            service,
        )
        self.ack_pending = ServiceFamily(
            Gauge(
                "writ_consumer_ack_pending",
                "Messages delivered and not yet acknowledged (num_ack_pending)",
                ["service", "consumer"],
                registry=registry,
            ),
            service,
        )
        # One name for every service (the service a label), so one alert covers them all.
        self.stalled = Gauge(
            "writ_consumer_stalled_seconds",
            "How long the consumer has had messages waiting and delivered none (0: moving)",
            ["service", "consumer"],
            registry=registry,
        )

    def _declare(self, consumer: str) -> None:
        """Export `consumer`'s counters at 0 (rate() and increase() need the zero too)."""
        if consumer in self._declared:
            return
        self._declared.add(consumer)
        self.handled.labels(consumer)
        self.latency.labels(consumer)
        for outcome in ALERTED_OUTCOMES:
            self.failed.labels(consumer, outcome)
        self.redelivered.labels(consumer)
        self.dead_lettered.labels(consumer)
        self.waiting.labels(consumer)


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood the log."""


class MetricsServer:
    """`/metrics` over HTTP for one registry, on a daemon thread, and with a `health` (a
    `libs.health.Health`) its probes: `/livez` and `/readyz`, 200 or 503 with the checks that
    failed as JSON."""

    def __init__(
        self, *, registry: CollectorRegistry, host: str, port: int, health: Health | None = None
    ) -> None:
        self._registry, self._host, self._port = registry, host, port
        self._health = health
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when 0 asked for any free one)."""
        return int(self._server.server_port) if self._server is not None else self._port

    def start(self) -> None:
        """Start serving."""
        metrics = make_wsgi_app(self._registry)
        health = self._health

        def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
            path = environ.get("PATH_INFO", "")
            if health is None or path not in ("/livez", "/readyz"):
                return list(metrics(environ, start_response))
            ok, checks = health.live() if path == "/livez" else health.ready()
            body = json.dumps({"ok": ok, "checks": checks}).encode()
            start_response(
                "200 OK" if ok else "503 Service Unavailable",
                [
                    ("Content-Type", "application/json"),
                    ("Content-Length", str(len(body))),
                    ("Cache-Control", "no-store"),
                ],
            )
            return [body]

        self._server = make_server(
            self._host, self._port, app, _ThreadingServer, handler_class=_QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, daemon=True, name="writ-metrics"
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


async def refresh_every(
    every: float, refresh: Callable[[], Awaitable[None]], *, stopping: anyio.Event, what: str
) -> None:
    """Call `refresh` now and every `every` seconds until `stopping` is set (or cancelled).

    A failed refresh leaves the gauges at their last values: it is logged (a warning the first
    time, then at debug until a refresh succeeds again) and never ends the loop.
    """
    failing = False
    while not stopping.is_set():
        try:
            with anyio.fail_after(max(every, 1.0)):
                await refresh()
        except Exception as exc:
            log.log(
                logging.DEBUG if failing else logging.WARNING,
                "refreshing %s failed, keeping the last values: %r",
                what,
                exc,
            )
            failing = True
        else:
            failing = False
        with anyio.move_on_after(every):
            await stopping.wait()


def links_to(traceparent: str | None, reason: str) -> list[Link]:
    """A span link to the trace a piece of work began in, when it resumes in another one (a
    person's approval, a redelivery, the sweeper re-driving a command); none without one."""
    if not traceparent:
        return []
    context = trace.get_current_span(
        _PROPAGATOR.extract({"traceparent": traceparent})
    ).get_span_context()
    if not context.is_valid:
        return []
    return [Link(context, attributes={"writ.link": reason})]
