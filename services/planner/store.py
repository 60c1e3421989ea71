"""The planner's SQL: runs and their recorded steps."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import msgspec

from schemas.retrieval import EvidenceGathered

__all__ = ["PlannerStore", "RunRow", "Step"]

TERMINAL_RUN = frozenset({"succeeded", "failed", "cancelled"})


class RunRow(msgspec.Struct, frozen=True, kw_only=True):
    """One run as the planner recorded it."""

    run_id: str
    tenant: str
    request_id: str
    principal: str
    agent: str
    input: str
    evidence: list[dict[str, Any]]
    status: str
    answer: str | None
    error_code: str | None
    error_message: str | None
    attended: bool = False


class Step(msgspec.Struct, frozen=True, kw_only=True):
    """A captured model decision or an observation fed back to the model."""

    seq: int
    kind: str
    payload: dict[str, Any]


_RUN_COLUMNS = ("run_id, tenant, request_id, principal, agent, input, evidence, status, answer, "
                "error_code, error_message, attended")


def _run(row: asyncpg.Record) -> RunRow:
    values = dict(row)
    values["evidence"] = json.loads(values["evidence"])
    return RunRow(**values)


class PlannerStore:
    """Runs and steps; `locked` serialises the work on one run across deliveries."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create_run(self, started: EvidenceGathered) -> bool:
        """Record a new run; False if the run already exists (a redelivery or a re-sent request)."""
        evidence = json.dumps(msgspec.to_builtins(started.evidence))
        created = await self._pool.fetchval(
            "INSERT INTO planner.runs (run_id, tenant, request_id, principal, agent, input, "
            "evidence, status, attended) VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, 'running', "
            "$8) ON CONFLICT DO NOTHING RETURNING true",
            started.run_id, started.tenant, started.request_id, started.principal,
            started.agent, started.input, evidence, started.attended)
        return bool(created)

    def acquire(self) -> Any:
        """A pooled connection."""
        return self._pool.acquire()

    async def exists(self, run_id: str) -> bool:
        """Whether this planner knows the run (one statement, no transaction)."""
        return bool(await self._pool.fetchval(
            "SELECT true FROM planner.runs WHERE run_id = $1", run_id))

    async def lock_run(self, conn: asyncpg.Connection, run_id: str) -> RunRow | None:
        """The run, locked until the caller's transaction ends."""
        row = await conn.fetchrow(
            f"SELECT {_RUN_COLUMNS} FROM planner.runs WHERE run_id = $1 FOR UPDATE", run_id)
        return None if row is None else _run(row)

    async def steps(self, conn: asyncpg.Connection, run_id: str) -> list[Step]:
        """The run's steps in order."""
        rows = await conn.fetch(
            "SELECT seq, kind, payload FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id)
        return [Step(seq=r["seq"], kind=r["kind"], payload=json.loads(r["payload"]))
                for r in rows]

    async def add_step(self, conn: asyncpg.Connection, run_id: str, seq: int, kind: str,
                       payload: dict[str, Any], input_digest: str | None = None) -> bool:
        """Record a step once; False if that step was already recorded."""
        added = await conn.fetchval(
            "INSERT INTO planner.steps (run_id, seq, kind, payload, input_digest) "
            "VALUES ($1, $2, $3, $4::jsonb, $5) ON CONFLICT DO NOTHING RETURNING true",
            run_id, seq, kind, json.dumps(payload), input_digest)
        return bool(added)

    async def set_status(self, conn: asyncpg.Connection, run_id: str, status: str, *,
                         answer: str | None = None, error_code: str | None = None,
                         error_message: str | None = None) -> None:
        """Move the run to `status`."""
        await conn.execute(
            "UPDATE planner.runs SET status = $2, answer = $3, error_code = $4, "
            "error_message = $5, updated_at = now() WHERE run_id = $1",
            run_id, status, answer, error_code, error_message)
