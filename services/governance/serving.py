"""How governance serves a request/reply endpoint: decode (400), continue the caller's trace,
answer with what the handler returned, or with the error its exception names."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.micro.request import Request
from opentelemetry.trace import SpanKind

from libs.runtime import Runtime
from libs.telemetry import extract_context

__all__ = ["NotFound", "RegistrationRefused", "decoded", "endpoint"]

log = logging.getLogger("writ.governance")


class NotFound(LookupError):
    """An endpoint's subject does not exist: answered 404 (a KeyError stays a 500)."""


class RegistrationRefused(PermissionError):
    """A registration governance refuses (it would widen what governance holds, or names a turn
    of another session): answered 403 (logged)."""


async def decoded(
    rt: Runtime, name: str, kind: type, decoder: msgspec.json.Decoder[Any], request: Request
) -> Any:
    """The request's message, or None once it was answered 400 (it does not decode)."""
    try:
        return decoder.decode(request.data)
    except msgspec.DecodeError as exc:
        rt.metrics.failed.labels(name, "undecodable").inc()
        await request.respond_error("400", f"invalid {kind.__name__}: {exc}")
        return None


def endpoint(
    rt: Runtime,
    encoder: msgspec.json.Encoder,
    name: str,
    kind: type,
    handle: Callable[..., Awaitable[msgspec.Struct]],
) -> Callable[[Request], Awaitable[None]]:
    """A request/reply handler serving `handle` for messages of type `kind`."""
    decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(kind)
    metrics = rt.metrics

    async def serve(request: Request) -> None:
        started = time.perf_counter()
        message = await decoded(rt, name, kind, decoder, request)
        if message is None:
            return
        try:
            # Continue the caller's trace: one run is one trace, request/reply included.
            with rt.tracer.start_as_current_span(
                f"governance {name}",
                context=extract_context(request.headers),
                kind=SpanKind.SERVER,
            ):
                answer = await handle(message)
        except NotFound as exc:
            metrics.failed.labels(name, "not_found").inc()
            await request.respond_error("404", str(exc)[:500])
            return
        except RegistrationRefused as exc:
            metrics.failed.labels(name, "refused").inc()
            log.warning("%s refused: %s", name, exc)
            await request.respond_error("403", str(exc)[:500])
            return
        except Exception as exc:
            metrics.failed.labels(name, "error").inc()
            log.warning("%s failed: %r", name, exc)
            await request.respond_error("500", f"{name} failed")
            return
        await request.respond(encoder.encode(answer))
        metrics.handled.labels(name).inc()
        metrics.latency.labels(name).observe(time.perf_counter() - started)

    return serve
