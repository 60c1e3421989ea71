"""The operator's classification of MCP tools, and the record of every listing (docs/design.md §11).

A family for an `mcp:` capability is what an operator classified in Writ, bound to the digest of
the tool they were shown; the server's annotations are kept as hints and decide nothing. Every
listing retrieval makes is written here with its journal row, in one transaction, and `decide`
looks the classification up: none is an unclassified tool (asked every time, never "always"),
another digest is a changed tool (refused until classified again).
"""

from __future__ import annotations

import json
from typing import Final, Literal

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
                                 output_schema, classified_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (tenant, capability) DO UPDATE SET
    family = excluded.family, digest = excluded.digest, description = excluded.description,
    input_schema = excluded.input_schema, output_schema = excluded.output_schema,
    classified_by = excluded.classified_by, classified_at = now()"""


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
        known = {r["capability"]: r for r in rows}
        return ListingRecorded(
            digest=listing.digest,
            tools=[
                _status(t, known.get(capability(listing.server, t.name))) for t in listing.tools
            ],
        )

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
