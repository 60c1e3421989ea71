"""A simulated payment provider that is NOT idempotent: the same reference charged twice is two
charges. It is a real loopback HTTP server that can fail, slow down or lose responses, and whose
charges can be looked up by reference only when it is `queryable`.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import re
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Final
from urllib.parse import SplitResult, parse_qs, urlsplit

__all__ = [
    "MAX_AMOUNT_CENTS",
    "MAX_BODY_BYTES",
    "MAX_DESCRIPTION_CHARS",
    "MAX_REFERENCE_CHARS",
    "MODES",
    "FakePayments",
    "main",
]

MAX_BODY_BYTES: Final = 64 * 1024
MAX_REFERENCE_CHARS: Final = 255
MAX_AMOUNT_CENTS: Final = 100_000_000
MAX_DESCRIPTION_CHARS: Final = 500
MODES: Final = frozenset({"normal", "fail", "slow", "lose_response"})
# Below this an oversized body is drained before the 413, because closing a socket with unread
# bytes makes the kernel send a reset and the client would never read our answer.
_DRAIN_LIMIT: Final = 1 << 20
_CHARGE_FIELDS: Final = frozenset({"customer_id", "amount_cents", "currency", "description"})
_CUSTOMER_ID: Final = re.compile(r"[^/\s]{1,255}")
_CURRENCY: Final = re.compile(r"[A-Z]{3}")


@dataclass
class _Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False


class _HttpError(Exception):
    def __init__(self, status: int, error: str, *, close: bool = False, **extra: Any) -> None:
        super().__init__(error)
        self.reply = _Reply(status, {"error": error, **extra}, close=close)


@dataclass
class _Mode:
    name: str = "normal"
    count: int | None = None  # charge POSTs left in this mode; None = until changed
    delay_s: float = 0.0


class _State:
    """Charges, the fault mode and lookups; every method holds the lock for its whole body."""

    def __init__(self, *, queryable: bool) -> None:
        self.lock = threading.Lock()
        self._initially_queryable = queryable
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.charges: list[dict[str, Any]] = []
            self.calls = 0
            self.mode = _Mode()
            self.queryable = self._initially_queryable

    def take_mode(self) -> _Mode:
        with self.lock:
            mode = self.mode
            if mode.count is not None:
                mode.count -= 1
                if mode.count <= 0:
                    self.mode = _Mode()
            return mode

    def create_charge(self, fields: dict[str, Any], reference: str | None) -> _Reply:
        with self.lock:
            # Deliberately no lookup of `reference` here: this provider does not dedupe, so a
            # retry after a lost response charges the customer a second time.
            charge = {
                "charge_id": f"ch_{len(self.charges) + 1}",
                "reference": reference,
                "customer_id": fields["customer_id"],
                "amount_cents": fields["amount_cents"],
                "currency": fields["currency"],
                "description": fields["description"],
                "status": "captured",
                "created_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            }
            self.charges.append(charge)
            return _Reply(201, dict(charge))

    def find(self, reference: str | None) -> _Reply:
        with self.lock:
            # An unqueryable provider has no such endpoint, whatever the query says.
            if not self.queryable:
                raise _HttpError(404, "lookup not supported")
            if reference is None:
                raise _HttpError(400, "reference query parameter required")
            return _Reply(
                200, {"charges": [dict(c) for c in self.charges if c["reference"] == reference]}
            )


class FakePayments:
    """The payment provider that Writ's payment connector calls, served over HTTP on loopback."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str,
        queryable: bool = False,
    ) -> None:
        if not token:
            raise ValueError("token must not be empty")
        # Bind now so `url` is known before start(), e.g. to hand to a subprocess.
        self._server = _Server(
            (host, port), token=token.encode(), state=_State(queryable=queryable)
        )
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:53211."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

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

    def __enter__(self) -> FakePayments:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _Server(ThreadingHTTPServer):
    # Non-daemon handler threads so server_close() joins them and stop() leaves nothing behind.
    daemon_threads = False
    # The default backlog of 5 drops SYNs under a burst of concurrent charges, which costs the
    # client a one-second retransmit per dropped connection.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], *, token: bytes, state: _State) -> None:
        self.token, self.state = token, state
        self.stopping = threading.Event()
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def hang_up_all(self) -> None:
        # Idle keep-alive connections would otherwise block server_close() forever.
        with self._open_lock:
            for conn in self._open:
                _hang_up(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients vanishing mid-request is routine here (timeouts, lost responses, stop()).
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def _hang_up(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # the peer is already gone


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive like a real API, so a lost response is realistic
    disable_nagle_algorithm = True  # else headers and body go in two segments: +40 ms per call
    server: _Server

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
        except _HttpError as exc:
            reply = exc.reply
        if reply is None:  # lose_response: the charge happened, the answer never leaves
            self.close_connection = True
            _hang_up(self.connection)
            return
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

    def _route(self, method: str, url: SplitResult) -> _Reply | None:
        state, path = self.server.state, url.path
        if (method, path) == ("GET", "/healthz"):
            return _Reply(200, {"status": "ok"})
        if path.startswith("/_control/"):
            return self._control(method, path)
        charge = (method, path) == ("POST", "/v1/charges")
        if charge:
            with state.lock:
                state.calls += 1  # every charge POST counts, including those refused below
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), self.server.token):
            raise _HttpError(401, "unauthorized")
        if charge:
            return self._post_charge()
        if (method, path) == ("GET", "/v1/charges"):
            references = parse_qs(url.query).get("reference")
            return state.find(references[0] if references else None)
        raise _HttpError(404, "not found")

    def _post_charge(self) -> _Reply | None:
        fields = _parse_charge(self._json())
        reference = self.headers.get("Reference")
        if reference is not None and not 1 <= len(reference) <= MAX_REFERENCE_CHARS:
            raise _HttpError(400, f"reference must be 1..{MAX_REFERENCE_CHARS} chars")
        # Only well-formed, authorized requests use up the mode, so `count` is predictable.
        mode = self.server.state.take_mode()
        if mode.name == "fail":
            raise _HttpError(503, "unavailable")
        if mode.name == "slow":
            self.server.stopping.wait(mode.delay_s)  # stop() cuts the sleep short
        reply = self.server.state.create_charge(fields, reference)
        return None if mode.name == "lose_response" else reply

    def _control(self, method: str, path: str) -> _Reply:
        state = self.server.state
        if (method, path) == ("GET", "/_control/charges"):
            with state.lock:
                return _Reply(200, [dict(c) for c in state.charges])
        if (method, path) == ("GET", "/_control/calls"):
            with state.lock:
                return _Reply(200, {"calls": state.calls})
        if (method, path) == ("POST", "/_control/reset"):
            state.reset()
            return _Reply(200, {"ok": True})
        if (method, path) == ("POST", "/_control/mode"):
            mode = _parse_mode(self._json())
            with state.lock:
                state.mode = mode
            return _Reply(200, {"mode": mode.name, "count": mode.count, "delay_s": mode.delay_s})
        if (method, path) == ("POST", "/_control/queryable"):
            req = self._json()
            if not isinstance(req, dict) or not isinstance(queryable := req.get("queryable"), bool):
                raise _HttpError(400, "queryable must be a boolean")
            with state.lock:
                state.queryable = queryable
            return _Reply(200, {"queryable": queryable})
        raise _HttpError(404, "not found")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise _HttpError(411, "content-length required", close=True)
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0:
            raise _HttpError(400, "bad content-length", close=True)
        if length > MAX_BODY_BYTES:
            if length <= _DRAIN_LIMIT:
                self.rfile.read(length)
            raise _HttpError(413, "request body too large", close=True)
        return self.rfile.read(length)

    def _json(self) -> Any:
        try:
            return json.loads(self._raw)
        except (ValueError, RecursionError):
            raise _HttpError(400, "malformed JSON") from None


def _parse_charge(req: Any) -> dict[str, Any]:
    if not isinstance(req, dict):
        raise _HttpError(400, "body must be a JSON object")
    if unknown := sorted(set(req) - _CHARGE_FIELDS):
        raise _HttpError(400, f"unknown fields: {', '.join(unknown)}")
    customer_id, amount = req.get("customer_id"), req.get("amount_cents")
    currency, description = req.get("currency"), req.get("description")
    if not isinstance(customer_id, str) or not _CUSTOMER_ID.fullmatch(customer_id):
        raise _HttpError(400, "customer_id must be 1..255 chars without '/' or spaces")
    # `type() is int` because JSON true would otherwise pass as a one-cent charge.
    if type(amount) is not int or not 1 <= amount <= MAX_AMOUNT_CENTS:
        raise _HttpError(400, f"amount_cents must be an integer in [1, {MAX_AMOUNT_CENTS}]")
    if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency):
        raise _HttpError(400, "currency must be three upper-case letters")
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
        raise _HttpError(400, f"description must be at most {MAX_DESCRIPTION_CHARS} chars")
    return {
        "customer_id": customer_id,
        "amount_cents": amount,
        "currency": currency,
        "description": description,
    }


def _parse_mode(req: Any) -> _Mode:
    if not isinstance(req, dict) or req.get("mode") not in MODES:
        raise _HttpError(400, f"mode must be one of {sorted(MODES)}")
    count, delay = req.get("count"), req.get("delay_s", 0.0)
    if count is not None and (type(count) is not int or count < 1):
        raise _HttpError(400, "count must be a positive integer or null")
    if type(delay) not in (int, float) or not 0 <= delay <= 600:
        raise _HttpError(400, "delay_s must be a number of seconds in [0, 600]")
    return _Mode(req["mode"], count, float(delay))


def main(argv: list[str] | None = None) -> None:
    """Serve the fake payment provider until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m fakes.payments", description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument(
        "--queryable", action="store_true", help="answer GET /v1/charges?reference=..."
    )
    args = parser.parse_args(argv)
    if not (token := args.token_file.read_text().strip()):
        parser.error(f"{args.token_file} is empty")
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    with FakePayments(
        host=args.host, port=args.port, token=token, queryable=args.queryable
    ) as payments:
        if args.ready_file is not None:
            tmp = args.ready_file.with_name(f".{args.ready_file.name}.{os.getpid()}.tmp")
            tmp.write_text(payments.url)
            os.replace(tmp, args.ready_file)  # pollers never see a half-written file
        print(payments.url, flush=True)
        done.wait()


if __name__ == "__main__":
    main()
