"""Where `writ eval build` reads journaled runs from: the auditor's read-only DSN, the planner's
journal (its data keys) for the runs, admission's record of the facts each proposal was resolved
against, and governance's journal (its data keys) for the policy each was ruled with.
"""

from __future__ import annotations

import argparse
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["governance", "journal_cases", "journal_source"]


def journal_source(args: argparse.Namespace) -> tuple[str, Any]:
    """The auditor's DSN and the planner's journal (its data keys) to build from."""
    from libs.errors import ConfigError
    from libs.journal import DataKeys, Journal

    home = Path(args.home)
    dsn_file = home / "secrets" / "audit.dsn"
    dsn = (
        args.dsn
        or os.environ.get("WRIT_AUDIT_DATABASE_URL")
        or (dsn_file.read_text().strip() if dsn_file.exists() else "")
    )
    if not dsn:
        raise ConfigError("no database: pass --dsn, set WRIT_AUDIT_DATABASE_URL or run `writ run`")
    keys_file = Path(args.data_keys or home / "secrets" / "journal-planner-data.json")
    return dsn, Journal(service="planner", keys=DataKeys.from_json(keys_file.read_text()))


def governance(args: argparse.Namespace) -> Any:
    """Governance's journal (its data keys), whose decisions carry the policy each proposal
    was ruled with; None if its keys are not here and were not named (the default policy)."""
    from libs.journal import DataKeys, Journal

    named = args.governance_keys
    keys_file = Path(named or Path(args.home) / "secrets" / "journal-governance-data.json")
    if not named and not keys_file.exists():
        return None
    return Journal(service="governance", keys=DataKeys.from_json(keys_file.read_text()))


async def journal_cases(
    args: argparse.Namespace,
    dsn: str,
    journal: Any,
    governance: Any,
    facts: dict[str, Any],
    policy: dict[str, Any] | None,
) -> tuple[list[Any], list[str]]:
    import asyncpg

    from services.planner.store import read_replay
    from writ.eval._case import CaseError, cases_from_run
    from writ.eval._facts import recorded_facts, recorded_policies

    conn = await asyncpg.connect(dsn)
    try:
        runs = await conn.fetch(
            "SELECT run_id FROM planner.runs WHERE tenant = $1 "
            "AND ($2::text IS NULL OR agent = $2) AND ($3::text IS NULL OR status = $3) "
            "AND ($4::timestamptz IS NULL OR created_at >= $4) "
            "AND ($5::timestamptz IS NULL OR created_at < $5) ORDER BY created_at, run_id",
            args.tenant,
            args.agent,
            args.outcome,
            datetime.fromisoformat(args.since) if args.since else None,
            datetime.fromisoformat(args.until) if args.until else None,
        )
        cases, skipped = [], []
        for row in runs:
            entries, _, unsealed = await read_replay(
                conn, journal, tenant=args.tenant, run_id=row["run_id"]
            )
            if unsealed:
                skipped.append(f"run {row['run_id']}: {unsealed} journal rows not sealed yet")
                continue
            recorded = await recorded_facts(conn, args.tenant, row["run_id"])
            policies = (
                {}
                if governance is None
                else await recorded_policies(conn, governance, args.tenant, row["run_id"])
            )
            try:
                cases += cases_from_run(
                    row["run_id"],
                    entries,
                    facts=facts,
                    policy=policy,
                    recorded=recorded,
                    policies=policies,
                    tenant=args.tenant,
                )
            except (CaseError, msgspec.ValidationError) as exc:
                skipped.append(str(exc))
    finally:
        await conn.close()
    return cases, skipped
