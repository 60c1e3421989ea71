"""`FakeHost`: the helpdesk's faces served on one loopback port; `main`, its process."""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any, Self

import uvicorn
from mcp.server.lowlevel import Server
from mcp.server.sse import SseServerTransport
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from fakes import _receipts
from fakes.host._control import Guard, control_routes
from fakes.host._mcp import mcp_server
from fakes.host._oauth import token_routes
from fakes.host._rest import rest_routes
from fakes.host._state import DEFAULT_DATA, HostState

__all__ = ["FakeHost", "drive_run", "main"]


class FakeHost:
    """The helpdesk on loopback: `url` is its base (`url + "/mcp"`, `url + "/api/v1"`)."""

    def __init__(
        self,
        *,
        mcp_token: str,
        rest_token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        data: dict[str, Any] | None = None,
        legacy_sse: bool = False,
        oauth_clients: dict[str, str] | None = None,
    ) -> None:
        if not mcp_token or not rest_token:
            raise ValueError("both tokens must be set")
        self.legacy_sse = legacy_sse
        self._oauth_clients = dict(oauth_clients or {})
        self.state = HostState(data or DEFAULT_DATA)
        self._mcp_token, self._rest_token = mcp_token.encode(), rest_token.encode()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(128)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:53211."""
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def _app(self) -> Any:
        server = mcp_server(self.state)
        if self.legacy_sse:
            return Guard(self._legacy_app(server), state=self.state, token=self._mcp_token)
        app = server.streamable_http_app(
            stateless_http=True,
            json_response=True,
            custom_starlette_routes=[
                *rest_routes(self.state, self._rest_token),
                *token_routes(self.state, self._oauth_clients),
                *control_routes(self.state),
            ],
        )
        return Guard(app, state=self.state, token=self._mcp_token)

    def _legacy_app(self, server: Server[Any]) -> Any:
        """The MCP server over the legacy HTTP+SSE transport only (the SDK's own)."""
        sse = SseServerTransport("/mcp/messages/")
        state = self.state

        async def connect(request: Request) -> Response:
            with state.lock:
                state.sse_sessions += 1
            async with sse.connect_sse(request.scope, request.receive, request._send) as (
                read,
                write,
            ):  # noqa: SLF001
                await server.run(read, write, server.create_initialization_options())
            return Response()

        return Starlette(
            routes=[
                Route("/mcp", connect, methods=["GET"]),  # POST /mcp: 405, as an old server says
                Mount("/mcp/messages/", app=sse.handle_post_message),
                *rest_routes(self.state, self._rest_token),
                *token_routes(self.state, self._oauth_clients),
                *control_routes(self.state),
            ]
        )

    def start(self) -> None:
        """Serve in a thread until `stop`."""
        config = uvicorn.Config(
            self._app(), log_level="critical", lifespan="on", timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake host did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def drive_run(
    api_url: str,
    *,
    tenant: str,
    issuer: str,
    private_key_pem: bytes,
    principal: str,
    agent: str,
    text: str,
    timeout_s: float = 60,
) -> Any:
    """What the host product does to ask Writ for work: start a run through the SDK over
    HTTP and wait for its result (the host's own `writ_client`, as any host would)."""
    from writ_client import Client, Issuer

    signer = Issuer(tenant=tenant, issuer=issuer, private_key_pem=private_key_pem)
    async with Client(api_url, signer, principal) as client:
        return await client.run(agent, text, timeout_s=timeout_s)


def main(argv: list[str] | None = None) -> None:
    """Serve the fake host until SIGTERM or SIGINT."""
    import os
    import signal

    parser = argparse.ArgumentParser(prog="python -m fakes.host", description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mcp-token-file", type=Path, required=True)
    parser.add_argument("--rest-token-file", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument(
        "--oauth-clients-file",
        type=Path,
        help='JSON {"<client id>": "<secret>"}: the token endpoint\'s clients',
    )
    parser.add_argument(
        "--receipt-keys-file", type=Path, help="Writ's receipt keys (JWKS): writes need a receipt"
    )
    parser.add_argument(
        "--legacy-sse",
        action="store_true",
        help="serve MCP over the legacy HTTP+SSE transport only",
    )
    args = parser.parse_args(argv)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    with FakeHost(
        mcp_token=args.mcp_token_file.read_text().strip(),
        rest_token=args.rest_token_file.read_text().strip(),
        host=args.host,
        port=args.port,
        legacy_sse=args.legacy_sse,
        oauth_clients=json.loads(args.oauth_clients_file.read_text())
        if args.oauth_clients_file
        else None,
    ) as fake:
        fake.state.receipts = _receipts.load(args.receipt_keys_file)
        if args.ready_file is not None:
            tmp = args.ready_file.with_name(f".{args.ready_file.name}.{os.getpid()}.tmp")
            tmp.write_text(fake.url)
            os.replace(tmp, args.ready_file)
        print(fake.url, flush=True)
        done.wait()
