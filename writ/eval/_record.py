"""Recording a report as evidence: its digest in the planner's journal, sealed and signed there.

"This model was admitted on set v7" is worth something only if nobody could have written it
after the fact, so the report's digest goes where every run's decisions go: the planner's audit
journal, whose sealer chains it and signs a checkpoint over it with the planner's key, which
`writ audit verify --service planner` checks. The planner's journal because the set was built
from it: an auditor reads the decisions and the verdict on them in one chain.

The evaluation does not get the planner's DSN for that. It logs in as its own role,
`<database>_eval`, which holds one privilege: EXECUTE on `planner.record_eval_report`, a
SECURITY DEFINER function owned by the planner's role that inserts one journal row of kind
`eval.report` (run id empty, recorded within a minute of the server's clock) and returns its
id. No SELECT, INSERT, UPDATE or DELETE on any table; the row's payload is encrypted under the
planner's data keys (the same ones `writ eval build` reads the journal with), so a row whose
payload was encrypted for another kind does not authenticate and the sealer keeps it as a
rejection. `provision_eval_recorder` creates the role and the function; `writ run` calls it.
"""

from __future__ import annotations

import secrets
from typing import Any, Final

import asyncpg

from libs.db import role_name, with_database
from libs.journal import Journal

__all__ = ["RECORD_KIND", "provision_eval_recorder", "record_report"]

RECORD_KIND: Final = "eval.report"
_FUNCTION: Final = "planner.record_eval_report(text, text, text, bytea, bytea, timestamptz)"


def _function_sql(planner: str, recorder: str) -> list[str]:
    return [
        f"""CREATE OR REPLACE FUNCTION planner.record_eval_report(
            p_tenant text, p_subject text, p_key_id text, p_nonce bytea, p_ciphertext bytea,
            p_recorded_at timestamptz) RETURNS bigint
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        DECLARE new_id bigint;
        BEGIN
            IF abs(extract(epoch FROM (p_recorded_at - clock_timestamp()))) > 60 THEN
                RAISE EXCEPTION 'an eval report is recorded now, not at %', p_recorded_at
                    USING ERRCODE = 'check_violation';
            END IF;
            INSERT INTO planner.journal (tenant, kind, subject, run_id, key_id, nonce,
                                         ciphertext, recorded_at)
            VALUES (p_tenant, '{RECORD_KIND}', p_subject, '', p_key_id, p_nonce, p_ciphertext,
                    p_recorded_at)
            RETURNING id INTO new_id;
            RETURN new_id;
        END $$""",
        f'ALTER FUNCTION {_FUNCTION} OWNER TO "{planner}"',
        # Functions are executable by PUBLIC unless revoked.
        f"REVOKE ALL ON FUNCTION {_FUNCTION} FROM PUBLIC",
        f'GRANT USAGE ON SCHEMA planner TO "{recorder}"',
        f'GRANT EXECUTE ON FUNCTION {_FUNCTION} TO "{recorder}"',
    ]


async def provision_eval_recorder(
    admin_dsn: str, database: str, password: str | None = None
) -> str:
    """The login role `<database>_eval` and the one function it may call; its password (the
    given one, or a new one). Idempotent; the planner's schema must be migrated."""
    role = role_name(database, "eval")
    password = password or secrets.token_urlsafe(24)
    if "'" in password or "\\" in password:
        raise ValueError("password contains quote characters")
    admin = await asyncpg.connect(admin_dsn)
    try:
        verb = (
            "ALTER"
            if await admin.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role)
            else "CREATE"
        )
        await admin.execute(
            f'{verb} ROLE "{role}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE '
            f"NOINHERIT NOREPLICATION PASSWORD '{password}'"
        )
        await admin.execute(f'GRANT CONNECT ON DATABASE "{database}" TO "{role}"')
    finally:
        await admin.close()
    conn = await asyncpg.connect(with_database(admin_dsn, database))
    try:
        async with conn.transaction():
            for sql in _function_sql(role_name(database, "planner"), role):
                await conn.execute(sql)
    finally:
        await conn.close()
    return password


def report_entry(report: Any, digest: str) -> dict[str, Any]:
    """What the journal row says: the digest, the set version, the candidate and the verdict."""
    return {
        "digest": digest,
        "set_version": report.set_version,
        "candidate": report.candidate,
        "mode": report.mode,
        "k": report.k,
        "verdict": report.gate.verdict,
        "exit_code": report.gate.exit_code,
    }


async def record_report(
    conn: asyncpg.Connection, journal: Journal, report: Any, digest: str
) -> int:
    """One `eval.report` row of the report's tenant, subject its set version; its id."""
    e = journal.entry(
        tenant=report.tenant,
        kind=RECORD_KIND,
        subject=report.set_version,
        payload=report_entry(report, digest),
    )
    row_id = await conn.fetchval(
        "SELECT planner.record_eval_report($1, $2, $3, $4, $5, $6)",
        e.tenant,
        e.subject,
        e.key_id,
        e.nonce,
        e.ciphertext,
        e.recorded_at,
    )
    return int(row_id)
