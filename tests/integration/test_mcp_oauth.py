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


# -- the MCP authorization spec: discovery, resource indicators, audiences --------------------


async def test_the_token_endpoint_is_discovered_and_the_token_is_bound_to_the_server(
    host: FakeHost, tmp_path: Path
) -> None:
    """No token URL registered: the protected-resource metadata (RFC 9728) names the
    authorization server, whose metadata (RFC 8414) names the token endpoint; the token is
    asked for this server's URL as its `resource` (RFC 8707) and read with."""
    path = tmp_path / "discover.json"
    path.write_text(json.dumps({"client_id": CLIENT_ID, "client_secret": SECRET}))
    server = ServerConfig(
        url=f"{host.url}/mcp",
        credential_file=str(path),
        tools=["ticket.get"],
        timeout_s=5.0,
        auth="client_credentials",
    )
    client = McpClient()
    assert await client.session(server, _read_ticket) == "Invoice address"
    assert await client.session(server, _read_ticket) == "Invoice address"
    seen = _seen(host)
    assert seen["metadata_reads"] == 1  # discovered once
    assert seen["token_resources"] == [f"{host.url}/mcp"]  # one token, for this audience
    assert seen["tool_calls"] == {"ticket.get": 2} and seen["audience_refusals"] == 0


async def test_a_registered_token_url_still_sends_the_resource(
    host: FakeHost, tmp_path: Path
) -> None:
    assert await McpClient().session(_server(host, tmp_path), _read_ticket) == "Invoice address"
    assert _seen(host)["token_resources"] == [f"{host.url}/mcp"]


async def test_the_host_refuses_a_token_got_for_another_resource(host: FakeHost) -> None:
    """The fake host's audience check: a token its authorization server issued for its REST
    API, or with no resource at all, does not open its MCP server; the 401 says where the
    resource's metadata is."""
    async with httpx.AsyncClient(base_url=host.url) as http:
        for resource in (f"{host.url}/api/v1", None):
            form = {"grant_type": "client_credentials"}
            if resource:
                form["resource"] = resource
            issued = await http.post("/oauth/token", data=form, auth=(CLIENT_ID, SECRET))
            assert issued.status_code == 200, issued.text
            token = issued.json()["access_token"]
            refused = await http.post(
                "/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            )
            assert refused.status_code == 401
            challenge = refused.headers["www-authenticate"]
            assert f'resource_metadata="{host.url}/.well-known/oauth-protected-resource/mcp"' in (
                challenge
            )
        elsewhere = await http.post(
            "/oauth/token",
            data={"grant_type": "client_credentials", "resource": "https://elsewhere.example/"},
            auth=(CLIENT_ID, SECRET),
        )
        assert elsewhere.status_code == 400 and elsewhere.json()["error"] == "invalid_target"
    seen = _seen(host)
    assert seen["audience_refusals"] == 2 and seen["listings"] == 0


async def test_metadata_that_names_another_resource_is_refused(
    host: FakeHost, tmp_path: Path
) -> None:
    """A server reached as `localhost` whose metadata, asked as `localhost`, names it: taken;
    the same metadata found for another URL (the resource is not the one registered): refused,
    no token asked for."""
    path = tmp_path / "discover.json"
    path.write_text(json.dumps({"client_id": CLIENT_ID, "client_secret": SECRET}))
    server = ServerConfig(
        url=f"{host.url}/mcp/v2",  # its metadata (path inserted, then the root) names /mcp
        credential_file=str(path),
        tools=["ticket.get"],
        timeout_s=5.0,
        auth="client_credentials",
    )
    with pytest.raises(McpCredentialRefused, match="names .*/mcp', not .*/mcp/v2"):
        await McpClient().session(server, _read_ticket)
    assert _seen(host)["tokens_issued"] == 0
