"""Governance's record of each tenant's organisation policy: which tenants have one, a loaded
(or refused) policy saved when it changed, a withdrawn one dropped; each change journaled in its
transaction."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
import msgspec

from services.governance.store._records import Policy

__all__ = ["PolicyStore", "Write"]

# Writes one journal row on the connection: (conn, *, tenant, kind, subject, payload).
Write = Callable[..., Awaitable[None]]


class PolicyStore:
    """The `governance.policy` rows, read and written with their journal rows."""

    def __init__(self, pool: asyncpg.Pool, write: Write) -> None:
        self._pool, self._write = pool, write

    async def tenants(self) -> list[str]:
        """Tenants with a recorded org policy."""
        return [r["tenant"] for r in await self._pool.fetch("SELECT tenant FROM governance.policy")]

    async def drop(self, tenant: str) -> None:
        """Forget a tenant's org policy (its file was withdrawn)."""
        async with self._pool.acquire() as conn, conn.transaction():
            version = await conn.fetchval(
                "DELETE FROM governance.policy WHERE tenant = $1 RETURNING version", tenant
            )
            if version is not None:
                await self._write(
                    conn,
                    tenant=tenant,
                    kind="policy.withdrawn",
                    subject=version,
                    payload={"tenant": tenant, "version": version},
                )

    async def save(self, policy: Policy) -> None:
        """Record a loaded (or refused) organisation policy for its tenant, if it changed."""
        async with self._pool.acquire() as conn, conn.transaction():
            changed = await conn.fetchval(
                "INSERT INTO governance.policy (tenant, version, status, refusal, "
                "refused_tools, refused_connectors, refused_families, developer_mode, key_id, "
                "digest, updated_at) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now()) "
                "ON CONFLICT (tenant) DO UPDATE SET version = $2, status = $3, refusal = $4, "
                "refused_tools = $5, refused_connectors = $6, refused_families = $7, "
                "developer_mode = $8, key_id = $9, digest = $10, updated_at = now() "
                # The same file read again by a restarted process is not a new event.
                "WHERE (policy.version, policy.status, policy.refusal, policy.refused_tools, "
                "policy.refused_connectors, policy.refused_families, policy.developer_mode, "
                "policy.key_id, policy.digest) IS DISTINCT FROM ($2, $3, $4, $5::text[], "
                "$6::text[], $7::text[], $8, $9, $10) RETURNING true",
                policy.tenant,
                policy.version,
                policy.status,
                policy.refusal,
                list(policy.refused_tools),
                list(policy.refused_connectors),
                list(policy.refused_families),
                policy.developer_mode,
                policy.key_id,
                policy.digest,
            )
            if changed:
                await self._write(
                    conn,
                    tenant=policy.tenant,
                    kind="policy.loaded",
                    subject=policy.version,
                    payload=msgspec.to_builtins(policy),
                )
