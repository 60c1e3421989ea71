"""A run read back from the planner's journal, for replay and evaluation."""

from __future__ import annotations

import json

import asyncpg
import msgspec

from libs.journal import (
    Expired,
    Journal,
    PayloadExpired,
    WindowKeys,
    read_entries,
    refresh,
    unseal,
)
from services.planner.journal_entries import (
    Captured,
    PlanRecord,
    RunRecord,
    StepRecord,
)
from services.planner.store._sql import SEALED_RUN, run_aad

__all__ = ["read_replay"]


async def read_replay(
    conn: asyncpg.Connection, journal: Journal, *, tenant: str, run_id: str
) -> tuple[list[Captured], RunRecord | None, int]:
    """A run's sealed journal entries (decrypted, in chain order), the runtime's record of it
    (None if the run is not the tenant's) and how many of its journal rows are not sealed yet.

    One repeatable-read snapshot: the record and the journal are read at the same instant.
    """
    # (imported here: the sessions package imports this module)
    from services.planner.sessions.logic import is_turn_run, turn_of

    s = journal.schema
    # A chat turn's run: its session's journal says whether the turn plans first and what its
    # plans were and how they were answered (`session.*`, journaled under the session's id).
    journaled = [run_id, turn_of(run_id)[0]] if is_turn_run(run_id) else [run_id]
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        entries = [
            Captured(seq=seq, kind=row["kind"], payload=msgspec.json.decode(plaintext))
            for of in journaled
            for seq, row, plaintext in await read_entries(conn, journal, tenant=tenant, run_id=of)
        ]
        unsealed = await conn.fetchval(
            f"SELECT count(*) FROM {s}.journal j WHERE j.tenant = $1 AND j.run_id = ANY($2) "
            f"AND NOT EXISTS (SELECT 1 FROM {s}.journal_seals s WHERE s.entry_id = j.id)",
            tenant,
            journaled,
        )
        run = await conn.fetchrow(
            "SELECT status, answer, error_code, error_message, evidence, sealed FROM planner.runs "
            "WHERE run_id = $1 AND tenant = $2",
            run_id,
            tenant,
        )
        if run is None:
            return _of_turn(entries, run_id), None, unsealed
        evidence = json.loads(run["evidence"])
        if run["sealed"] is not None:
            keys = journal.keys
            if not isinstance(keys, WindowKeys):
                keys = WindowKeys(keys, schema=s)
            await refresh(conn, keys, [run["sealed"]], again=True)
            opened = unseal(keys, run["sealed"], run_aad(run_id))
            if isinstance(opened, Expired):
                raise PayloadExpired(str(opened), key_id=opened.key_id)
            evidence = SEALED_RUN.decode(opened).evidence
        steps = await conn.fetch(
            "SELECT seq, kind, payload, input_digest FROM planner.steps WHERE run_id = $1 "
            "ORDER BY seq",
            run_id,
        )
        plans = await conn.fetch(
            "SELECT plan_id, state, digest, steps FROM planner.plans WHERE run_id = $1 "
            "ORDER BY created_at",
            run_id,
        )
    record = RunRecord(
        status=run["status"],
        answer=run["answer"],
        error_code=run["error_code"],
        error_message=run["error_message"],
        evidence=evidence,
        steps=[
            StepRecord(
                seq=r["seq"],
                kind=r["kind"],
                payload=json.loads(r["payload"]),
                input_digest=r["input_digest"],
            )
            for r in steps
        ],
        plans=[
            PlanRecord(
                plan_id=r["plan_id"],
                state=r["state"],
                digest=r["digest"],
                steps=json.loads(r["steps"]),
            )
            for r in plans
        ],
    )
    return _of_turn(entries, run_id), record, unsealed


def _of_turn(entries: list[Captured], run_id: str) -> list[Captured]:
    """The run's own entries and, of its session's, whether it plans (`SessionOpened`) and
    this turn's plans and their answers (a fork's copies of its parent's plans are earlier
    turns'), in chain order."""
    turn = run_id.rpartition("-t")[2]
    plans = {
        str(e.payload["plan"]["plan_id"])
        for e in entries
        if e.kind == "session.PlanProposed" and str(e.payload["plan"]["turn"]) == turn
    }

    def kept(e: Captured) -> bool:
        if e.kind == "session.PlanProposed":
            return str(e.payload["plan"]["plan_id"]) in plans
        if e.kind == "session.PlanDecided":
            return str(e.payload["plan_id"]) in plans
        return e.kind == "session.SessionOpened" or not e.kind.startswith("session.")

    return sorted((e for e in entries if kept(e)), key=lambda e: e.seq)
