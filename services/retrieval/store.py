"""Retrieval's SQL: tenant-scoped full-text search over documents."""

from __future__ import annotations

import asyncpg

from schemas.retrieval import Evidence

__all__ = ["RetrievalStore"]

# Any query word may match (OR), ranked by relevance; the tenant is a bound parameter of every
# query, so a run can only ever see its own tenant's documents.
_SEARCH = """
SELECT document_id, kind, title, left(body, 4000) AS body,
       ts_rank(search, query) AS rank
FROM retrieval.documents,
     to_tsquery('english', replace(plainto_tsquery('english', $2)::text, ' & ', ' | ')) AS query
WHERE tenant = $1 AND query <> ''::tsquery AND search @@ query
ORDER BY rank DESC, document_id
LIMIT $3
"""


class RetrievalStore:
    """Reads documents for one tenant at a time."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def search(self, tenant: str, text: str, *, limit: int = 5) -> list[Evidence]:
        """The tenant's documents that best match `text`, marked untrusted."""
        rows = await self._pool.fetch(_SEARCH, tenant, text, limit)
        return [Evidence(document_id=r["document_id"], kind=r["kind"], title=r["title"],
                         text=r["body"], rank=float(r["rank"])) for r in rows]
