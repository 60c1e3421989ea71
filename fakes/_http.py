"""Plumbing shared by the fakes: a loopback JSON-over-HTTP server with switchable fault modes."""

from __future__ import annotations

import argparse
import hmac
import json
import os
import signal
import socket
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Generic, Self, TypeVar
from urllib.parse import SplitResult, urlsplit

from fakes import _receipts
from fakes._receipts import KeyFile

__all__ = [
    "MAX_BODY_BYTES",
    "MODES",
    "Handler",
    "HttpError",
    "LoopbackFake",
    "Mode",
    "Reply",
    "Server",
    "State",
    "arg_parser",
    "hang_up",
    "serve",
]

MAX_BODY_BYTES: Final = 64 * 1024
MODES: Final = frozenset({"normal", "fail", "slow", "lose_response"})
MAX_LOG: Final = 100_000  # calls the log keeps, the oldest dropped first
# Below this an oversized body is drained before the 413, because closing a socket with unread
# bytes makes the kernel send a reset and the client would never read our answer.
_DRAIN_LIMIT: Final = 1 << 20


@dataclass
class Reply:
    """A JSON answer: status, body, extra headers and whether to close the connection after it."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False


class HttpError(Exception):
    """Raised anywhere in a handler to answer with `{"error": ..., **extra}` instead."""

    def __init__(self, status: int, error: str, *, close: bool = False, **extra: Any) -> None:
        super().__init__(error)
        self.reply = Reply(status, {"error": error, **extra}, close=close)


@dataclass
class Mode:
    """A fault mode set through `POST /_control/mode`."""

    name: str = "normal"
    count: int | None = None  # fault-prone POSTs left in this mode; None = until changed
    delay_s: float = 0.0


class State:
    """The call count and fault mode every fake keeps; every method holds `lock` throughout."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget everything: back to the seed data, no calls, normal mode."""
        with self.lock:
            self.calls = 0
            self.mode = Mode()
            self.log: deque[dict[str, Any]] = deque(maxlen=MAX_LOG)
            self._clear()

    def _clear(self) -> None:
        """Reset the fake's own data; called with `lock` held."""

    def count_call(self) -> None:
        """Count one call to the fake's fault-prone endpoint."""
        with self.lock:
            self.calls += 1

    def note(self, kind: str, key: str | None, *, answered: bool) -> None:
        """Log one call that acted (`write`) or asked (`lookup`) under `key`, and whether its
        answer left (`GET /_control/log`: what a crash matrix reads as its evidence)."""
        with self.lock:
            self.log.append({"kind": kind, "key": key, "answered": answered})

    def take_mode(self) -> Mode:
        """The mode for this call, using up one of its `count`."""
        with self.lock:
            mode = self.mode
            if mode.count is not None:
                mode.count -= 1
                if mode.count <= 0:
                    self.mode = Mode()
            return mode


S = TypeVar("S", bound=State)


class Server(ThreadingHTTPServer, Generic[S]):
    """A threading HTTP server that tracks its connections so that stop() can hang them up."""

    # Non-daemon handler threads so server_close() joins them and stop() leaves nothing behind.
    daemon_threads = False

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[Handler],
        *,
        token: bytes,
        state: S,
        backlog: int = ThreadingHTTPServer.request_queue_size,
    ) -> None:
        self.token, self.state = token, state
        self.receipts: KeyFile | None = None  # set: writes need an approval receipt
        self.request_queue_size = backlog  # listen() reads it while super().__init__ binds
        self.stopping = threading.Event()
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def hang_up_all(self) -> None:
        """Shut down every open connection."""
        # Idle keep-alive connections would otherwise block server_close() forever.
        with self._open_lock:
            for conn in self._open:
                _hang_up(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients vanishing mid-request is routine here (timeouts, lost responses, stop()).
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def hang_up(conn: socket.socket) -> None:
    """Shut the connection down at once, whatever was or was not sent on it."""
    _hang_up(conn)


def _hang_up(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # the peer is already gone


class Handler(BaseHTTPRequestHandler):
    """Reads bounded bodies, answers health and shared control requests, and writes JSON."""

    protocol_version = "HTTP/1.1"  # keep-alive like a real API, so a lost response is realistic
    disable_nagle_algorithm = True  # else headers and body go in two segments: +40 ms per call
    server: Server[Any]

    def log_message(self, format: str, *args: Any) -> None:
        pass  # request logs on stderr would bury real test failures

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        try:
            # Read every body first: with keep-alive, unread bytes would parse as the next request.
            self._raw = self._read_body()
            reply = self._route(method, urlsplit(self.path))
        except HttpError as exc:
            reply = exc.reply
        if reply is None:  # lose_response: the effect happened, the answer never leaves
            self.close_connection = True
            _hang_up(self.connection)
            return
        self._send(reply)

    def _send(self, reply: Reply) -> None:
        """Write `reply` as a JSON response."""
        data = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str, url: SplitResult) -> Reply | None:
        if (method, url.path) == ("GET", "/healthz"):
            return Reply(200, {"status": "ok"})
        if url.path.startswith("/_control/"):
            return self._control(method, url.path)
        return self._route_api(method, url)

    def _route_api(self, method: str, url: SplitResult) -> Reply | None:
        """Answer a request outside /healthz and /_control/; None loses the response."""
        raise HttpError(404, "not found")

    def _control(self, method: str, path: str) -> Reply:
        state = self.server.state
        if (method, path) == ("GET", "/_control/calls"):
            with state.lock:
                return Reply(200, {"calls": state.calls})
        if (method, path) == ("GET", "/_control/log"):
            with state.lock:
                return Reply(200, {"log": list(state.log)})
        if (method, path) == ("POST", "/_control/reset"):
            state.reset()
            return Reply(200, {"ok": True})
        if (method, path) == ("POST", "/_control/mode"):
            mode = _parse_mode(self._json())
            with state.lock:
                state.mode = mode
            return Reply(200, {"mode": mode.name, "count": mode.count, "delay_s": mode.delay_s})
        return self._route_control(method, path)

    def _route_control(self, method: str, path: str) -> Reply:
        """Answer a fake's own /_control/ request."""
        raise HttpError(404, "not found")

    def _authorize(self) -> None:
        """Refuse the request with a 401 unless it carries the bearer token."""
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), self.server.token):
            raise HttpError(401, "unauthorized")

    def _check_receipt(self, key: str | None) -> None:
        """Refuse (403, a typed `reason`) a write without a receipt for its body and key."""
        if self.server.receipts is None:
            return
        try:
            self.server.receipts.check(self.headers.get(_receipts.HEADER), self._raw, key or "")
        except _receipts.ReceiptRefused as exc:
            raise HttpError(403, "approval receipt refused", reason=exc.reason) from None

    def _under_mode(self, effect: Callable[[], Reply], key: str | None = None) -> Reply | None:
        """Run `effect` as the current fault mode says; None means lose the response. A write
        that acted is logged under `key`, with whether its answer left."""
        # Only well-formed, authorized requests get here to use up the mode, so `count` is
        # predictable.
        mode = self.server.state.take_mode()
        if mode.name == "fail":
            raise HttpError(503, "unavailable")
        if mode.name == "slow":
            self.server.stopping.wait(mode.delay_s)  # stop() cuts the sleep short
        reply = effect()
        lost = mode.name == "lose_response"
        self.server.state.note("write", key, answered=not lost)
        return None if lost else reply

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise HttpError(411, "content-length required", close=True)
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0:
            raise HttpError(400, "bad content-length", close=True)
        if length > MAX_BODY_BYTES:
            if length <= _DRAIN_LIMIT:
                self.rfile.read(length)
            raise HttpError(413, "request body too large", close=True)
        return self.rfile.read(length)

    def _json(self) -> Any:
        """The request body parsed as JSON, or a 400."""
        try:
            return json.loads(self._raw)
        except (ValueError, RecursionError):
            raise HttpError(400, "malformed JSON") from None


def _parse_mode(req: Any) -> Mode:
    if not isinstance(req, dict) or req.get("mode") not in MODES:
        raise HttpError(400, f"mode must be one of {sorted(MODES)}")
    count, delay = req.get("count"), req.get("delay_s", 0.0)
    if count is not None and (type(count) is not int or count < 1):
        raise HttpError(400, "count must be a positive integer or null")
    if type(delay) not in (int, float) or not 0 <= delay <= 600:
        raise HttpError(400, "delay_s must be a number of seconds in [0, 600]")
    return Mode(req["mode"], count, float(delay))


class LoopbackFake:
    """Start, stop and context-manager handling around a bound Server."""

    def __init__(self, server: Server[Any]) -> None:
        self._server = server
        self._thread: threading.Thread | None = None
        self._stopped = False

    def require_receipts(self, keys: KeyFile | None) -> None:
        """From now on, refuse writes without an approval receipt verified by `keys` (None:
        check none)."""
        self._server.receipts = keys

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:53211."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        """Serve in a daemon thread."""
        # A short poll interval keeps stop() fast; shutdown() waits for the next poll.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, hang up open connections and wait for their handler threads."""
        if self._stopped:
            return
        self._stopped = True
        self._server.stopping.set()
        if self._thread is not None:
            self._server.shutdown()  # waits for serve_forever, so only once it has run
            self._thread.join()
        self._server.hang_up_all()
        self._server.server_close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def arg_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """A parser with the options every fake's `main()` takes."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument(
        "--receipt-keys-file", type=Path, help="Writ's receipt keys (JWKS): writes need a receipt"
    )
    return parser


def serve(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    make: Callable[[argparse.Namespace, str], LoopbackFake],
) -> None:
    """Parse `argv`, then serve `make(args, token)` until SIGTERM or SIGINT."""
    args = parser.parse_args(argv)
    if not (token := args.token_file.read_text().strip()):
        parser.error(f"{args.token_file} is empty")
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    with make(args, token) as fake:
        fake.require_receipts(_receipts.load(args.receipt_keys_file))
        if args.ready_file is not None:
            tmp = args.ready_file.with_name(f".{args.ready_file.name}.{os.getpid()}.tmp")
            tmp.write_text(fake.url)
            os.replace(tmp, args.ready_file)  # pollers never see a half-written file
        print(fake.url, flush=True)
        done.wait()
