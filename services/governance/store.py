"""Governance's SQL: read the facts a decision needs, record the decision."""

from __future__ import annotations

import uuid

import asyncpg

from services.governance.logic import Call, Facts, Rule, Ruling

__all__ = ["GovernanceStore"]

_DEFAULT_POLICY_VERSION = "default"


class GovernanceStore:
    """Reads policy, rules and grants; writes decisions."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def facts(self, tenant: str, call: Call, principal: str) -> Facts:
        """Everything `decide` needs for this call, read in one snapshot."""
        async with self._pool.acquire() as conn, conn.transaction(
                isolation="repeatable_read", readonly=True):
            policy = await conn.fetchrow(
                "SELECT version, refused_tools, refused_connectors, refused_families "
                "FROM governance.policy WHERE tenant = $1", tenant)
            rules = await conn.fetch(
                "SELECT tool, effect, arg_prefix, agent FROM governance.rules "
                "WHERE tenant = $1 AND tool = $2 AND (agent IS NULL OR agent = $3)",
                tenant, call.tool, call.agent)
            revoked = await conn.fetchval(
                "SELECT true FROM governance.revocations WHERE tenant = $1 AND principal = $2",
                tenant, principal)
            grants = await conn.fetch(
                "SELECT family FROM governance.standing_grants WHERE tenant = $1 AND agent = $2",
                tenant, call.agent)
        return Facts(
            policy_version=policy["version"] if policy else _DEFAULT_POLICY_VERSION,
            refused_tools=frozenset(policy["refused_tools"]) if policy else frozenset(),
            refused_connectors=frozenset(policy["refused_connectors"]) if policy else frozenset(),
            refused_families=frozenset(policy["refused_families"]) if policy else frozenset(),
            rules=tuple(Rule(tool=r["tool"], effect=r["effect"], arg_prefix=r["arg_prefix"],
                             agent=r["agent"]) for r in rules),
            standing_families=frozenset(r["family"] for r in grants),
            principal_revoked=bool(revoked),
        )

    async def record(self, *, tenant: str, run_id: str, principal: str, call: Call,
                     ruling: Ruling, policy_version: str) -> str:
        """Persist the decision; its id is what admission stores with the command."""
        decision_id = str(uuid.uuid4())
        await self._pool.execute(
            "INSERT INTO governance.decisions (decision_id, tenant, run_id, agent, principal, "
            "tool, family, verdict, line, reason, policy_version) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            decision_id, tenant, run_id, call.agent, principal, call.tool,
            call.family or "unclassified", ruling.verdict, ruling.line, ruling.reason,
            policy_version)
        return decision_id
