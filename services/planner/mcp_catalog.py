"""A run's `mcp:` capabilities in its catalog, as an operator classified them (docs/design.md §11).

When a run starts, its snapshot's `mcp:` entries get the family and the input schema of the
listing the operator classified (retrieval answers from the classification, request/reply
`writ.int.retrieval.mcp.catalog`). What the model is told *about* the tool, in the part of its
input that instructs it, is only operators' words: the deploying operator's description from the
manifest and the one the classifying operator wrote. Everything the server wrote — its
description, the titles and descriptions inside its schema — is kept apart in the entry's
`server_text`, which the model's input carries inside the untrusted-content boundary
(`inputs.py`), never in the catalog itself. The schema the catalog keeps is reduced to its
structure (types, names, bounds), with no text of the server's. A tool that changed since it
was classified keeps what was classified (its reads are refused anyway), and an unclassified one
says only that a person is asked each time. If retrieval does not answer, the entries stay as
the manifest has them; retrieval still checks every read's arguments before anything is sent.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Final

import msgspec
from nats.aio.client import Client

from libs.deadline import timed_request
from schemas import subjects
from schemas.mcp import DescribeTools, ToolDescriptions

__all__ = ["SERVER_TEXT", "structure_only", "with_mcp_descriptions"]

log = logging.getLogger("writ.planner")

# The key of a catalog entry that holds what the server wrote (moved to the untrusted content).
SERVER_TEXT: Final = "server_text"
_DESCRIPTION_CHARS: Final = 2000
_SERVER_TEXT_CHARS: Final = 4000
_DECODER: Final = msgspec.json.Decoder(ToolDescriptions)
# JSON Schema keywords that shape arguments; every other keyword (description, title,
# examples, $comment, x-…) is the server's prose and is dropped.
_SCHEMAS: Final = frozenset({"items", "not", "additionalProperties", "contains"})
_SCHEMA_LISTS: Final = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SCALARS: Final = frozenset(
    {
        "type",
        "required",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "format",
        "pattern",
        "enum",
        "const",
    }
)
# A name or a value the model must write back verbatim: short, and no room for a sentence.
_WORD: Final = re.compile(r"^[A-Za-z0-9_.:/@+-]{1,64}$")


async def with_mcp_descriptions(
    nc: Client, tenant: str, manifest: dict[str, Any] | None, *, timeout: float = 2.0
) -> dict[str, Any] | None:
    """The snapshot with its `mcp:` entries described as classified (unchanged without any)."""
    if manifest is None:
        return None
    entries = [e for e in manifest.get("catalog", []) if e.get("kind") == "mcp"]
    if not entries:
        return manifest
    ask = DescribeTools(tenant=tenant, capabilities=[e["name"] for e in entries][:64])
    try:
        reply = await timed_request(
            nc, subjects.MCP_CATALOG, msgspec.json.encode(ask), timeout=timeout
        )
        if reply.headers and reply.headers.get("Nats-Service-Error-Code"):
            raise RuntimeError(reply.headers.get("Nats-Service-Error"))
        described = {t.capability: t for t in _DECODER.decode(reply.data).tools}
    except Exception as exc:  # the manifest's own words still describe them
        log.warning("mcp: capabilities of %s not described: %r", tenant, exc)
        return manifest
    catalog = []
    for entry in manifest["catalog"]:
        if entry.get("kind") == "mcp":
            tool = described.get(entry["name"])
            entry = {**entry, "grants": dict(entry.get("grants", {}))}
            if tool is None:
                entry["grants"]["family"] = "unclassified: a person is asked every time"
            else:
                if tool.operator_description:
                    entry["description"] = (
                        f"{entry['description']}\nAs classified: {tool.operator_description}"
                    )[:_DESCRIPTION_CHARS]
                entry["inputs"] = structure_only(tool.input_schema)
                entry["grants"]["family"] = tool.family
                text = server_text(tool.description, tool.input_schema)
                if text:
                    entry[SERVER_TEXT] = text
        catalog.append(entry)
    return {**manifest, "catalog": catalog}


def structure_only(schema: Any, depth: int = 0) -> dict[str, Any]:
    """A JSON Schema with only the keywords that shape arguments, and none of its prose:
    property names, enum and const values are kept only when they are short words."""
    if not isinstance(schema, dict) or depth > 8:
        return {}
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {
                name: structure_only(sub, depth + 1)
                for name, sub in value.items()
                if isinstance(name, str) and _WORD.match(name)
            }
        elif key in _SCHEMAS:
            out[key] = value if isinstance(value, bool) else structure_only(value, depth + 1)
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [structure_only(v, depth + 1) for v in value[:16]]
        elif key in ("enum", "const"):
            values = value if key == "enum" and isinstance(value, list) else [value]
            if all(not isinstance(v, str) or _WORD.match(v) for v in values):
                out[key] = value
        elif key == "required" and isinstance(value, list):
            out[key] = [n for n in value if isinstance(n, str) and _WORD.match(n)]
        elif key in ("format", "pattern"):
            if isinstance(value, str) and len(value) <= 128 and " " not in value:
                out[key] = value
        elif key in _SCALARS:
            out[key] = value
    return out


def server_text(description: str, schema: Any) -> dict[str, Any]:
    """What the server wrote about a tool (its description, and each titled or described
    part of its input schema by path): data for the model, never an instruction."""
    found: dict[str, str] = {}

    def walk(node: Any, path: str, depth: int) -> None:
        if not isinstance(node, dict) or depth > 8 or len(found) >= 64:
            return
        for key in ("title", "description"):
            if isinstance(node.get(key), str) and node[key].strip():
                found[f"{path}.{key}" if path else key] = node[key][:500]
        for name, sub in (node.get("properties") or {}).items():
            walk(sub, f"{path}.{name}" if path else str(name), depth + 1)
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]", depth + 1)

    walk(schema, "", 0)
    text: dict[str, Any] = {}
    if description.strip():
        text["description"] = description[:_SERVER_TEXT_CHARS]
    if found:
        text["input_schema"] = found
    return text
