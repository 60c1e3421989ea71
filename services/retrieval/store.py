"""Retrieval's SQL: tenant-scoped full-text search over documents, and customer records.

The tenant is a bound parameter of every statement, taken from the request (never from a tool's
arguments), so a run can only ever see its own tenant's rows. Retrieval's role may only SELECT.
"""

from __future__ import annotations

import json
from typing import Any, Final

import asyncpg
import msgspec

from schemas.mcp import ClassifiedTool
from schemas.retrieval import Evidence

__all__ = ["EVIDENCE_CHARS", "CustomerRecord", "RetrievalStore", "SearchPage"]

EVIDENCE_CHARS: Final = 4000
_TITLE_CHARS: Final = 512

# Any query word may match (OR), ranked by relevance. One row more than asked tells whether
# more matched; `cut` whether the body was longer than the snippet.
_SEARCH = f"""
SELECT document_id, left(kind, {_TITLE_CHARS}) AS kind, left(title, {_TITLE_CHARS}) AS title,
       left(body, $4) AS body, length(body) > $4 AS cut,
       ts_rank(search, query) AS rank
FROM retrieval.documents,
     to_tsquery('english', replace(plainto_tsquery('english', $2)::text, ' & ', ' | ')) AS query
WHERE tenant = $1 AND query <> ''::tsquery AND search @@ query
ORDER BY rank DESC, document_id
LIMIT $3 + 1
"""

_CUSTOMER = """
SELECT customer_id, name, owner, email, status, notes
FROM retrieval.customers WHERE tenant = $1 AND customer_id = $2
"""


class SearchPage(msgspec.Struct, frozen=True, kw_only=True):
    """Ranked excerpts; `truncated` when more matched or an excerpt was cut."""

    evidence: list[Evidence]
    truncated: bool


class CustomerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A customer as retrieval's table holds it."""

    customer_id: str
    name: str
    owner: str
    email: str
    status: str
    notes: str


class RetrievalStore:
    """Reads documents and customer records for one tenant at a time."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def search(self, tenant: str, text: str, *, limit: int = 5) -> list[Evidence]:
        """The tenant's documents that best match `text`, marked untrusted."""
        return (await self.search_page(tenant, text, limit=limit)).evidence

    async def search_page(
        self, tenant: str, text: str, *, limit: int = 5, snippet_chars: int = EVIDENCE_CHARS
    ) -> SearchPage:
        """Up to `limit` of the tenant's best matches, each cut to `snippet_chars`."""
        rows = await self._pool.fetch(_SEARCH, tenant, text, limit, snippet_chars)
        return SearchPage(
            evidence=[
                Evidence(
                    document_id=r["document_id"],
                    kind=r["kind"],
                    title=r["title"],
                    text=r["body"],
                    rank=float(r["rank"]),
                )
                for r in rows[:limit]
            ],
            truncated=len(rows) > limit or any(r["cut"] for r in rows[:limit]),
        )

    async def classification(self, tenant: str, capability: str) -> ClassifiedTool | None:
        """How an operator classified `capability` (None: nobody did)."""
        row = await self._pool.fetchrow(
            "SELECT family, digest, description, input_schema, output_schema, "
            "operator_description, classified_by FROM retrieval.mcp_tools "
            "WHERE tenant = $1 AND capability = $2",
            tenant,
            capability,
        )
        if row is None:
            return None
        return ClassifiedTool(
            family=row["family"],
            digest=row["digest"],
            description=row["description"],
            input_schema=json.loads(row["input_schema"]),
            output_schema=None
            if row["output_schema"] is None
            else json.loads(row["output_schema"]),
            operator_description=row["operator_description"],
            classified_by=row["classified_by"],
        )

    async def described(self, tenant: str, capabilities: list[str]) -> list[dict[str, Any]]:
        """The classified ones among `capabilities`: family, description and input schema as
        the operator classified them."""
        rows = await self._pool.fetch(
            "SELECT capability, family, description, input_schema, operator_description "
            "FROM retrieval.mcp_tools "
            "WHERE tenant = $1 AND capability = ANY($2::text[])",
            tenant,
            capabilities,
        )
        return [
            {
                "capability": r["capability"],
                "family": r["family"],
                "description": r["description"],
                "input_schema": json.loads(r["input_schema"]),
                "operator_description": r["operator_description"],
            }
            for r in rows
        ]

    async def customer(self, tenant: str, customer_id: str) -> CustomerRecord | None:
        """The tenant's customer `customer_id`; None if this tenant has no such customer."""
        row = await self._pool.fetchrow(_CUSTOMER, tenant, customer_id)
        return None if row is None else CustomerRecord(**dict(row))
