"""An MCP registration whose credential is OAuth 2.0 client credentials: retrieval's client
gets an access token at the host's token endpoint and reads with it. Real servers on loopback
(the fake host's MCP server and its authorization server); each test asserts what the host
itself saw: tokens issued and refused, listings, calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakes.host import FakeHost
from services.retrieval.mcp import McpClient, McpCredentialRefused, ServerConfig
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


@pytest.fixture(autouse=True)
def _fresh(host: FakeHost) -> None:
    httpx.post(f"{host.url}/_control/revoke_tokens").raise_for_status()
    httpx.post(f"{host.url}/_control/reset").raise_for_status()


def _server(host: FakeHost, tmp_path: Path, **credentials: Any) -> ServerConfig:
    path = tmp_path / "mcp-client.json"
    path.write_text(
        json.dumps(
            {
                "client_id": CLIENT_ID,
                "client_secret": SECRET,
                "token_url": f"{host.url}/oauth/token",
                **credentials,
            }
        )
    )
    return ServerConfig(
        url=f"{host.url}/mcp",
        credential_file=str(path),
        tools=["ticket.get"],
        timeout_s=5.0,
        auth="client_credentials",
    )


def _seen(host: FakeHost) -> dict[str, Any]:
    return dict(httpx.get(f"{host.url}/_control/state").json())


async def _read_ticket(session: McpSession) -> str:
    await session.list_tools()
    result = await session.call_tool("ticket.get", {"ticket_id": "T-1002"})
    assert isinstance(result.structured_content, dict)
    return str(result.structured_content["subject"])


async def test_a_read_works_with_client_credentials_and_reuses_the_token(
    host: FakeHost, tmp_path: Path
) -> None:
    client, server = McpClient(), _server(host, tmp_path)
    assert await client.session(server, _read_ticket) == "Invoice address"
    assert await client.session(server, _read_ticket) == "Invoice address"
    seen = _seen(host)
    assert seen["tokens_issued"] == 1  # the second session used the token it had
    assert seen["tool_calls"] == {"ticket.get": 2}


async def test_wrong_client_credentials_fail_clearly_and_nothing_is_read(
    host: FakeHost, tmp_path: Path
) -> None:
    server = _server(host, tmp_path, client_secret="not-the-secret")
    with pytest.raises(
        McpCredentialRefused, match=r"token endpoint refused .* \(HTTP 401: invalid_client\)"
    ):
        await McpClient().session(server, _read_ticket)
    seen = _seen(host)
    assert seen["token_refusals"] == 1 and seen["tokens_issued"] == 0
    assert seen["listings"] == 0 and seen["tool_calls"] == {}


async def test_a_revoked_token_is_replaced_once_before_anything_is_called(
    host: FakeHost, tmp_path: Path
) -> None:
    client, server = McpClient(), _server(host, tmp_path)
    assert await client.session(server, _read_ticket) == "Invoice address"
    async with httpx.AsyncClient() as control:
        (await control.post(f"{host.url}/_control/revoke_tokens")).raise_for_status()
    assert await client.session(server, _read_ticket) == "Invoice address"
    seen = _seen(host)
    assert seen["tokens_issued"] == 2
    assert seen["tool_calls"] == {"ticket.get": 2}  # the refused session called nothing


async def test_a_credential_file_that_is_not_client_credentials_is_refused(
    host: FakeHost, tmp_path: Path
) -> None:
    server = _server(host, tmp_path, audience="extra")  # an unknown field
    with pytest.raises(McpCredentialRefused, match="not client credentials.*audience"):
        await McpClient().session(server, _read_ticket)
    assert _seen(host)["tokens_issued"] == 0
