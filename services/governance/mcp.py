"""The operator's classification of MCP tools, and the record of every listing (docs/design.md §11).

A family for an `mcp:` capability is what an operator classified in Writ, bound to the digest of
the tool they were shown; the server's annotations are kept as hints and decide nothing. Every
listing retrieval makes is written here with its journal row, in one transaction, and `decide`
looks the classification up: none is an unclassified tool (asked every time, never "always"),
another digest is a changed tool (refused until classified again).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final, Literal

import asyncpg
import msgspec

from libs.journal import Journal
from schemas.mcp import (
    ClassifyTool,
    ListedTool,
    ListingRecorded,
    RecordListing,
    ToolClassified,
    ToolStatus,
    capability,
)

__all__ = ["Classification", "McpRegistry"]

_RECORD: Final = """
INSERT INTO retrieval.mcp_listings (tenant, server, digest, tools) VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant, server, digest) DO UPDATE SET listed_at = now()"""
_CLASSIFIED: Final = """
SELECT capability, family, digest FROM retrieval.mcp_tools
WHERE tenant = $1 AND capability = ANY($2::text[])"""
_LATEST: Final = """
SELECT digest, tools FROM retrieval.mcp_listings WHERE tenant = $1 AND server = $2
ORDER BY listed_at DESC LIMIT 1"""
_CLASSIFY: Final = """
INSERT INTO retrieval.mcp_tools (tenant, capability, family, digest, description, input_schema,
                                 output_schema, classified_by, operator_description)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (tenant, capability) DO UPDATE SET
    family = excluded.family, digest = excluded.digest, description = excluded.description,
    input_schema = excluded.input_schema, output_schema = excluded.output_schema,
    classified_by = excluded.classified_by, classified_at = now(),
    operator_description = excluded.operator_description"""


_ALL_CLASSIFIED: Final = """
SELECT capability, digest, description, input_schema, output_schema FROM retrieval.mcp_tools
WHERE tenant = $1"""
# The tool a listing gave with this digest (the one retrieval recorded just before it asked).
_LISTED: Final = """
SELECT t.value AS tool FROM retrieval.mcp_listings l, jsonb_array_elements(l.tools) t
WHERE l.tenant = $1 AND l.server = $2 AND l.tools @> $3::jsonb AND t.value->>'digest' = $4
ORDER BY l.listed_at DESC LIMIT 1"""
# The latest listing of each of the tenant's other servers.
_OTHERS: Final = """
SELECT DISTINCT ON (server) server, tools FROM retrieval.mcp_listings
WHERE tenant = $1 AND server <> $2 ORDER BY server, listed_at DESC"""


def definition(description: str, input_schema: Any, output_schema: Any) -> str:
    """A digest of what a tool is, without its name: the same under another name is a rename."""
    canonical = json.dumps(
        [description, input_schema, output_schema], sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


class Classification(msgspec.Struct, frozen=True, kw_only=True):
    """What an operator classified an `mcp:` capability as, and the tool's digest then."""

    family: str
    digest: str


class McpRegistry:
    """Reads and writes the classifications and listings (governance's role may)."""

    def __init__(self, pool: asyncpg.Pool, *, journal: Journal | None) -> None:
        self._pool, self._journal = pool, journal
        self._encoder = msgspec.json.Encoder()

    async def lookup(self, tenant: str, name: str) -> Classification | None:
        """The classification of one capability, or None if nobody classified it.

        Raises:
            asyncpg.PostgresError: the store cannot be read (the caller fails closed).
        """
        row = await self._pool.fetchrow(_CLASSIFIED, tenant, [name])
        return None if row is None else Classification(family=row["family"], digest=row["digest"])

    async def flags(self, tenant: str, name: str, digest: str) -> list[str]:
        """What makes an unclassified tool look like another, for the person asked: the
        definition of a classified tool under another name (a rename), or the name of another
        server's tool (a shadow); each with the digests involved, in full.

        Raises:
            asyncpg.PostgresError: the store cannot be read (the caller fails closed).
        """
        server, _, tool_name = name.removeprefix("mcp:").partition("/")
        async with self._pool.acquire() as conn:
            listed = await conn.fetchval(
                _LISTED, tenant, server, json.dumps([{"digest": digest}]), digest
            )
            classified = await conn.fetch(_ALL_CLASSIFIED, tenant)
            others = await conn.fetch(_OTHERS, tenant, server)
        return _flags(
            name,
            tool_name,
            digest,
            None if listed is None else msgspec.json.decode(listed, type=ListedTool),
            classified,
            {r["server"]: msgspec.json.decode(r["tools"], type=list[ListedTool]) for r in others},
        )

    async def record_listing(self, listing: RecordListing) -> ListingRecorded:
        """Journal the listing (and keep it as the server's latest); each tool's standing."""
        names = [capability(listing.server, t.name) for t in listing.tools]
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                _RECORD,
                listing.tenant,
                listing.server,
                listing.digest,
                self._encoder.encode(listing.tools).decode(),
            )
            if self._journal is not None:
                await self._journal.write(
                    conn,
                    tenant=listing.tenant,
                    kind="mcp_listing",
                    subject=listing.server,
                    payload={
                        "server": listing.server,
                        "digest": listing.digest,
                        "tools": {t.name: t.digest for t in listing.tools},
                    },
                )
            rows = await conn.fetch(_CLASSIFIED, listing.tenant, names)
            every: list[asyncpg.Record] = []
            others: list[asyncpg.Record] = []
            if len(rows) < len(names):  # only an unclassified tool can be flagged
                every = await conn.fetch(_ALL_CLASSIFIED, listing.tenant)
                others = await conn.fetch(_OTHERS, listing.tenant, listing.server)
        known = {r["capability"]: r for r in rows}
        other_tools = {
            r["server"]: msgspec.json.decode(r["tools"], type=list[ListedTool]) for r in others
        }
        statuses = []
        for t in listing.tools:
            name = capability(listing.server, t.name)
            status = _status(t, known.get(name))
            if status.state == "unclassified":
                flags = _flags(name, t.name, t.digest, t, every, other_tools)
                status = msgspec.structs.replace(status, flags=flags)
            statuses.append(status)
        return ListingRecorded(digest=listing.digest, tools=statuses)

    async def classify(self, ask: ClassifyTool) -> ToolClassified:
        """Classify the tool as the server's latest recorded listing describes it."""
        name = capability(ask.server, ask.tool)
        async with self._pool.acquire() as conn, conn.transaction():
            latest = await conn.fetchrow(_LATEST, ask.tenant, ask.server)
            if latest is None:
                return ToolClassified(
                    ok=False,
                    message=f"no listing of {ask.server} is "
                    "recorded for this tenant: list it first (writ mcp list)",
                )
            tools = msgspec.json.decode(latest["tools"], type=list[ListedTool])
            tool = next((t for t in tools if t.name == ask.tool), None)
            if tool is None:
                return ToolClassified(
                    ok=False,
                    message=f"{name} is not in the latest listing "
                    f"of {ask.server}: a tool never listed is never called",
                )
            if ask.digest is not None and ask.digest != tool.digest:
                return ToolClassified(
                    ok=False,
                    message=f"{name} is no longer what was shown (shown {ask.digest[:12]}, "
                    f"listed now {tool.digest[:12]}): show it again (writ mcp show) and "
                    "classify what you see",
                )
            await conn.execute(
                _CLASSIFY,
                ask.tenant,
                name,
                ask.family,
                tool.digest,
                tool.description,
                json.dumps(tool.input_schema),
                None if tool.output_schema is None else json.dumps(tool.output_schema),
                ask.classified_by,
                ask.description,
            )
            if self._journal is not None:
                await self._journal.write(
                    conn,
                    tenant=ask.tenant,
                    kind="mcp_classified",
                    subject=name,
                    payload={
                        "capability": name,
                        "family": ask.family,
                        "digest": tool.digest,
                        "listing": latest["digest"],
                        "by": ask.classified_by,
                        "hints": tool.hints,
                        # What the model's catalog will say of it: the operator's words, and
                        # which server text was accepted as data beside them.
                        "operator_description": ask.description,
                        "server_description": tool.description,
                        "shown": ask.digest is not None,
                    },
                )
        return ToolClassified(
            ok=True,
            digest=tool.digest,
            message=f"{name} classified {ask.family} (digest {tool.digest[:12]})",
        )


def _status(tool: ListedTool, row: asyncpg.Record | None) -> ToolStatus:
    if row is None:
        return ToolStatus(
            name=tool.name, digest=tool.digest, state="unclassified", hints=tool.hints
        )
    state: Literal["classified", "changed"] = (
        "classified" if row["digest"] == tool.digest else "changed"
    )
    return ToolStatus(
        name=tool.name, digest=tool.digest, state=state, family=row["family"], hints=tool.hints
    )


def _flags(
    name: str,
    tool_name: str,
    digest: str,
    listed: ListedTool | None,
    classified: list[asyncpg.Record],
    others: dict[str, list[ListedTool]],
) -> list[str]:
    flags = []
    if listed is not None:
        mine = definition(listed.description, listed.input_schema, listed.output_schema)
        for row in classified:
            if row["capability"] == name:
                continue
            theirs = definition(
                row["description"],
                json.loads(row["input_schema"]),
                None if row["output_schema"] is None else json.loads(row["output_schema"]),
            )
            if theirs == mine:
                flags.append(
                    f"{name} has the definition of {row['capability']} under another name "
                    f"(served {digest}, classified {row['digest']})"
                )
    # Each tool of the same name elsewhere, with the digests it is listed or classified under,
    # in full: the person asked compares the two definitions by what they are, not by name.
    shadowed: dict[str, set[str]] = {}
    for server, tools in others.items():
        for t in tools:
            if t.name == tool_name:
                shadowed.setdefault(f"mcp:{server}/{tool_name}", set()).add(t.digest)
    for row in classified:
        if row["capability"] != name and row["capability"].endswith(f"/{tool_name}"):
            shadowed.setdefault(row["capability"], set()).add(row["digest"])
    if shadowed:
        named = ", ".join(
            f"{other} ({', '.join(sorted(shadowed[other])[:2])})" for other in sorted(shadowed)[:4]
        )
        flags.append(f"{name} (served {digest}) has the name of {named}")
    return flags
