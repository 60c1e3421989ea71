"""Retrieval's MCP client over stdio (a local server run as a child of retrieval) and against
`@modelcontextprotocol/server-everything`, a server nobody on Writ wrote, over stdio and
Streamable HTTP. Real processes, the real SDK; each test asserts what the server itself saw or
reported (its environment, its process), not only the answer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from services.retrieval.mcp import McpClient, ServerConfig
from services.retrieval.mcp.client import McpMisconfigured, McpSession
from tests.fixtures.everything import everything_argv, everything_http

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def _stdio(command: list[str], **fields: Any) -> ServerConfig:
    return ServerConfig(
        transport="stdio", command=command, tools=["ticket.get"], timeout_s=20.0, **fields
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too; its parent has not reaped it yet.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


async def test_a_local_server_runs_with_only_the_environment_its_registration_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WRIT_SOMETHING_SECRET", "retrieval's own")
    secret = tmp_path / "helpdesk.key"
    secret.write_text("from-a-secret-file\n")
    report = tmp_path / "report.json"
    server = _stdio(
        [sys.executable, "-m", "fakes.host.stdio", "--report", str(report)],
        env={"HELPDESK_REGION": "eu", "PYTHONPATH": str(ROOT)},
        env_files={"HELPDESK_KEY": str(secret)},
    )

    async def work(session: McpSession) -> dict[str, Any]:
        assert "ticket.get" in {t.name for t in await session.list_tools()}
        result = await session.call_tool("ticket.get", {"ticket_id": "T-1001"})
        assert isinstance(result.structured_content, dict)
        return result.structured_content

    ticket = await McpClient().session(server, work)
    assert ticket["subject"] == "Order 7781 shipped late"
    seen = json.loads(report.read_text())
    # Exactly the registration's environment: nothing of retrieval's (no PATH, no HOME, no
    # WRIT_ variable), the secret file's content under its name.
    # (Python in the child sets LC_CTYPE itself when it finds no locale: PEP 538.)
    assert set(seen["env"]) - {"LC_CTYPE"} == {"HELPDESK_KEY", "HELPDESK_REGION", "PYTHONPATH"}
    # The server ran for the session only.
    with anyio.fail_after(20):
        while _alive(seen["pid"]):
            await anyio.sleep(0.1)


_HOLDER: str = textwrap.dedent(
    """
    import sys, anyio
    from services.retrieval.mcp import McpClient, ServerConfig

    async def main() -> None:
        server = ServerConfig(transport="stdio", command=sys.argv[1:], tools=[], timeout_s=60)

        async def hold(session):
            await session.list_tools()
            print("listed", flush=True)
            await anyio.sleep(3600)

        await McpClient().session(server, hold)

    anyio.run(main)
    """
)


async def test_a_local_server_is_killed_with_retrieval(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    argv = [sys.executable, "-m", "fakes.host.stdio", "--report", str(report)]
    holder = await anyio.open_process(
        [sys.executable, "-c", _HOLDER, *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    async with holder:
        assert holder.stdout is not None
        with anyio.fail_after(60):
            said = b""
            while b"listed" not in said:
                said += await holder.stdout.receive()
        pid = json.loads(report.read_text())["pid"]
        assert _alive(pid)
        holder.send_signal(signal.SIGKILL)  # no cleanup of its own can run
        await holder.wait()
        with anyio.fail_after(20):
            while _alive(pid):
                await anyio.sleep(0.1)


async def test_stdio_registrations_that_cannot_work_say_why() -> None:
    with pytest.raises(McpMisconfigured, match="'no-such-mcp-server' is not found"):
        await McpClient().session(_stdio(["no-such-mcp-server"]), lambda s: s.list_tools())
    missing = _stdio([sys.executable], env_files={"KEY": "/nonexistent/key"})
    with pytest.raises(McpMisconfigured, match="/nonexistent/key"):
        await McpClient().session(missing, lambda s: s.list_tools())
    for fields, reason in (
        ({"transport": "stdio"}, "needs its command"),
        ({"transport": "stdio", "command": ["x"], "url": "http://h/mcp"}, "no url"),
        ({"url": "stdio:uvx mcp-server-time", "credential_file": "f"}, "regex"),
        ({"url": "http://h/mcp"}, "credential file"),
        ({"url": "http://h/mcp", "credential_file": "f", "command": ["x"]}, "stdio servers only"),
        ({"transport": "stdio", "command": ["x"], "env": {"A B": "1"}}, "env"),
        (
            {"transport": "stdio", "command": ["x"], "tools": ["a"], "resources": {"a": "d://a"}},
            "not both",
        ),
    ):
        with pytest.raises(msgspec.ValidationError, match=reason):
            msgspec.convert(fields, ServerConfig)


async def _echo(session: McpSession) -> str:
    tools = {t.name: t for t in await session.list_tools()}
    assert {"echo", "get-env"} <= set(tools)
    result = await session.call_tool("echo", {"message": "hello from Writ"})
    assert not result.is_error
    return "\n".join(getattr(c, "text", "") for c in result.content)


async def test_server_everything_over_stdio_sees_only_its_registered_environment() -> None:
    server = ServerConfig(
        transport="stdio", command=everything_argv(), env={"EVERYTHING_NOTE": "n"}, timeout_s=30
    )
    assert "hello from Writ" in await McpClient().session(server, _echo)

    async def env(session: McpSession) -> dict[str, str]:
        result = await session.call_tool("get-env", {})
        return dict(json.loads(result.content[0].text))  # type: ignore[union-attr]

    seen = await McpClient().session(server, env)
    assert seen.get("EVERYTHING_NOTE") == "n"
    assert "PATH" not in seen and not any(k.startswith("WRIT_") for k in seen)


async def test_server_everything_over_streamable_http(tmp_path: Path) -> None:
    token = tmp_path / "everything.token"
    token.write_text("unused-by-this-server")
    with everything_http() as url:
        for transport in ("streamable_http", "auto"):
            server = ServerConfig(
                url=url,
                credential_file=str(token),
                transport=transport,
                timeout_s=30,
            )
            assert "hello from Writ" in await McpClient().session(server, _echo)
