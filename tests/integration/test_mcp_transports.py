"""Retrieval's MCP client against the fake host over both transports the SDK speaks: Streamable
HTTP and the legacy HTTP+SSE one. Real servers on loopback, the real SDK on both sides; each
test asserts what the host itself saw (its calls, its SSE sessions), not only the answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakes.host import FakeHost
from services.retrieval.mcp import McpClient, McpCredentialRefused, McpUnavailable, ServerConfig
from services.retrieval.mcp.client import McpSession

pytestmark = pytest.mark.anyio

TOKEN = "mcp-token-for-transports"


@pytest.fixture(scope="module")
def legacy_host() -> Iterator[FakeHost]:
    with FakeHost(mcp_token=TOKEN, rest_token="rest", legacy_sse=True) as fake:
        yield fake


@pytest.fixture(scope="module")
def modern_host() -> Iterator[FakeHost]:
    with FakeHost(mcp_token=TOKEN, rest_token="rest") as fake:
        yield fake


@pytest.fixture
def credential(tmp_path: Path) -> Path:
    path = tmp_path / "mcp.token"
    path.write_text(TOKEN)
    return path


def _reset(host: FakeHost) -> None:
    httpx.post(f"{host.url}/_control/reset").raise_for_status()  # counters back to zero


def _snapshot(host: FakeHost) -> dict[str, Any]:
    return dict(httpx.get(f"{host.url}/_control/state").json())


def _server(host: FakeHost, credential: Path, transport: Any) -> ServerConfig:
    return ServerConfig(
        url=f"{host.url}/mcp",
        credential_file=str(credential),
        tools=["ticket.get"],
        timeout_s=5.0,
        transport=transport,
    )


async def _read_ticket(session: McpSession) -> dict[str, Any]:
    listed = {t.name for t in await session.list_tools()}
    assert "ticket.get" in listed
    result = await session.call_tool("ticket.get", {"ticket_id": "T-1001"})
    assert not result.is_error
    assert isinstance(result.structured_content, dict)
    return result.structured_content


@pytest.mark.parametrize("transport", ["auto", "sse"])
async def test_a_ticket_is_read_through_a_legacy_sse_only_server(
    legacy_host: FakeHost, credential: Path, transport: str
) -> None:
    _reset(legacy_host)
    ticket = await McpClient().session(_server(legacy_host, credential, transport), _read_ticket)
    assert ticket["ticket_id"] == "T-1001"
    assert ticket["subject"] == "Order 7781 shipped late"
    host = _snapshot(legacy_host)
    # The host saw one SSE session, one listing and exactly one call: the Streamable HTTP
    # attempt `auto` made first was refused before anything was listed or called.
    assert host["sse_sessions"] == 1
    assert host["listings"] == 1
    assert host["tool_calls"] == {"ticket.get": 1}


async def test_a_registration_pinned_to_streamable_http_does_not_fall_back(
    legacy_host: FakeHost, credential: Path
) -> None:
    _reset(legacy_host)
    with pytest.raises(McpUnavailable) as caught:
        await McpClient().session(_server(legacy_host, credential, "streamable_http"), _read_ticket)
    assert not isinstance(caught.value, McpCredentialRefused)
    host = _snapshot(legacy_host)
    assert host["sse_sessions"] == 0
    assert host["tool_calls"] == {}


async def test_a_refused_credential_is_not_taken_for_a_legacy_server(
    legacy_host: FakeHost, modern_host: FakeHost, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-the-token")
    for host, transport in ((modern_host, "auto"), (legacy_host, "auto"), (legacy_host, "sse")):
        _reset(host)
        with pytest.raises(McpCredentialRefused, match="HTTP 401"):
            await McpClient().session(_server(host, wrong, transport), _read_ticket)
        seen = _snapshot(host)
        assert seen["tool_calls"] == {} and seen["listings"] == 0
        assert seen["sse_sessions"] == 0  # a 401 is no reason to try the other transport


async def test_auto_stays_on_streamable_http_when_the_server_speaks_it(
    modern_host: FakeHost, credential: Path
) -> None:
    _reset(modern_host)
    ticket = await McpClient().session(_server(modern_host, credential, "auto"), _read_ticket)
    assert ticket["ticket_id"] == "T-1001"
    host = _snapshot(modern_host)
    assert host["sse_sessions"] == 0
    assert host["tool_calls"] == {"ticket.get": 1}
