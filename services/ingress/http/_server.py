"""Serving `/api/v1` in-process with uvicorn, inside ingress's task group."""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import uvicorn
from nats.aio.client import Client
from nats.js import JetStreamContext
from opentelemetry.trace import Tracer
from prometheus_client import CollectorRegistry

from libs.runtime import BatchEndpoint, Endpoint
from services.ingress.console import ApiClient, Sessions, console_router
from services.ingress.console._mcp import McpBus
from services.ingress.console._operators import OperatorKey
from services.ingress.http._api import Api, Door
from services.ingress.http._app import PREFIX, build_app
from services.ingress.http._idempotency import Idempotency
from services.ingress.http._nats_reads import nats_read_endpoints
from services.ingress.http._nats_sessions import session_endpoint
from services.ingress.http._observe import HttpObserver
from services.ingress.http._results import Results

__all__ = ["HttpServer"]

log = logging.getLogger("writ.ingress.http")


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the process's runtime owns SIGTERM and stops
    the server through `should_exit`."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """The HTTP door of one ingress process."""

    def __init__(
        self,
        *,
        door: Door,
        nc: Client,
        js: JetStreamContext,
        stopping: anyio.Event,
        host: str = "127.0.0.1",
        port: int = 0,
        port_file: str = "",
        max_body_bytes: int = 64 * 1024,
        answer_timeout_s: float = 30.0,
        endpoints: list[Endpoint | BatchEndpoint] | None = None,
        registry: CollectorRegistry | None = None,
        tracer: Tracer | None = None,
        receipt_keys_file: str = "",
        operators: OperatorKey | None = None,
    ) -> None:
        self._door, self._nc, self._js, self._stopping = door, nc, js, stopping
        self._receipt_keys_file = receipt_keys_file
        self._host, self._port, self._port_file = host, port, port_file
        self._max_body, self._answer_timeout = max_body_bytes, answer_timeout_s
        self.port = 0
        # The process's micro endpoints: the same reads for hosts on NATS join them.
        self._endpoints = endpoints
        # Where the door's metrics go and what traces its requests (none: unobserved).
        self._registry, self._tracer = registry, tracer
        # The operators' public key: who may open the console's MCP pages (none: nobody).
        self._operators = operators

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until the process stops; started once the socket listens."""
        results = Results(self._nc)
        await results.start()
        # Only this process's console may present a session's sign-in token to its API.
        console_key = secrets.token_bytes(32)
        api = Api(
            door=self._door,
            nc=self._nc,
            idempotency=await Idempotency.open(self._js),
            results=results,
            console_key=console_key,
        )
        if self._endpoints is not None:
            self._endpoints.extend([*nats_read_endpoints(api), session_endpoint(api)])
        sock = socket.socket(socket.AF_INET6 if ":" in self._host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        sock.listen(512)
        self.port = sock.getsockname()[1]
        # The console is a client of this very API, over loopback, as each of its viewers.
        loopback = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self._host, self._host)
        client = ApiClient(
            f"http://{_netloc(loopback, self.port)}{PREFIX}", console_key=console_key
        )
        console = console_router(
            await Sessions.open(self._js, self._door, operators=self._operators),
            client,
            McpBus(self._nc),
        )
        app = build_app(
            api,
            max_body_bytes=self._max_body,
            answer_timeout_s=self._answer_timeout,
            console=console,
            receipt_keys_file=self._receipt_keys_file,
        )
        served: Any = app
        if self._registry is not None and self._tracer is not None:
            served = HttpObserver(app, registry=self._registry, tracer=self._tracer)
        server = _Server(
            uvicorn.Config(
                served,
                lifespan="off",
                log_level="warning",
                access_log=False,
                timeout_graceful_shutdown=5,
            )
        )
        try:
            async with anyio.create_task_group() as tg:
                # The socket listens already: a connection made now waits in its backlog.
                tg.start_soon(server.serve, [sock])
                if self._port_file:
                    _write_port(self._port_file, self.port)
                log.info(
                    "HTTP API on http://%s:%s/api/v1, console on /console/", self._host, self.port
                )
                task_status.started()
                await self._stopping.wait()
                # Long-polls answer with what they know, then the server finishes what is in
                # flight (its graceful shutdown) and closes.
                results.close()
                server.should_exit = True
        finally:
            with anyio.CancelScope(shield=True):
                await results.stop()
                await client.aclose()
            sock.close()


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _write_port(path: str, port: int) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(str(port))
    os.replace(tmp, path)
