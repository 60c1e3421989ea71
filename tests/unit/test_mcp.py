"""Federation reads' pure parts: digests, capability names, the registration file, the argument
check and the bounded result; and the fake host's REST semantics (a real loopback server)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import pytest

from fakes.host import FakeHost, tool_definitions
from libs.errors import ConfigError
from schemas.mcp import ListServer, capability, parse_capability
from services.ingress.console._i18n import rendering
from services.ingress.console._mcp import index_page
from services.ingress.console._session import Viewer
from services.retrieval.mcp.digest import listing_digest, tool_digest
from services.retrieval.mcp.reads import (
    MAX_RESULT_CHARS,
    McpReads,
    _items,
    _listed,
    _Refusal,
    _validate,
)
from services.retrieval.mcp.servers import ServerRegistry
from writ import mcp as writ_mcp


def _tool(**changes: object) -> types.Tool:
    base = tool_definitions()[1]  # ticket.get
    fields = {
        "name": base["name"],
        "description": base["description"],
        "input_schema": base["input_schema"],
        "output_schema": base["output_schema"],
        "annotations": types.ToolAnnotations(read_only_hint=True),
        **changes,
    }
    return types.Tool(**fields)


def test_a_tool_digest_covers_name_description_and_schemas_but_not_hints() -> None:
    same = _listed(_tool())
    assert (
        _listed(
            _tool(annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True))
        ).digest
        == same.digest
    )
    assert same.hints["read_only_hint"] is True  # kept, as a hint
    for change in (
        {"description": "Read one ticket. Also send it elsewhere."},
        {"input_schema": {"type": "object"}},
        {"output_schema": {"type": "object"}},
        {"name": "ticket.read"},
    ):
        assert _listed(_tool(**change)).digest != same.digest, change
    assert listing_digest([("a", "1"), ("b", "2")]) == listing_digest([("b", "2"), ("a", "1")])
    assert listing_digest([("a", "1")]) != listing_digest([("a", "2")])
    assert tool_digest("t", "", {}, None) != tool_digest("t", "", {}, {})


def test_capability_names() -> None:
    assert parse_capability(capability("helpdesk", "ticket.get")) == ("helpdesk", "ticket.get")
    for bad in (
        "mcp:helpdesk",
        "mcp:/ticket.get",
        "mcp:Help/x",
        "tool:x",
        "mcp:a/b/c",
        "mcp:a/b\n",
    ):
        assert parse_capability(bad) is None, bad


def test_arguments_are_checked_with_a_real_json_schema_validator() -> None:
    schema = tool_definitions()[1]["input_schema"]
    _validate("mcp:h/ticket.get", schema, {"ticket_id": "T-1001"})
    for bad, where in (
        ({"ticket_id": "t-1"}, "$.ticket_id"),
        ({}, "$"),
        ({"ticket_id": "T-1", "tenant": "globex"}, "$"),
        ({"ticket_id": 1001}, "$.ticket_id"),
    ):
        with pytest.raises(_Refusal) as refused:
            _validate("mcp:h/ticket.get", schema, bad)
        assert refused.value.code == "INVALID_ARGUMENTS"
        assert refused.value.reason.startswith(f"mcp:h/ticket.get: {where}")
        assert "nothing was sent" in refused.value.reason
    with pytest.raises(_Refusal, match="not a JSON Schema"):
        _validate("mcp:h/x", {"type": "no-such-type"}, {})


def test_a_result_is_one_bounded_untrusted_item() -> None:
    big = types.CallToolResult(content=[types.TextContent(text="x" * (MAX_RESULT_CHARS * 2))])
    [item], truncated = _items("mcp:h/t", "t", big)
    assert truncated and len(item.text) == MAX_RESULT_CHARS and item.trust == "untrusted"
    structured = types.CallToolResult(
        content=[types.TextContent(text="ignored")], structured_content={"b": 1, "a": "é"}
    )
    [item], truncated = _items("mcp:h/t", "t", structured)
    assert not truncated and json.loads(item.text) == {"a": "é", "b": 1}
    error = types.CallToolResult(content=[types.TextContent(text="not found")], is_error=True)
    assert _items("mcp:h/t", "t", error)[0][0].kind == "mcp_error"


def test_the_registration_file_is_strict_and_reread_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "mcp-servers.json"
    registry = ServerRegistry(path)
    assert registry.get("acme", "helpdesk") is None  # no file: nothing registered
    entry = {"url": "http://127.0.0.1:1/mcp", "credential_file": "/s/t", "tools": ["ticket.get"]}
    path.write_text(json.dumps({"acme": {"helpdesk": entry}}))
    found = registry.get("acme", "helpdesk")
    assert found is not None and found.tools == ["ticket.get"]
    assert registry.get("globex", "helpdesk") is None and registry.names("acme") == ["helpdesk"]
    path.write_text(json.dumps({"acme": {"helpdesk": {**entry, "token": "inline"}}}))
    os.utime(path, ns=(1, 1))  # another modification time, whatever the clock's resolution
    assert registry.get("acme", "helpdesk") is None  # an unknown field registers nothing


def test_a_registration_under_a_name_retrieval_refuses_is_never_written(tmp_path: Path) -> None:
    """A server's or tenant's name the registration file may not hold would have retrieval
    refuse the whole file, every tenant's servers with it: `writ mcp add` refuses it instead."""
    add: dict[str, Any] = {
        "url": "http://127.0.0.1:1/mcp",
        "credential_file": "/s/t",
        "tools": ["ticket.get"],
    }
    writ_mcp.add_server(tmp_path, "acme", "helpdesk", **add)
    path = writ_mcp.servers_file(tmp_path)
    registry = ServerRegistry(path)
    assert registry.names("acme") == ["helpdesk"]
    before = path.read_bytes()
    for tenant, server in [
        ("acme", "crm/evil"),
        ("acme", "Helpdesk"),
        ("acme", "x" * 40),
        ("acme", "crm\n"),
        ("ACME", "crm"),
        ("", "crm"),
    ]:
        with pytest.raises(ConfigError, match="is not a (server's|tenant's) name"):
            writ_mcp.add_server(tmp_path, tenant, server, **add)
        assert path.read_bytes() == before, (tenant, server)
    assert registry.get("acme", "helpdesk") is not None
    # A file retrieval already refuses is not added to (the new entry would be ignored too).
    path.write_text(json.dumps({"acme": {"Bad Name": add}}))
    with pytest.raises(ConfigError, match="not a valid registration file"):
        writ_mcp.add_server(tmp_path, "acme", "crm", **add)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not a valid registration file"):
        writ_mcp.add_server(tmp_path, "acme", "crm", **add)


@pytest.mark.anyio
async def test_a_refused_registration_file_is_said_to_be_refused(tmp_path: Path) -> None:
    """An operator listing a server, and a read of its tool, are told the file is refused (not
    merely that the server is unknown), without the file's error, which may name other
    tenants' servers; a mended file registers again."""
    path = tmp_path / "mcp-servers.json"
    registry = ServerRegistry(path)
    reads = McpReads(nc=None, servers=registry, classified=None)  # type: ignore[arg-type]
    entry = {"url": "http://127.0.0.1:1/mcp", "credential_file": "/s/t", "tools": ["ticket.get"]}
    path.write_text(json.dumps({"acme": {"helpdesk": entry}, "globex": {"Secret Desk": entry}}))
    listing = await reads.list_server(ListServer(tenant="acme", server="helpdesk"))
    assert not listing.ok and "the registration file is refused" in listing.error
    assert "Secret" not in listing.error and "globex" not in listing.error
    with pytest.raises(_Refusal, match="the registration file is refused") as refused:
        reads._registered("acme", "helpdesk", "ticket.get")
    assert refused.value.code == "UNKNOWN_TOOL"
    # The console's list of servers says it too, rather than that none is registered.
    path.write_text(json.dumps({"acme": {"helpdesk": entry}, "globex": {"Secret Desk": entry}}))
    os.utime(path, ns=(2, 2))
    none = reads.registered("acme")
    assert none.servers == [] and "the registration file is refused" in none.error
    viewer = Viewer(
        tenant="acme",
        principal="ops@acme.example",
        roles=frozenset({"operator"}),
        token="t",
        expires=0.0,
    )
    with rendering("en"):
        page = index_page(viewer, none)
    assert "the registration file is refused" in page and "Secret" not in page
    path.write_text(json.dumps({"acme": {"crm": entry}}))
    os.utime(path, ns=(3, 3))
    unknown = await reads.list_server(ListServer(tenant="acme", server="helpdesk"))
    assert unknown.error == "no MCP server helpdesk is registered for acme"
    assert reads._registered("acme", "crm", "ticket.get").tools == ["ticket.get"]
    assert reads.registered("acme").error == ""


def test_the_fake_hosts_writes_honour_idempotency_keys_and_revisions() -> None:
    with (
        FakeHost(mcp_token="m", rest_token="r") as fake,
        httpx.Client(base_url=fake.url, headers={"Authorization": "Bearer r"}) as client,
    ):

        def post(key: str, body: str, revision: str | None = None) -> httpx.Response:
            headers = {"Idempotency-Key": key, **({"If-Match": revision} if revision else {})}
            return client.post(
                "/api/v1/tickets/T-1001/comments", json={"body": body}, headers=headers
            )

        first = post("k1", "hello", "r1")
        assert first.status_code == 201 and first.json()["revision"] == "r2"
        assert post("k1", "hello", "r1").json() == first.json()  # same key, same body
        assert post("k1", "other").status_code == 422  # same key, another body
        assert post("k2", "late", "r1").status_code == 412  # the ticket moved on
        patch = client.patch(
            "/api/v1/tickets/T-1001",
            json={"status": "solved"},
            headers={"Idempotency-Key": "k3", "If-Match": "r2"},
        )
        assert patch.status_code == 200 and patch.json()["revision"] == "r3"
        assert (
            client.post(
                "/api/v1/tickets/T-1001/comments",
                json={"body": "x"},
                headers={"Idempotency-Key": "k4", "Authorization": "Bearer m"},
            ).status_code
            == 401
        )
        state = client.get("/_control/state").json()
        assert [c["body"] for c in state["comments"]] == ["hello"]
        assert state["tickets"]["T-1001"]["status"] == "solved"
        assert client.get("/api/v1/openapi.json").json()["openapi"] == "3.1.0"
