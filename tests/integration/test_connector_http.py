"""The connectors' HTTP client against real loopback sockets: what a failure means is what
the connectors' outcomes stand on. A request no connection was given (refused, or no
connection in time) is `NotSent`; one that reached a server which then said nothing or hung up
is `NoAnswer`; a response is read whole; a burst's connections are closed once idle."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import anyio
import pytest

from services.dispatcher.connectors.http import HttpClient, NoAnswer, NotSent

pytestmark = pytest.mark.anyio


def _listener(backlog: int = 8) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)
    return sock


def _url(sock: socket.socket) -> str:
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[socket.socket], None]], str]]:
    """A loopback server answering each connection with `answer(conn)` in a thread."""
    opened: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def start(answer: Callable[[socket.socket], None]) -> str:
        sock = _listener()
        opened.append(sock)

        def loop() -> None:
            try:
                while True:
                    conn, _ = sock.accept()
                    opened.append(conn)
                    answer(conn)
            except OSError:
                return  # closed at teardown

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        threads.append(thread)
        return _url(sock)

    yield start
    for sock in opened:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes a listener's accept (Linux)
        except OSError:
            pass
        sock.close()
    for thread in threads:
        thread.join(timeout=2)


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


async def _post_raises(
    url: str, error: type[Exception], *, timeout_s: float = 2, connect_s: float = 2.0
) -> None:
    """A POST to `url` fails with `error`."""
    client = HttpClient(base_url=url, token="t", timeout_s=timeout_s, connect_s=connect_s)
    try:
        with pytest.raises(error):
            await client.request("POST", "/v1/notes", json={})
    finally:
        await client.aclose()


async def test_a_response_is_read_whole_with_the_credential_sent(serve) -> None:
    seen: list[bytes] = []

    def answer(conn: socket.socket) -> None:
        seen.append(_read_request(conn))
        body = b'{"note_id": "n1"}'
        conn.sendall(
            b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )

    client = HttpClient(base_url=serve(answer), token="t0k", timeout_s=2)
    try:
        response = await client.request(
            "POST", "/v1/notes", json={"body": "x"}, headers={"Idempotency-Key": "k1"}
        )
    finally:
        await client.aclose()
    assert (response.status_code, response.json()) == (201, {"note_id": "n1"})
    head = seen[0].decode().lower()
    assert head.startswith("post /v1/notes http/1.1")
    assert "authorization: bearer t0k" in head and "idempotency-key: k1" in head


async def test_a_refused_connection_is_not_sent() -> None:
    sock = _listener()
    url = _url(sock)
    sock.close()  # nothing listens on the port any more
    await _post_raises(url, NotSent)


async def test_no_connection_in_time_is_not_sent() -> None:
    # A listener that never accepts, its queue full: the next connection is never completed.
    sock = _listener(backlog=0)
    filler = []
    try:
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(sock.getsockname())
            filler.append(c)
        await _post_raises(_url(sock), NotSent, timeout_s=5, connect_s=0.3)
    finally:
        for c in filler:
            c.close()
        sock.close()


async def test_a_server_that_hangs_up_after_the_request_is_no_answer(serve) -> None:
    def answer(conn: socket.socket) -> None:
        _read_request(conn)
        conn.close()  # read (perhaps applied), never answered

    await _post_raises(serve(answer), NoAnswer)


async def test_a_server_that_keeps_quiet_is_no_answer(serve) -> None:
    def answer(conn: socket.socket) -> None:
        _read_request(conn)  # and nothing more: the read times out

    await _post_raises(serve(answer), NoAnswer, timeout_s=0.3)


async def test_a_response_cut_short_is_no_answer(serve) -> None:
    def answer(conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(b'HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{"note')
        conn.close()

    await _post_raises(serve(answer), NoAnswer)


async def test_a_bursts_connections_are_closed_once_idle() -> None:
    # Each connection served on its own thread, keep-alive, until the client closes it.
    sock = _listener(backlog=64)
    open_now: set[int] = set()
    lock = threading.Lock()

    def serve_one(conn: socket.socket) -> None:
        with lock:
            open_now.add(conn.fileno())
        key = conn.fileno()
        with conn:
            while _read_request(conn):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        with lock:
            open_now.discard(key)

    def accept() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    client = HttpClient(base_url=_url(sock), token="t", timeout_s=2, keep_alive_s=0.5)
    try:
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(client.request, "GET", "/v1/slow")
        assert len(open_now) > 1  # the burst took several connections, kept alive
        with anyio.fail_after(10):
            while open_now:
                await anyio.sleep(0.05)
    finally:
        await client.aclose()
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
