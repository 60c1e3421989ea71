"""The planner's SQL: runs and their recorded steps, each journaled in the same transaction.

Every run started (with the evidence its model saw), every step (a captured model response,
critic verdict or tool output, and the proposal a decision became) and every status change
writes its audit
journal row (`libs/journal.py`) in the transaction that records it, and only when it recorded
something: a redelivery journals nothing twice. `read_replay` reads a run back for
`services/planner/replay/`. The run's budget reservations in governance are recorded with the
steps they pay for (`reservations`), so a redelivered step reuses its reservation and what a
step used is settled even if the planner stopped before it could tell governance.
"""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import asyncpg
import msgspec

from libs.journal import Journal, read_entries
from schemas.retrieval import EvidenceGathered
from services.planner.journal_entries import (
    CRITIC,
    DECISION,
    OBSERVATION,
    PROPOSAL,
    RUN_STARTED,
    RUN_STATUS,
    Captured,
    CriticEntry,
    DecisionEntry,
    ObservationEntry,
    PlanRecord,
    ProposalEntry,
    RunRecord,
    RunStartedEntry,
    StatusEntry,
    StepRecord,
)

__all__ = ["PlannerStore", "Reservation", "RunRow", "RunState", "Step", "read_replay"]

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
    # The agent snapshot the run started with (version, responsibility, catalog), or None.
    manifest: dict[str, Any] | None = None
    # The decision a stopped run waits for a person to take (a pending decision's id, or a
    # review's), None while it runs or once it ended.
    pending_id: str | None = None


class Step(msgspec.Struct, frozen=True, kw_only=True):
    """A captured model decision or an observation fed back to the model."""

    seq: int
    kind: str
    payload: dict[str, Any]


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """A budget reservation of the run's, as the planner recorded it."""

    step_key: str
    reservation_id: str
    state: str  # open | due | closed
    # What the step used (recorded when it is spent; a lease's: what its draws used).
    provider_calls: int = 0
    tokens: int = 0
    capability_calls: int = 0
    # A draw on a lease (`budgeting.py`): the lease's step key, and what the draw holds of it;
    # a lease: what governance granted, and until when it may be drawn on (epoch seconds).
    lease: str | None = None
    reserved_provider_calls: int = 0
    reserved_tokens: int = 0
    reserved_capability_calls: int = 0
    expires_at: float | None = None


class RunState(msgspec.Struct, frozen=True, kw_only=True):
    """What the planner reads of a locked run in one statement: its steps, who asked to
    cancel it, and its budget reservations."""

    steps: list[Step]
    cancelled_by: str | None = None
    reservations: list[Reservation] = []
    now: float = 0.0  # the database's clock (epoch seconds), which a lease expires by


# Read after the run's lock was granted (a statement of its own, so its snapshot sees every
# step a delivery that held the lock before committed).
_STATE = """
SELECT (SELECT coalesce(json_agg(json_build_object('seq', seq, 'kind', kind, 'payload', payload)
                                 ORDER BY seq), '[]'::json)
        FROM planner.steps WHERE run_id = $1 AND seq > $3) AS steps,
       (SELECT count(*) FROM planner.steps WHERE run_id = $1) AS step_count,
       -- The first step this transaction wrote itself (not committed: never kept).
       (SELECT min(seq) FROM planner.steps WHERE run_id = $1
        AND xmin::text::bigint = pg_current_xact_id()::text::bigint % 4294967296) AS own_from,
       (SELECT principal FROM planner.cancellations
        WHERE run_id = $1 AND tenant = $2) AS cancelled_by,
       (SELECT coalesce(json_agg(json_build_object(
                   'step_key', step_key, 'reservation_id', reservation_id, 'state', state,
                   'provider_calls', provider_calls, 'tokens', tokens,
                   'capability_calls', capability_calls, 'lease', lease,
                   'reserved_provider_calls', reserved_provider_calls,
                   'reserved_tokens', reserved_tokens,
                   'reserved_capability_calls', reserved_capability_calls,
                   'expires_at', expires_at)), '[]'::json)
        FROM planner.reservations WHERE run_id = $1) AS reservations,
       extract(epoch FROM now())::float8 AS now
"""
_RESERVATION_COLUMNS = ("step_key, reservation_id, state, provider_calls, tokens, "
                        "capability_calls, lease, reserved_provider_calls, reserved_tokens, "
                        "reserved_capability_calls, expires_at")
# What `hold` inserts of each reservation, in its statement's order.
_HELD = ("step_key", "reservation_id", "lease", "reserved_provider_calls", "reserved_tokens",
         "reserved_capability_calls", "expires_at")
# Reservation rows kept to be written with the transaction's next statement (`write_behind`):
# (run id, step key) -> the row as it must stand; None outside a `writing_behind` scope.
_BEHIND: ContextVar[dict[tuple[str, str], Reservation] | None] = ContextVar(
    "writ_planner_behind", default=None)
# The columns a kept row writes, with their array types, in `_behind_cte`'s order.
_BEHIND_COLUMNS = (("step_key", "text"), ("reservation_id", "text"), ("state", "text"),
                   ("provider_calls", "int"), ("tokens", "int"), ("capability_calls", "int"),
                   ("lease", "text"), ("reserved_provider_calls", "int"),
                   ("reserved_tokens", "int"), ("reserved_capability_calls", "int"),
                   ("expires_at", "float8"))


def _behind_cte(first: int) -> str:
    """A data-modifying CTE writing the kept rows from parameters $first.. (the run ids, then
    one array per column): a new row is inserted, a known one takes its new state and use. A
    closed row is never opened again (the planner closes a reservation once governance took
    its settlement)."""
    columns = ", ".join(name for name, _ in _BEHIND_COLUMNS)
    arrays = ", ".join(f"${first + 1 + i}::{kind}[]" for i, (_, kind) in enumerate(_BEHIND_COLUMNS))
    return (f"behind AS (INSERT INTO planner.reservations (run_id, {columns}) "
            f"SELECT * FROM unnest(${first}::text[], {arrays}) "
            "ON CONFLICT (run_id, step_key) DO UPDATE SET state = EXCLUDED.state, "
            "provider_calls = EXCLUDED.provider_calls, tokens = EXCLUDED.tokens, "
            "capability_calls = EXCLUDED.capability_calls "
            "WHERE planner.reservations.state <> 'closed')")


def _behind_args(kept: dict[tuple[str, str], Reservation]) -> list[list[Any]]:
    rows = list(kept.items())
    return [[run_id for (run_id, _), _ in rows],
            *([getattr(r, name) for _, r in rows] for name, _ in _BEHIND_COLUMNS)]


_STEPS = msgspec.json.Decoder(list[Step])
_STEPS_KEPT = 1024  # runs whose steps `state` keeps (what the planner drives at once, and more)
_RESERVATIONS = msgspec.json.Decoder(list[Reservation])

_RUN_COLUMNS = ("run_id, tenant, request_id, principal, agent, input, evidence, status, answer, "
                "error_code, error_message, attended, manifest, pending_id")


def _run(row: asyncpg.Record) -> RunRow:
    values = dict(row)
    values["evidence"] = json.loads(values["evidence"])
    if values["manifest"] is not None:
        values["manifest"] = json.loads(values["manifest"])
    return RunRow(**values)


class PlannerStore:
    """Runs and steps; `locked` serialises the work on one run across deliveries.

    `journal` is None only in tests of something else: the service always passes one.
    """

    def __init__(self, pool: asyncpg.Pool, *, journal: Journal | None = None) -> None:
        self._pool, self._journal = pool, journal
        # The committed steps of recently driven runs, as `state` read them: a step is never
        # changed once written, so the next `state` of the run reads only the steps after
        # these (and all of them if the count says one below appeared).
        self._steps: OrderedDict[str, tuple[Step, ...]] = OrderedDict()

    def _remember(self, run_id: str, steps: list[Step]) -> None:
        self._steps[run_id] = tuple(steps)
        self._steps.move_to_end(run_id)
        while len(self._steps) > _STEPS_KEPT:
            self._steps.popitem(last=False)

    @property
    def journal(self) -> Journal | None:
        """The planner's audit journal."""
        return self._journal

    @staticmethod
    @contextlib.contextmanager
    def writing_behind() -> Iterator[None]:
        """Within this scope, reservation rows given to `write_behind` are written with the
        transaction's next step, run or journal statement (one round trip for both), or by
        `flush`, which the caller must await before each of its transactions commits."""
        token = _BEHIND.set({})
        try:
            yield
        finally:
            _BEHIND.reset(token)

    @staticmethod
    def write_behind(run_id: str, *rows: Reservation) -> bool:
        """Keep `rows` of the run (each as it must stand: state and use) to be written with
        the transaction's next statement; False outside a `writing_behind` scope (the caller
        writes them itself)."""
        kept = _BEHIND.get()
        if kept is None:
            return False
        for row in rows:
            kept[(run_id, row.step_key)] = row
        return True

    @staticmethod
    def unwritten() -> int:
        """How many kept rows no statement has written yet."""
        return len(_BEHIND.get() or ())

    async def flush(self, conn: asyncpg.Connection) -> None:
        """Write the kept rows now (a statement of their own), if any are left."""
        kept = _BEHIND.get()
        if kept:
            await conn.execute(f"WITH {_behind_cte(1)} SELECT 1", *_behind_args(kept))
            kept.clear()

    def _with_behind(self, first: int) -> tuple[str, list[Any]]:
        """The kept rows' CTE (", behind AS (...)") and parameters, for a statement whose
        parameters end at $first-1; nothing if no row is kept."""
        kept = _BEHIND.get()
        if not kept:
            return "", []
        return f", {_behind_cte(first)}", _behind_args(kept)

    @staticmethod
    def _written() -> None:
        kept = _BEHIND.get()
        if kept:
            kept.clear()

    async def _changed_and_captured(self, conn: asyncpg.Connection, change: str,
                                    args: tuple[Any, ...], *, tenant: str, kind: str,
                                    subject: str, run_id: str, payload: msgspec.Struct) -> bool:
        """`change` (a statement that returns a row if it changed something) and, only then,
        its journal row, in one statement; whether it changed something. One round trip where
        the change and its `_capture` took two (and the kept reservation rows with them)."""
        changed = f"changed AS ({change})"
        if self._journal is None:
            behind, kept = self._with_behind(len(args) + 1)
            done = bool(await conn.fetchval(
                f"WITH {changed}{behind} SELECT EXISTS (SELECT 1 FROM changed)", *args, *kept))
            self._written()
            return done
        entry = msgspec.structs.astuple(self._journal.entry(
            tenant=tenant, kind=kind, subject=subject, payload=payload, run_id=run_id))
        behind, kept = self._with_behind(len(args) + len(entry) + 1)
        done = bool(await conn.fetchval(
            f"WITH {changed}, {self._journal.cte_if(len(args) + 1, 'changed')}{behind} "
            "SELECT EXISTS (SELECT 1 FROM changed)", *args, *entry, *kept))
        self._written()
        return done

    async def _capture(self, conn: asyncpg.Connection, *, tenant: str, kind: str,
                       subject: str, run_id: str, payload: msgspec.Struct) -> None:
        if self._journal is None:
            return
        entry = msgspec.structs.astuple(self._journal.entry(
            tenant=tenant, kind=kind, subject=subject, payload=payload, run_id=run_id))
        behind, kept = self._with_behind(len(entry) + 1)
        if not kept:
            await conn.execute(self._journal.insert_sql, *entry)
            return
        await conn.execute(f"WITH {self._journal.cte(1)}{behind} SELECT 1", *entry, *kept)
        self._written()

    async def create_run(self, started: EvidenceGathered, *,
                         manifest: dict[str, Any] | None = None,
                         conn: asyncpg.Connection | None = None) -> bool:
        """Record a new run (with the agent snapshot it starts with), in its own transaction
        on `conn` if given (else on a pooled connection); False if the run already exists (a
        redelivery or a re-sent request)."""
        if conn is None:
            async with self._pool.acquire() as pooled:
                return await self.create_run(started, manifest=manifest, conn=pooled)
        evidence = msgspec.to_builtins(started.evidence)
        # One statement, hence one transaction: the run and (only if it is new) the untrusted
        # content the model will see, captured for replay.
        return await self._changed_and_captured(
            conn,
            "INSERT INTO planner.runs (run_id, tenant, request_id, principal, agent, input, "
            "evidence, status, attended, manifest) VALUES ($1, $2, $3, $4, $5, $6, "
            "$7::jsonb, 'running', $8, $9::jsonb) ON CONFLICT DO NOTHING RETURNING true",
            (started.run_id, started.tenant, started.request_id, started.principal,
             started.agent, started.input, json.dumps(evidence), started.attended,
             None if manifest is None else json.dumps(manifest)),
            tenant=started.tenant, kind=RUN_STARTED, subject=started.run_id,
            run_id=started.run_id, payload=RunStartedEntry(
                request_id=started.request_id, principal=started.principal,
                agent=started.agent, input=started.input, evidence=evidence,
                attended=started.attended, manifest=manifest))

    async def create_branch(self, conn: asyncpg.Connection, branch: RunRow) -> bool:
        """Record a branch run (another agent a run called) in the caller's transaction, with
        its start journaled under its own id; False if it exists already (a redelivery)."""
        assert branch.manifest is not None
        created = await conn.fetchval(
            "INSERT INTO planner.runs (run_id, tenant, request_id, principal, agent, input, "
            "evidence, status, attended, manifest) VALUES ($1, $2, $3, $4, $5, $6, "
            "'[]'::jsonb, 'running', $8, $7::jsonb) ON CONFLICT DO NOTHING RETURNING true",
            branch.run_id, branch.tenant, branch.request_id, branch.principal, branch.agent,
            branch.input, json.dumps(branch.manifest), branch.attended)
        if created:
            await self._capture(conn, tenant=branch.tenant, kind=RUN_STARTED,
                                subject=branch.run_id, run_id=branch.run_id,
                                payload=RunStartedEntry(
                                    request_id=branch.request_id, principal=branch.principal,
                                    agent=branch.agent, input=branch.input, evidence=[],
                                    attended=False, manifest=branch.manifest))
        return bool(created)

    async def pending_reviews(self, tenant: str, limit: int) -> list[asyncpg.Record]:
        """The tenant's runs stopped at a review (`review-<run>-<step>`), newest first."""
        return await self._pool.fetch(
            "SELECT pending_id, run_id, agent, principal, updated_at FROM planner.runs "
            "WHERE tenant = $1 AND status = 'awaiting_human' AND pending_id LIKE 'review-%' "
            "ORDER BY updated_at DESC LIMIT $2", tenant, limit)

    async def run(self, conn: asyncpg.Connection, run_id: str) -> RunRow | None:
        """The run as committed, unlocked (a branch's end, read by the run that called it)."""
        row = await conn.fetchrow(
            f"SELECT {_RUN_COLUMNS} FROM planner.runs WHERE run_id = $1", run_id)
        return None if row is None else _run(row)

    def acquire(self) -> Any:
        """A pooled connection."""
        return self._pool.acquire()

    async def lock_run(self, conn: asyncpg.Connection, run_id: str) -> RunRow | None:
        """The run, locked until the caller's transaction ends."""
        row = await conn.fetchrow(
            f"SELECT {_RUN_COLUMNS} FROM planner.runs WHERE run_id = $1 FOR UPDATE", run_id)
        return None if row is None else _run(row)

    async def state(self, conn: asyncpg.Connection, run: RunRow) -> RunState:
        """The locked run's steps in order, its cancellation and its reservations, in one
        round trip (call it after `lock_run`, in the same transaction)."""
        known = self._steps.get(run.run_id, ())
        row = await conn.fetchrow(_STATE, run.run_id, run.tenant, known[-1].seq if known else -1)
        steps = [*known, *_STEPS.decode(row["steps"])]
        if len(steps) != row["step_count"]:  # a step below those read before: read them all
            row = await conn.fetchrow(_STATE, run.run_id, run.tenant, -1)
            steps = _STEPS.decode(row["steps"])
        own = row["own_from"]
        self._remember(run.run_id, [st for st in steps if own is None or st.seq < own])
        return RunState(steps=steps, cancelled_by=row["cancelled_by"],
                        reservations=_RESERVATIONS.decode(row["reservations"]), now=row["now"])

    async def steps(self, conn: asyncpg.Connection, run_id: str) -> list[Step]:
        """The run's steps in order."""
        rows = await conn.fetch(
            "SELECT seq, kind, payload FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id)
        return [Step(seq=r["seq"], kind=r["kind"], payload=json.loads(r["payload"]))
                for r in rows]

    async def _add_step(self, conn: asyncpg.Connection, run: RunRow, seq: int, kind: str,
                        payload: dict[str, Any], input_digest: str | None = None, *,
                        journal_kind: str, entry: msgspec.Struct) -> bool:
        """Record a step once, with its journal row in the same statement."""
        return await self._changed_and_captured(
            conn,
            "INSERT INTO planner.steps (run_id, seq, kind, payload, input_digest) "
            "VALUES ($1, $2, $3, $4::jsonb, $5) ON CONFLICT DO NOTHING RETURNING true",
            (run.run_id, seq, kind, json.dumps(payload), input_digest),
            tenant=run.tenant, kind=journal_kind, subject=f"{run.run_id}/{seq}",
            run_id=run.run_id, payload=entry)

    async def add_decision(self, conn: asyncpg.Connection, run: RunRow, seq: int,
                           response: dict[str, Any], *, turn: int, input_digest: str,
                           proposal: ProposalEntry | None) -> bool:
        """Record a captured model response once, and the proposal the runtime made of it."""
        if not await self._add_step(conn, run, seq, "decision", response, input_digest,
                                    journal_kind=DECISION, entry=DecisionEntry(
                                        seq=seq, turn=turn, input_digest=input_digest,
                                        response=response)):
            return False
        subject = f"{run.run_id}/{seq}"
        if proposal is not None:
            await self._capture(conn, tenant=run.tenant, kind=PROPOSAL, subject=subject,
                                run_id=run.run_id, payload=proposal)
        return True

    async def add_critic(self, conn: asyncpg.Connection, run: RunRow, seq: int, *, step: int,
                         round: int, verdict: dict[str, Any], input_digest: str) -> bool:
        """Record a captured critic verdict on the answer of `step` once."""
        return await self._add_step(conn, run, seq, "critic", verdict, input_digest,
                                    journal_kind=CRITIC, entry=CriticEntry(
                                        seq=seq, step=step, round=round,
                                        input_digest=input_digest, verdict=verdict))

    async def add_proposal(self, conn: asyncpg.Connection, run: RunRow,
                           proposal: ProposalEntry) -> None:
        """Journal the proposal a checked `select_capability` became (once its capability call
        was reserved: the caller records it with that reservation, once)."""
        await self._capture(conn, tenant=run.tenant, kind=PROPOSAL,
                            subject=f"{run.run_id}/{proposal.step}", run_id=run.run_id,
                            payload=proposal)

    async def reservation(self, conn: asyncpg.Connection, run_id: str,
                          step_key: str) -> Reservation | None:
        """The reservation recorded for this step key, if any."""
        row = await conn.fetchrow(
            f"SELECT {_RESERVATION_COLUMNS} FROM planner.reservations "
            "WHERE run_id = $1 AND step_key = $2", run_id, step_key)
        return None if row is None else Reservation(**dict(row))

    async def hold(self, conn: asyncpg.Connection, run_id: str, *held: Reservation,
                   closing: dict[str, list[str]] | None = None) -> bool:
        """Record open reservations (a step's, or a lease and its first draw); False if the
        first one's step key has one already. `closing`: step keys (by run id) governance
        settled with it, recorded closed in the same statement."""
        closing = dict(closing or {})
        same = closing.pop(run_id, [])
        for other, keys in closing.items():  # a branch's settlement carried by its root's
            await self.closed(conn, other, *keys)
        columns = [[getattr(r, f) for r in held] for f in _HELD]
        return bool(await conn.fetchval(
            "WITH closed AS (UPDATE planner.reservations SET state = 'closed' "
            "WHERE run_id = $1 AND step_key = ANY($2::text[])), "
            "held AS (INSERT INTO planner.reservations (run_id, state, step_key, "
            "reservation_id, lease, reserved_provider_calls, reserved_tokens, "
            "reserved_capability_calls, expires_at) SELECT $1, 'open', * FROM "
            "unnest($3::text[], $4::text[], $5::text[], $6::int[], $7::int[], $8::int[], "
            "$9::float8[]) ON CONFLICT DO NOTHING RETURNING step_key) "
            "SELECT EXISTS (SELECT 1 FROM held WHERE step_key = $3[1])",
            run_id, same, *columns))

    async def spent(self, conn: asyncpg.Connection, run_id: str, step_key: str, *,
                    provider_calls: int = 0, tokens: int = 0,
                    capability_calls: int = 0) -> Reservation | None:
        """The step is over: record what it used (once); the reservation if it is now due."""
        row = await conn.fetchrow(
            # A draw on a lease is closed here: the lease is settled for it (`budgeting.py`).
            "UPDATE planner.reservations SET provider_calls = $3, tokens = $4, "
            "capability_calls = $5, "
            "state = CASE WHEN lease IS NULL THEN 'due' ELSE 'closed' END "
            "WHERE run_id = $1 AND step_key = $2 AND state = 'open' "
            f"RETURNING {_RESERVATION_COLUMNS}",
            run_id, step_key, provider_calls, tokens, capability_calls)
        return None if row is None else Reservation(**dict(row))

    async def due(self, conn: asyncpg.Connection, run_id: str) -> list[Reservation]:
        """The run's reservations whose use is known but not yet settled in governance."""
        rows = await conn.fetch(
            f"SELECT {_RESERVATION_COLUMNS} FROM planner.reservations "
            "WHERE run_id = $1 AND state = 'due' ORDER BY step_key",
            run_id)
        return [Reservation(**dict(r)) for r in rows]

    async def closed(self, conn: asyncpg.Connection, run_id: str, *step_keys: str) -> None:
        """Governance has settled these reservations."""
        await conn.execute("UPDATE planner.reservations SET state = 'closed' "
                           "WHERE run_id = $1 AND step_key = ANY($2::text[])", run_id,
                           list(step_keys))

    async def add_observation(self, conn: asyncpg.Connection, run: RunRow, seq: int, *,
                              step: int, output: dict[str, Any],
                              observation: dict[str, Any]) -> bool:
        """Record what the model observes of a captured tool output once."""
        return await self._add_step(conn, run, seq, "observation", observation,
                                    journal_kind=OBSERVATION, entry=ObservationEntry(
                                        seq=seq, step=step, output=output,
                                        observation=observation))

    async def set_status(self, conn: asyncpg.Connection, run: RunRow, status: str, *,
                         step: int | None = None, answer: str | None = None,
                         error_code: str | None = None, error_message: str | None = None,
                         pending_id: str | None = None) -> bool:
        """Move the run to `status` (`pending_id`: the decision it now waits for); False (and
        nothing journaled) if it was there already."""
        return await self._changed_and_captured(
            conn,
            "UPDATE planner.runs SET status = $2, answer = $3, error_code = $4, "
            "error_message = $5, pending_id = $6, updated_at = now() WHERE run_id = $1 "
            "AND (status, answer, error_code, error_message, pending_id) "
            "IS DISTINCT FROM ($2, $3, $4, $5, $6) "
            "RETURNING true", (run.run_id, status, answer, error_code, error_message, pending_id),
            tenant=run.tenant, kind=RUN_STATUS, subject=run.run_id, run_id=run.run_id,
            payload=StatusEntry(status=status, step=step, answer=answer,
                                error_code=error_code, error_message=error_message))

    async def read_replay(self, tenant: str, run_id: str
                          ) -> tuple[list[Captured], RunRecord | None, int]:
        """What `replay_run` needs of one run of `tenant`."""
        if self._journal is None:
            raise RuntimeError("the planner has no journal to replay from")
        async with self._pool.acquire() as conn:
            return await read_replay(conn, self._journal, tenant=tenant, run_id=run_id)


async def read_replay(conn: asyncpg.Connection, journal: Journal, *, tenant: str, run_id: str
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
        entries = [Captured(seq=seq, kind=row["kind"], payload=msgspec.json.decode(plaintext))
                   for of in journaled
                   for seq, row, plaintext in await read_entries(conn, journal, tenant=tenant,
                                                                 run_id=of)]
        unsealed = await conn.fetchval(
            f"SELECT count(*) FROM {s}.journal j WHERE j.tenant = $1 AND j.run_id = ANY($2) "
            f"AND NOT EXISTS (SELECT 1 FROM {s}.journal_seals s WHERE s.entry_id = j.id)",
            tenant, journaled)
        run = await conn.fetchrow(
            "SELECT status, answer, error_code, error_message, evidence FROM planner.runs "
            "WHERE run_id = $1 AND tenant = $2", run_id, tenant)
        if run is None:
            return _of_turn(entries, run_id), None, unsealed
        steps = await conn.fetch(
            "SELECT seq, kind, payload, input_digest FROM planner.steps WHERE run_id = $1 "
            "ORDER BY seq", run_id)
        plans = await conn.fetch(
            "SELECT plan_id, state, digest, steps FROM planner.plans WHERE run_id = $1 "
            "ORDER BY created_at", run_id)
    record = RunRecord(status=run["status"], answer=run["answer"],
                       error_code=run["error_code"], error_message=run["error_message"],
                       evidence=json.loads(run["evidence"]),
                       steps=[StepRecord(seq=r["seq"], kind=r["kind"],
                                         payload=json.loads(r["payload"]),
                                         input_digest=r["input_digest"]) for r in steps],
                       plans=[PlanRecord(plan_id=r["plan_id"], state=r["state"],
                                         digest=r["digest"], steps=json.loads(r["steps"]))
                              for r in plans])
    return _of_turn(entries, run_id), record, unsealed


def _of_turn(entries: list[Captured], run_id: str) -> list[Captured]:
    """The run's own entries and, of its session's, whether it plans (`SessionOpened`) and
    this turn's plans and their answers (a fork's copies of its parent's plans are earlier
    turns'), in chain order."""
    turn = run_id.rpartition("-t")[2]
    plans = {str(e.payload["plan"]["plan_id"]) for e in entries
             if e.kind == "session.PlanProposed" and str(e.payload["plan"]["turn"]) == turn}

    def kept(e: Captured) -> bool:
        if e.kind == "session.PlanProposed":
            return str(e.payload["plan"]["plan_id"]) in plans
        if e.kind == "session.PlanDecided":
            return str(e.payload["plan_id"]) in plans
        return e.kind == "session.SessionOpened" or not e.kind.startswith("session.")

    return sorted((e for e in entries if kept(e)), key=lambda e: e.seq)
