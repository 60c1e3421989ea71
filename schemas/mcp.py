"""Federation reads: the host's MCP servers, their listings, and the operator's classification.

A capability `mcp:<server>/<tool>` is a tool of an MCP server an operator registered for a
tenant. Retrieval is the only service that talks to the server (it alone holds the credential):
every `tools/list` it makes is hashed, per tool and as a whole, and recorded by governance in its
journal (`RecordListing`); the operator classifies what was recorded (`ClassifyTool`: a family,
bound to the tool's digest), and `decide` refuses a tool whose live digest is not the one that was
classified. The server's own annotations travel as hints for the operator and decide nothing.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

import msgspec

from schemas.base import Command, Digest, Event, Family, Principal, ShortText, Tenant, Text

__all__ = [
    "CAPABILITY",
    "MAX_LISTED_TOOLS",
    "McpToolName",
    "ServerName",
    "ClassifiedTool",
    "ClassifyTool",
    "DescribeTools",
    "DescribedTool",
    "ListServer",
    "ListServers",
    "ListedTool",
    "ListingRecorded",
    "RecordListing",
    "RegisteredServer",
    "RegisteredServers",
    "ServerListing",
    "ToolClassified",
    "ToolDescriptions",
    "ToolStatus",
    "capability",
    "parse_capability",
]

MAX_LISTED_TOOLS: Final = 64
ServerName = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9-]{0,31}(?!\n)$")]
McpToolName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}(?!\n)$")]
# `mcp:<server>/<tool>`, the capability's name in manifests, decisions and the journal.
CAPABILITY: Final = re.compile(r"mcp:([a-z][a-z0-9-]{0,31})/([A-Za-z][A-Za-z0-9_.-]{0,63})")


def capability(server: str, tool: str) -> str:
    """The capability name of `tool` on `server`."""
    return f"mcp:{server}/{tool}"


def parse_capability(name: str) -> tuple[str, str] | None:
    """(server, tool) of an `mcp:` capability name, or None if it is not one."""
    match = CAPABILITY.fullmatch(name)
    return (match[1], match[2]) if match else None


class ListedTool(msgspec.Struct, frozen=True, kw_only=True):
    """One tool as a listing gave it: what is hashed, and the server's hints (not hashed)."""

    name: McpToolName
    description: Text = ""
    input_schema: dict[str, Any] = {}
    output_schema: dict[str, Any] | None = None
    digest: Digest
    hints: Annotated[dict[str, bool | str | None], msgspec.Meta(max_length=8)] = {}


class RecordListing(Command, frozen=True):
    """Retrieval tells governance what a `tools/list` returned (journaled, kept as the latest)."""

    tenant: Tenant
    server: ServerName
    digest: Digest
    tools: Annotated[list[ListedTool], msgspec.Meta(max_length=MAX_LISTED_TOOLS)]


class ToolStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Where one listed tool stands against the operator's classification."""

    name: McpToolName
    digest: Digest
    state: Literal["classified", "unclassified", "changed"]
    family: Family | None = None
    hints: dict[str, bool | str | None] = {}
    # Why an unclassified tool looks like another (a rename, a shadow): it is asked, with these.
    flags: list[str] = []


class ListingRecorded(Event, frozen=True):
    """The listing is in the journal; each tool's standing."""

    digest: Digest
    tools: list[ToolStatus]


class ClassifiedTool(msgspec.Struct, frozen=True, kw_only=True):
    """A tool as an operator classified it: the definition they were shown (the server's text,
    kept as data), the family, and the description they wrote for the model's catalog."""

    family: Family
    digest: Digest
    description: Text = ""
    input_schema: dict[str, Any] = {}
    output_schema: dict[str, Any] | None = None
    operator_description: Text = ""
    classified_by: str = ""


class ListServer(Command, frozen=True):
    """An operator asks retrieval to list a registered server now (`writ mcp list`), or to
    show one tool of it in full (`writ mcp show`: `tool`)."""

    tenant: Tenant
    server: ServerName
    tool: McpToolName | None = None


class ListServers(Command, frozen=True):
    """An operator asks retrieval which MCP servers are registered for their tenant (the
    console's MCP page lists them to choose from; nothing is asked of any server)."""

    tenant: Tenant


class RegisteredServer(msgspec.Struct, frozen=True, kw_only=True):
    """One registration as an operator chooses it: its name, transport and the names Writ
    exposes (never its address, command or credential)."""

    name: ServerName
    transport: Literal["auto", "streamable_http", "sse", "stdio"]
    exposed: Annotated[list[McpToolName], msgspec.Meta(max_length=128)] = []


class RegisteredServers(Event, frozen=True):
    """The tenant's registered servers, by name; `error` says why there are none when the
    registration file is refused."""

    servers: Annotated[list[RegisteredServer], msgspec.Meta(max_length=1024)] = []
    error: Annotated[str, msgspec.Meta(max_length=500)] = ""


class ServerListing(Event, frozen=True):
    """What the listing found, or why there is none (`error`); for `writ mcp show`, the tool
    as listed now (`shown`) and as it was classified (`classified`)."""

    ok: bool
    error: ShortText = ""
    digest: str = ""
    tools: list[ToolStatus] = []
    exposed: list[str] = []
    shown: ListedTool | None = None
    classified: ClassifiedTool | None = None


class ClassifyTool(Command, frozen=True):
    """An operator classifies a tool as the latest recorded listing describes it: only if its
    digest there is `digest`, the one the operator was shown (`writ mcp show`), when given.
    `description` is the operator's own words for the model's catalog (the server's text never
    reaches the model's instructions)."""

    tenant: Tenant
    server: ServerName
    tool: McpToolName
    family: Family
    classified_by: Principal
    digest: Digest | None = None
    description: Annotated[str, msgspec.Meta(max_length=2000)] = ""


class ToolClassified(Event, frozen=True):
    """Whether the classification was recorded, and against which digest."""

    ok: bool
    message: ShortText
    digest: str = ""


class DescribeTools(Command, frozen=True):
    """The planner asks how the operator classified a run's `mcp:` capabilities, for the
    catalog a model is shown (request/reply `writ.int.retrieval.mcp.catalog`)."""

    tenant: Tenant
    capabilities: Annotated[list[ShortText], msgspec.Meta(max_length=MAX_LISTED_TOOLS)]


class DescribedTool(msgspec.Struct, frozen=True, kw_only=True):
    """A capability as classified: its family, the operator's description, and the server's
    description and input schema of the listing the operator classified (never the server's
    live text; the server's words are data, for the untrusted part of the model's input)."""

    capability: ShortText
    family: Family
    description: Text
    input_schema: dict[str, Any]
    operator_description: Text = ""


class ToolDescriptions(Event, frozen=True):
    """The classified ones among the capabilities asked about (the others are absent)."""

    tools: list[DescribedTool]
