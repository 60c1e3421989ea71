"""A simulated CRM: a real loopback HTTP server that can fail, slow down or lose responses."""

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
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

__all__ = ["DEFAULT_CUSTOMERS", "MAX_BODY_BYTES", "MAX_KEY_CHARS", "MODES", "FakeCrm", "main"]

MAX_BODY_BYTES: Final = 64 * 1024
MAX_KEY_CHARS: Final = 255
MODES: Final = frozenset({"normal", "fail", "slow", "lose_response"})
DEFAULT_CUSTOMERS: Final = {"ACME-42": "Acme Corporation"}
# Below this an oversized body is drained before the 413, because closing a socket with unread
# bytes makes the kernel send a reset and the client would never read our answer.
_DRAIN_LIMIT: Final = 1 << 20
_NOTES_PATH: Final = re.compile(r"/v1/customers/([^/]+)/notes")
_CUSTOMER_PATH: Final = re.compile(r"/v1/customers/([^/]+)")
_CUSTOMER_ID: Final = re.compile(r"[^/\s]{1,255}")


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
    count: int | None = None  # note POSTs left in this mode; None = until changed
    delay_s: float = 0.0


class _State:
    """Customers, notes and the fault mode; every method holds the lock for its whole body."""

    def __init__(self, customers: dict[str, str]) -> None:
        self.lock = threading.Lock()
        self._seed = customers
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.names = dict(self._seed)
            self.revisions = dict.fromkeys(self._seed, 1)
            self.notes: list[dict[str, Any]] = []
            self.replies: dict[str, dict[str, Any]] = {}  # idempotency key -> first 201 body
            self.calls = 0
            self.mode = _Mode()

    def take_mode(self) -> _Mode:
        with self.lock:
            mode = self.mode
            if mode.count is not None:
                mode.count -= 1
                if mode.count <= 0:
                    self.mode = _Mode()
            return mode

    def create_note(self, customer_id: str, key: str, body: str, if_match: str | None) -> _Reply:
        with self.lock:
            # The key goes before If-Match: retrying a note whose response was lost must replay
            # it, although the revision has moved on since.
            if (done := self.replies.get(key)) is not None:
                if (done["customer_id"], done["body"]) != (customer_id, body):
                    raise _HttpError(409, "idempotency key reused with a different request")
                return _Reply(200, done, {"Idempotent-Replayed": "true"})
            if customer_id not in self.revisions:
                raise _HttpError(404, "customer not found")
            current = f"r{self.revisions[customer_id]}"
            if if_match is not None and if_match != current:
                raise _HttpError(412, "revision mismatch", revision=current)
            self.revisions[customer_id] += 1
            note = {
                "note_id": f"note_{len(self.notes) + 1}",
                "customer_id": customer_id,
                "body": body,
                "idempotency_key": key,
                "created_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            }
            self.notes.append(note)
            self.replies[key] = {**note, "revision": f"r{self.revisions[customer_id]}"}
            return _Reply(201, self.replies[key])

    def customer(self, customer_id: str) -> dict[str, str]:
        with self.lock:
            if customer_id not in self.revisions:
                raise _HttpError(404, "customer not found")
            revision = f"r{self.revisions[customer_id]}"
            return {
                "customer_id": customer_id,
                "name": self.names[customer_id],
                "revision": revision,
            }


class FakeCrm:
    """The CRM that Writ's connectors call, served over HTTP on loopback."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str,
        customers: dict[str, str] | None = None,
    ) -> None:
        if not token:
            raise ValueError("token must not be empty")
        state = _State(dict(DEFAULT_CUSTOMERS if customers is None else customers))
        # Bind now so `url` is known before start(), e.g. to hand to a subprocess.
        self._server = _Server((host, port), token=token.encode(), state=state)
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

    def __enter__(self) -> FakeCrm:
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
        if reply is None:  # lose_response: the effect happened, the answer never leaves
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
        notes = _NOTES_PATH.fullmatch(path) if method == "POST" else None
        if notes:
            with state.lock:
                state.calls += 1  # every note POST counts, including those refused below
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), self.server.token):
            raise _HttpError(401, "unauthorized")
        if notes:
            return self._post_note(unquote(notes[1]))
        if method == "GET" and (customer := _CUSTOMER_PATH.fullmatch(path)):
            return _Reply(200, state.customer(unquote(customer[1])))
        if (method, path) == ("GET", "/v1/notes"):
            if not (keys := parse_qs(url.query).get("idempotency_key")):
                raise _HttpError(400, "idempotency_key query parameter required")
            with state.lock:
                return _Reply(
                    200, {"notes": [n for n in state.notes if n["idempotency_key"] == keys[0]]}
                )
        raise _HttpError(404, "not found")

    def _post_note(self, customer_id: str) -> _Reply | None:
        req = self._json()
        if not isinstance(req, dict) or not isinstance(body := req.get("body"), str):
            raise _HttpError(400, "body must be a string")
        if not (key := self.headers.get("Idempotency-Key")):
            raise _HttpError(400, "idempotency key required")
        if len(key) > MAX_KEY_CHARS:
            raise _HttpError(400, f"idempotency key longer than {MAX_KEY_CHARS} chars")
        # Only well-formed, authorized requests use up the mode, so `count` is predictable.
        mode = self.server.state.take_mode()
        if mode.name == "fail":
            raise _HttpError(503, "unavailable")
        if mode.name == "slow":
            self.server.stopping.wait(mode.delay_s)  # stop() cuts the sleep short
        reply = self.server.state.create_note(customer_id, key, body, self.headers.get("If-Match"))
        return None if mode.name == "lose_response" else reply

    def _control(self, method: str, path: str) -> _Reply:
        state = self.server.state
        if (method, path) == ("GET", "/_control/notes"):
            with state.lock:
                return _Reply(200, list(state.notes))
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
        if (method, path) == ("POST", "/_control/customers"):
            req = self._json()
            cid, name = (
                (req.get("customer_id"), req.get("name")) if isinstance(req, dict) else (0, 0)
            )
            if not isinstance(cid, str) or not _CUSTOMER_ID.fullmatch(cid):
                raise _HttpError(400, "customer_id must be 1..255 chars without '/' or spaces")
            if not isinstance(name, str):
                raise _HttpError(400, "name must be a string")
            with state.lock:
                state.names[cid], state.revisions[cid] = name, 1
            return _Reply(201, {"customer_id": cid, "name": name, "revision": "r1"})
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
    """Serve the fake CRM until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m fakes.crm", description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path)
    args = parser.parse_args(argv)
    if not (token := args.token_file.read_text().strip()):
        parser.error(f"{args.token_file} is empty")
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    with FakeCrm(host=args.host, port=args.port, token=token) as crm:
        if args.ready_file is not None:
            tmp = args.ready_file.with_name(f".{args.ready_file.name}.{os.getpid()}.tmp")
            tmp.write_text(crm.url)
            os.replace(tmp, args.ready_file)  # pollers never see a half-written file
        print(crm.url, flush=True)
        done.wait()


if __name__ == "__main__":
    main()
