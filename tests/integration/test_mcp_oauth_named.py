"""The protected-resource metadata a server's 401 names (RFC 9728 §5.1,
`WWW-Authenticate: Bearer resource_metadata="…"`), at a location no client would guess: followed
on the server's own origin, refused on another unless the registration names that origin, and
the authorization server it names held to the same rule. Real servers on loopback: the fake
host (MCP server and authorization server) and a second origin serving metadata documents,
each counting what it was asked."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from fakes.host import FakeHost
from services.retrieval.mcp import McpClient, McpCredentialRefused, McpUnavailable, ServerConfig
from services.retrieval.mcp.client import McpSession

pytestmark = pytest.mark.anyio

CLIENT_ID, SECRET = "writ-retrieval", "s3cret-of-the-client"


@pytest.fixture(scope="module", params=["streamable_http", "sse"])
def host(request: pytest.FixtureRequest) -> Iterator[FakeHost]:
    with FakeHost(
        mcp_token="static-token-not-given-to-writ",
        rest_token="rest",
        legacy_sse=request.param == "sse",
        oauth_clients={CLIENT_ID: SECRET},
    ) as fake:
        yield fake


class Elsewhere:
    """Another origin on loopback: `GET /prm` is metadata naming the host's `/mcp` and its
    authorization server; `GET /prm-other-as` names an authorization server on a third origin.
    `asked` lists every path it was asked for."""

    def __init__(self, host: FakeHost) -> None:
        documents = {
            "/prm": {"resource": f"{host.url}/mcp", "authorization_servers": [host.url]},
            "/prm-other-as": {
                "resource": f"{host.url}/mcp",
                "authorization_servers": ["http://127.0.0.1:9"],
            },
        }
        asked: list[str] = []
        self.asked = asked

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                asked.append(self.path)
                if self.path in ("/endless", "/drip"):
                    self._stream(drip=self.path == "/drip")
                    return
                body = json.dumps(documents.get(self.path, {})).encode()
                self.send_response(200 if self.path in documents else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _stream(self, *, drip: bool) -> None:
                """An answer that never ends: 64 KiB at a time, or a byte every 0.2 s."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                try:
                    self.wfile.write(b"[")
                    while True:
                        self.wfile.write(b" " if drip else b" " * 65536)
                        self.wfile.flush()
                        if drip:
                            time.sleep(0.2)
                except OSError:  # the client hung up
                    return

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def elsewhere(host: FakeHost) -> Iterator[Elsewhere]:
    other = Elsewhere(host)
    yield other
    other.close()


@pytest.fixture(autouse=True)
def _fresh(host: FakeHost) -> Iterator[None]:
    httpx.post(f"{host.url}/_control/revoke_tokens").raise_for_status()
    httpx.post(f"{host.url}/_control/reset").raise_for_status()
    yield
    httpx.post(f"{host.url}/_control/reset").raise_for_status()


def _name(host: FakeHost, named: str | None, *, well_known: bool = False) -> None:
    httpx.post(
        f"{host.url}/_control/metadata", json={"named": named, "well_known": well_known}
    ).raise_for_status()


def _revoke(host: FakeHost) -> None:
    """The host forgets every access token it issued: Writ's cached one is refused next."""
    httpx.post(f"{host.url}/_control/revoke_tokens").raise_for_status()


def _server(host: FakeHost, tmp_path: Path, auth_origins: list[str] | None = None) -> ServerConfig:
    path = tmp_path / "discover.json"
    path.write_text(json.dumps({"client_id": CLIENT_ID, "client_secret": SECRET}))
    return ServerConfig(
        url=f"{host.url}/mcp",
        credential_file=str(path),
        tools=["ticket.get"],
        timeout_s=5.0,
        auth="client_credentials",
        auth_origins=auth_origins or [],
    )


def _seen(host: FakeHost) -> dict[str, Any]:
    return dict(httpx.get(f"{host.url}/_control/state").json())


async def _read_ticket(session: McpSession) -> str:
    await session.list_tools()
    result = await session.call_tool("ticket.get", {"ticket_id": "T-1002"})
    assert isinstance(result.structured_content, dict)
    return str(result.structured_content["subject"])


async def test_the_metadata_a_401_names_on_the_servers_origin_is_followed(
    host: FakeHost, tmp_path: Path
) -> None:
    """The well-known locations answer 404; only the URL the 401 names has the metadata."""
    _name(host, "/oauth/metadata/mcp")
    assert await McpClient().session(_server(host, tmp_path), _read_ticket) == "Invoice address"
    seen = _seen(host)
    assert seen["metadata_reads"] == 1
    assert seen["token_resources"] == [f"{host.url}/mcp"]
    assert seen["tool_calls"] == {"ticket.get": 1}


async def test_without_a_named_url_the_well_known_location_is_read(
    host: FakeHost, tmp_path: Path
) -> None:
    """The same server with the well-known location shut: nothing names the metadata, so
    there is none to find, and nothing is asked for."""
    _name(host, None)
    with pytest.raises(McpCredentialRefused, match="no protected-resource metadata at"):
        await McpClient().session(_server(host, tmp_path), _read_ticket)
    assert _seen(host)["tokens_issued"] == 0


async def test_metadata_named_on_another_origin_is_refused_and_never_asked(
    host: FakeHost, tmp_path: Path, elsewhere: Elsewhere
) -> None:
    _name(host, f"{elsewhere.url}/prm")
    with pytest.raises(McpCredentialRefused, match="not on the server's origin"):
        await McpClient().session(_server(host, tmp_path), _read_ticket)
    assert elsewhere.asked == []
    seen = _seen(host)
    assert seen["tokens_issued"] == 0 and seen["listings"] == 0 and seen["tool_calls"] == {}


async def test_metadata_named_on_an_origin_the_registration_names_is_followed(
    host: FakeHost, tmp_path: Path, elsewhere: Elsewhere
) -> None:
    _name(host, f"{elsewhere.url}/prm")
    server = _server(host, tmp_path, auth_origins=[elsewhere.url])
    assert await McpClient().session(server, _read_ticket) == "Invoice address"
    assert elsewhere.asked == ["/prm"]
    seen = _seen(host)
    assert seen["token_resources"] == [f"{host.url}/mcp"]
    assert seen["tool_calls"] == {"ticket.get": 1}


async def test_an_authorization_server_on_an_origin_nobody_named_is_refused(
    host: FakeHost, tmp_path: Path, elsewhere: Elsewhere
) -> None:
    """The metadata (on a named origin) names an authorization server on a third origin:
    Writ's client secret is not sent there, nor is its metadata asked for."""
    _name(host, f"{elsewhere.url}/prm-other-as")
    server = _server(host, tmp_path, auth_origins=[elsewhere.url])
    with pytest.raises(
        McpCredentialRefused, match="authorization server .* at .http://127.0.0.1:9.,"
    ):
        await McpClient().session(server, _read_ticket)
    assert elsewhere.asked == ["/prm-other-as"]
    assert _seen(host)["tokens_issued"] == 0


async def test_a_token_refused_later_has_the_metadata_its_401_names_now_read(
    host: FakeHost, tmp_path: Path, elsewhere: Elsewhere
) -> None:
    """The server moves its metadata after Writ got a token, and refuses that token: the next
    read follows the location the refusal names now before it gets a fresh token, under the
    same origin rules (an authorization server nobody named is refused, nothing called)."""
    _name(host, "/oauth/metadata/mcp")
    client = McpClient()
    server = _server(host, tmp_path, auth_origins=[elsewhere.url])
    assert await client.session(server, _read_ticket) == "Invoice address"
    assert elsewhere.asked == []

    _name(host, f"{elsewhere.url}/prm")
    _revoke(host)
    assert await client.session(server, _read_ticket) == "Invoice address"
    assert elsewhere.asked == ["/prm"]
    seen = _seen(host)
    assert seen["token_resources"] == [f"{host.url}/mcp"] * 2
    assert seen["tool_calls"] == {"ticket.get": 2}

    _name(host, f"{elsewhere.url}/prm-other-as")
    _revoke(host)
    with pytest.raises(
        McpCredentialRefused, match="authorization server .* at .http://127.0.0.1:9.,"
    ):
        await client.session(server, _read_ticket)
    assert elsewhere.asked == ["/prm", "/prm-other-as"]
    seen = _seen(host)
    assert len(seen["token_resources"]) == 2 and seen["tool_calls"] == {"ticket.get": 2}


@pytest.mark.parametrize(
    ("path", "said"), [("/endless", "over 16 KiB"), ("/drip", "took over 3 s")]
)
async def test_metadata_that_never_ends_is_given_up_on_in_bounded_time(
    host: FakeHost, tmp_path: Path, elsewhere: Elsewhere, path: str, said: str
) -> None:
    """An answer that streams forever is read up to 16 KiB, one that comes a byte at a time
    is bounded as a session is: refused in seconds, never holding the read, nothing called."""
    _name(host, f"{elsewhere.url}{path}")
    server = msgspec.structs.replace(
        _server(host, tmp_path, auth_origins=[elsewhere.url]), timeout_s=1.0
    )
    with anyio.fail_after(20):
        with pytest.raises(McpUnavailable, match=said):
            await McpClient().session(server, _read_ticket)
    assert elsewhere.asked == [path]
    seen = _seen(host)
    assert seen["tokens_issued"] == 0 and seen["tool_calls"] == {}
