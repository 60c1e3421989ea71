"""The statements governance's store runs, and how a row of facts becomes `Facts`."""

from __future__ import annotations

import asyncpg
import msgspec

from services.governance.logic import Facts, Rule
from services.governance.store._records import DEFAULT_POLICY_VERSION

__all__ = [
    "FACTS",
    "INSERT_DECISION",
    "INSERT_PENDING",
    "PENDING_COUNT",
    "PENDING_PAGE",
    "RUN",
    "RUN_BUDGET",
    "RUN_GRANTS",
    "facts_of",
]


# One row per call asked about, in order: $1 tenants, $2 tools, $3 agents, $4 principals, $5 run
# ids, $6 approval ids (uuid or NULL), $7 the root runs (the run itself, or the run a branch
# descends from: its grants and attendance), $8 the calls' first arguments, $9 the sources the
# calls' tools belong to (`mcp:<server>/*` of an `mcp:` capability, else NULL: rules and grants
# may name one, `logic.names_of`), $10 an `mcp:` call's pinned digest (else NULL: a person's
# answer about an `mcp:` tool approves the definition it was asked on, no other). Concurrent decides
# read their facts in one statement (`facts_many`); each row is what its call alone would read.
# An approval stands in for a grant for exactly the call a person answered: a proposal's is
# bound to the proposal (the command admitted from it is what dispatches), any other call's to
# its first argument.
FACTS = """
SELECT p.version, p.status, p.refused_tools, p.refused_connectors, p.refused_families,
       p.developer_mode,
       (SELECT coalesce(json_agg(json_build_object('tool', r.tool, 'effect', r.effect,
                                                   'arg_prefix', r.arg_prefix,
                                                   'agent', r.agent, 'digest', r.digest)),
                         '[]')
        FROM governance.rules r
        WHERE r.tenant = q.tenant AND r.tool IN (q.tool, q.source)
          AND (r.agent IS NULL OR r.agent = q.agent)) AS rules,
       EXISTS (SELECT 1 FROM governance.revocations v
               WHERE v.tenant = q.tenant AND v.principal = q.principal) AS revoked,
       ARRAY(SELECT g.family FROM governance.standing_grants g
             WHERE g.tenant = q.tenant AND g.agent = q.agent AND g.source = '') AS standing,
       (SELECT coalesce(json_agg(json_build_array(g.source, g.family, g.digest)), '[]')
        FROM governance.standing_grants g
        WHERE g.tenant = q.tenant AND g.agent = q.agent
          AND g.source IN (q.tool, q.source) AND g.digest <> '') AS standing_sources,
       ARRAY(SELECT g.family FROM governance.run_grants g
             WHERE g.tenant = q.tenant AND g.run_id = q.root_run) AS run_families,
       coalesce((SELECT r.attended FROM governance.runs r
                 WHERE r.tenant = q.tenant AND r.run_id = q.root_run), false) AS attended,
       EXISTS (SELECT 1 FROM governance.pending a
               WHERE a.tenant = q.tenant AND a.run_id = q.run_id AND a.tool = q.tool
                 AND (a.proposal_id IS NOT NULL OR a.first_argument = q.arg)
                 AND a.answer_decision_id = q.approval_id
                 AND a.digest IS NOT DISTINCT FROM q.digest
                 AND a.answer IN ('once', 'always')) AS approved
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::uuid[], $7::text[],
            $8::text[], $9::text[], $10::text[]) WITH ORDINALITY
         AS q(tenant, tool, agent, principal, run_id, approval_id, root_run, arg, source, digest,
              i)
LEFT JOIN governance.policy p ON p.tenant = q.tenant
ORDER BY q.i
"""


INSERT_DECISION = """
INSERT INTO governance.decisions (decision_id, tenant, run_id, agent, principal, tool, family,
    verdict, line, reason, policy_version)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
"""


# A run, once (a redelivery inserts nothing), and its run grants with it ($6: the families).
RUN = (
    "run AS (INSERT INTO governance.runs (tenant, run_id, principal, agent, attended) "
    "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING 1)"
)
RUN_GRANTS = (
    "grants AS (INSERT INTO governance.run_grants (tenant, run_id, family, "
    "granted_by) SELECT $1, $2, family, $3 FROM unnest($6::text[]) AS family "
    "WHERE EXISTS (SELECT 1 FROM run) ON CONFLICT DO NOTHING)"
)
# $1 tenant, $2 run, $4 agent, $7-$11 the limits (register_run's parameters).
RUN_BUDGET = (
    "budget AS (INSERT INTO governance.budgets (tenant, run_id, agent, provider_calls, "
    "tokens, capability_calls, wall_time_s, max_concurrent_steps) "
    "VALUES ($1, $2, $4, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING RETURNING 1)"
)


def facts_of(row: asyncpg.Record) -> Facts:
    """The `Facts` of one row of `FACTS`."""
    rules = tuple(msgspec.json.decode(row["rules"], type=list[Rule]))
    common = {
        "rules": rules,
        "standing_families": frozenset(row["standing"]),
        "standing_sources": frozenset(
            msgspec.json.decode(row["standing_sources"], type=list[tuple[str, str, str]])
        ),
        "run_families": frozenset(row["run_families"]),
        "principal_revoked": row["revoked"],
        "approved": row["approved"],
        "attended": row["attended"],
    }
    if row["version"] is None:
        return Facts(policy_version=DEFAULT_POLICY_VERSION, **common)
    return Facts(
        policy_version=row["version"],
        policy_refused=row["status"] != "valid",
        refused_tools=frozenset(row["refused_tools"]),
        refused_connectors=frozenset(row["refused_connectors"]),
        refused_families=frozenset(row["refused_families"]),
        developer_mode=row["developer_mode"],
        **common,
    )


# At most one open pending decision per proposal (migration 008): a concurrent second ask
# inserts nothing. $14: an `mcp:` tool's pinned digest, which `always` grants exactly.
INSERT_PENDING = (
    "INSERT INTO governance.pending (pending_id, tenant, run_id, proposal_id, agent, principal, "
    "tool, family, first_argument, reason, options, attended, deadline, digest) "
    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) "
    "ON CONFLICT (tenant, proposal_id) WHERE proposal_id IS NOT NULL AND answer IS NULL "
    "DO NOTHING RETURNING pending_id"
)


# The unanswered decisions `ListPending` filters: its count, and a page of them after a cursor
# ($8, $9) in `order`, `after` being `>` oldest first or `<` newest first.
_PENDING_WHERE = (
    "tenant = $1 AND answer IS NULL "
    "AND ($2::bool IS NULL OR (proposal_id IS NOT NULL) = $2) "
    "AND ($3::text IS NULL OR agent = $3) AND ($4::text IS NULL OR tool = $4) "
    "AND ($5::text IS NULL OR principal = $5) "
    "AND ($6::int IS NULL OR created_at <= now() - make_interval(secs => $6)) "
    "AND ($7::text IS NULL OR pending_id::text = $7)"
)
PENDING_COUNT = f"SELECT count(*) FROM governance.pending WHERE {_PENDING_WHERE}"
PENDING_PAGE = (
    "SELECT pending_id::text AS pending_id, run_id, agent, principal, tool, family, "
    "first_argument, reason, options, attended, deadline, created_at, "
    "proposal_id IS NOT NULL AS about_proposal "
    f"FROM governance.pending WHERE {_PENDING_WHERE} "
    "AND ($8::timestamptz IS NULL OR (created_at, pending_id::text) {after} ($8, $9)) "
    "ORDER BY created_at {order}, pending_id::text {order} LIMIT $10"
)
