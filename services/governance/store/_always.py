"""What an `always` answer writes: the narrow grant or rule it stands for, journaled with it.

Code execution gets exactly the allow rule for the simple command asked about, for that agent.
Anything else gets a standing grant of the agent for the tool's family, never for a tool name;
but an `mcp:` tool gets a grant for that tool as pinned (the digest it was asked on): no
family-wide grant covers an `mcp:` tool, and a definition the server changed is asked again,
even once classified again into the same family (docs/design.md §4, §11).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

__all__ = ["write_always"]

Write = Callable[..., Awaitable[None]]


async def write_always(
    conn: asyncpg.Connection,
    write: Write,
    *,
    tenant: str,
    row: Any,
    by: str,
    pending_id: str,
) -> None:
    """Write the grant or rule of an `always` answer to the pending decision `row`, in the
    answer's transaction (`write`: the store's journal writer)."""
    if row["family"] == "execute_code":
        rule_id = await conn.fetchval(
            "INSERT INTO governance.rules (tenant, tool, arg_prefix, agent, effect, digest) "
            "VALUES ($1, $2, $3, $4, 'allow', $5) RETURNING rule_id",
            tenant,
            row["tool"],
            row["first_argument"],
            row["agent"],
            row["digest"],
        )
        await write(
            conn,
            tenant=tenant,
            kind="rule.added",
            subject=str(rule_id),
            run_id=row["run_id"],
            payload={
                "rule_id": rule_id,
                "tool": row["tool"],
                "arg_prefix": row["first_argument"],
                "agent": row["agent"],
                "effect": "allow",
                "digest": row["digest"],
                "by": by,
                "pending_id": pending_id,
            },
        )
        return
    source, digest = ("", "") if row["digest"] is None else (row["tool"], row["digest"])
    status = await conn.execute(
        "INSERT INTO governance.standing_grants (tenant, agent, family, granted_by, source, "
        "digest) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        tenant,
        row["agent"],
        row["family"],
        by,
        source,
        digest,
    )
    if status != "INSERT 0 0":
        await write(
            conn,
            tenant=tenant,
            kind="grant.standing",
            subject=f"{row['agent']}/{row['family']}",
            run_id=row["run_id"],
            payload={
                "agent": row["agent"],
                "family": row["family"],
                "source": source,
                "digest": digest,
                "granted_by": by,
                "pending_id": pending_id,
            },
        )
