"""The HTTP door observed as the NATS door is: requests by route, method, status and stable
code, latency per route, authentication failures and requests in flight, on ingress's own
registry with the service as a label; and each request one server span that continues the
caller's `traceparent`, so what it hands on (a run, a command) is one trace rooted at the
host's span.

Every label value comes from a fixed set: the route's template (`/api/v1/runs/{run_id:str}`),
never its path; a method Writ serves or `OTHER`; a code of the contract or `OTHER`.
"""

from __future__ import annotations

import time
from typing import Any, Final

import msgspec
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from libs.telemetry import extract_context
from services.ingress.http._problems import STATUS

__all__ = ["HttpObserver"]

_METHODS: Final = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
_TRACE_HEADERS: Final = frozenset({b"traceparent", b"tracestate"})
# A problem document's `code` is read from its first bytes (they are small).
_PROBLEM_BYTES: Final = 4096
_AUTH_CODES: Final = frozenset(
    {"UNAUTHENTICATED", "UNKNOWN_TENANT", "BAD_SIGNATURE", "TOKEN_EXPIRED", "INVALID_TOKEN"}
)
_LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _Code(msgspec.Struct):
    code: str = ""


_CODE: Final = msgspec.json.Decoder(_Code)


class HttpObserver:
    """ASGI middleware around the HTTP door's application."""

    def __init__(
        self, app: Any, *, registry: CollectorRegistry, tracer: Tracer, service: str = "ingress"
    ) -> None:
        self._app, self._tracer, self._service = app, tracer, service
        self._requests = Counter(
            "writ_http_requests",
            "HTTP requests answered, by route template, method, status and stable code "
            "(`none` for a success)",
            ["service", "route", "method", "status", "code"],
            registry=registry,
        )
        self._latency = Histogram(
            "writ_http_request_duration_seconds",
            "Time to answer an HTTP request (a stream: until it ended), by route template",
            ["service", "route", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._in_flight = Gauge(
            "writ_http_requests_in_flight",
            "HTTP requests being answered now",
            ["service"],
            registry=registry,
        )
        self._auth_failures = Counter(
            "writ_http_auth_failures",
            "HTTP requests refused because their credential was missing or did not verify, by code",
            ["service", "code"],
            registry=registry,
        )
        self._in_flight.labels(service)
        for code in sorted(_AUTH_CODES):
            self._auth_failures.labels(service, code)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        method = scope.get("method", "")
        method = method if method in _METHODS else "OTHER"
        carried = {
            bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1")
            for k, v in scope.get("headers", ())
            if bytes(k).lower() in _TRACE_HEADERS
        }
        answer: dict[str, Any] = {"status": 500, "problem": False, "body": b""}

        async def observed(message: Any) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                for key, value in message.get("headers") or ():
                    if bytes(key).lower() == b"content-type":
                        answer["problem"] = bytes(value).startswith(b"application/problem+json")
            elif message["type"] == "http.response.body" and answer["problem"]:
                if len(answer["body"]) < _PROBLEM_BYTES:
                    answer["body"] += bytes(message.get("body", b""))[:_PROBLEM_BYTES]
            await send(message)

        started = time.perf_counter()
        in_flight = self._in_flight.labels(self._service)
        in_flight.inc()
        with self._tracer.start_as_current_span(
            f"ingress http {method}",
            context=extract_context(carried) if carried else None,
            kind=SpanKind.SERVER,
        ) as span:
            try:
                await self._app(scope, receive, observed)
            finally:
                in_flight.dec()
                route = str(scope.get("path_template") or "unmatched")[:200]
                status = int(answer["status"])
                code = self._code(answer) if status >= 400 else "none"
                self._requests.labels(self._service, route, method, str(status), code).inc()
                self._latency.labels(self._service, route, method).observe(
                    time.perf_counter() - started
                )
                if code in _AUTH_CODES:
                    self._auth_failures.labels(self._service, code).inc()
                if span.is_recording():
                    span.update_name(f"ingress http {method} {route}")
                    span.set_attribute("http.request.method", method)
                    span.set_attribute("http.route", route)
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR, code))
                    if code != "none":
                        span.set_attribute("writ.code", code)

    @staticmethod
    def _code(answer: dict[str, Any]) -> str:
        """The stable code of a refusal (from its problem document), `OTHER` if none."""
        if not answer["problem"]:
            return "OTHER"
        try:
            code = _CODE.decode(answer["body"]).code
        except msgspec.DecodeError:
            return "OTHER"
        return code if code in STATUS else "OTHER"
