"""`PlannerStore`: runs and their steps, each journaled in the transaction that records it."""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import asyncpg
import msgspec

from libs.journal import Journal
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
    ProposalEntry,
    RunRecord,
    RunStartedEntry,
    StatusEntry,
)
from services.planner.store._replay import read_replay
from services.planner.store._rows import Reservation, RunRow, RunState, Step
from services.planner.store._sealed import open_run, sealed_run
from services.planner.store._sql import (
    BEHIND,
    HELD,
    LOCK,
    LOCKED,
    RESERVATION_COLUMNS,
    RESERVATIONS,
    RUN_COLUMNS,
    STATE,
    STEPS,
    STEPS_KEPT,
    behind_args,
    behind_cte,
)

__all__ = ["PlannerStore"]


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
        while len(self._steps) > STEPS_KEPT:
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
        token = BEHIND.set({})
        try:
            yield
        finally:
            BEHIND.reset(token)

    @staticmethod
    def write_behind(run_id: str, *rows: Reservation) -> bool:
        """Keep `rows` of the run (each as it must stand: state and use) to be written with
        the transaction's next statement; False outside a `writing_behind` scope (the caller
        writes them itself)."""
        kept = BEHIND.get()
        if kept is None:
            return False
        for row in rows:
            kept[(run_id, row.step_key)] = row
        return True

    @staticmethod
    def writes_behind() -> bool:
        """Whether this is a `writing_behind` scope."""
        return BEHIND.get() is not None

    @staticmethod
    def unwritten() -> int:
        """How many kept rows no statement has written yet."""
        return len(BEHIND.get() or ())

    async def flush(self, conn: asyncpg.Connection) -> None:
        """Write the kept rows now (a statement of their own), if any are left."""
        kept = BEHIND.get()
        if kept:
            await conn.execute(f"WITH {behind_cte(1)} SELECT 1", *behind_args(kept))
            kept.clear()

    def _with_behind(self, first: int) -> tuple[str, list[Any]]:
        """The kept rows' CTE (", behind AS (...)") and parameters, for a statement whose
        parameters end at $first-1; nothing if no row is kept."""
        kept = BEHIND.get()
        if not kept:
            return "", []
        return f", {behind_cte(first)}", behind_args(kept)

    @staticmethod
    def _written() -> None:
        kept = BEHIND.get()
        if kept:
            kept.clear()

    async def _changed_and_captured(
        self,
        conn: asyncpg.Connection,
        change: str,
        args: tuple[Any, ...],
        *,
        tenant: str,
        kind: str,
        subject: str,
        run_id: str,
        payload: msgspec.Struct,
    ) -> Any:
        """`change` (a statement that returns a row if it changed something) and, only then,
        its journal row, in one statement; the first column of the changed row (None if
        nothing changed). One round trip where the change and its `_capture` took two (and
        the kept reservation rows with them)."""
        changed = f"changed AS ({change})"
        if self._journal is not None:
            await self._journal.prepare(tenant, run_id)
        entry = (
            ()
            if self._journal is None
            else msgspec.structs.astuple(
                self._journal.entry(
                    tenant=tenant, kind=kind, subject=subject, payload=payload, run_id=run_id
                )
            )
        )
        journal = (
            "" if self._journal is None else f", {self._journal.cte_if(len(args) + 1, 'changed')}"
        )
        behind, kept = self._with_behind(len(args) + len(entry) + 1)
        done = await conn.fetchval(
            f"WITH {changed}{journal}{behind} SELECT (SELECT * FROM changed LIMIT 1)",
            *args,
            *entry,
            *kept,
        )
        self._written()
        return done

    async def _capture(
        self,
        conn: asyncpg.Connection,
        *,
        tenant: str,
        kind: str,
        subject: str,
        run_id: str,
        payload: msgspec.Struct,
    ) -> None:
        if self._journal is None:
            return
        await self._journal.prepare(tenant, run_id)
        entry = msgspec.structs.astuple(
            self._journal.entry(
                tenant=tenant, kind=kind, subject=subject, payload=payload, run_id=run_id
            )
        )
        behind, kept = self._with_behind(len(entry) + 1)
        if not kept:
            await conn.execute(self._journal.insert_sql, *entry)
            return
        await conn.execute(f"WITH {self._journal.cte(1)}{behind} SELECT 1", *entry, *kept)
        self._written()

    async def create_run(
        self,
        started: EvidenceGathered,
        *,
        manifest: dict[str, Any] | None = None,
        conn: asyncpg.Connection | None = None,
    ) -> bool:
        """Record a new run (with the agent snapshot it starts with), in its own transaction
        on `conn` if given (else on a pooled connection); False if the run already exists (a
        redelivery or a re-sent request)."""
        if conn is None:
            async with self._pool.acquire() as pooled:
                return await self.create_run(started, manifest=manifest, conn=pooled)
        evidence = msgspec.to_builtins(started.evidence)
        sealed = await sealed_run(
            self._journal, started.tenant, started.run_id, started.input, evidence
        )
        # One statement, hence one transaction: the run and (only if it is new) the untrusted
        # content the model will see, captured for replay.
        return bool(
            await self._changed_and_captured(
                conn,
                "INSERT INTO planner.runs (run_id, tenant, request_id, principal, agent, input, "
                "evidence, status, attended, manifest, sealed) VALUES ($1, $2, $3, $4, $5, $6, "
                "$7::jsonb, 'running', $8, $9::jsonb, $10) ON CONFLICT DO NOTHING RETURNING true",
                (
                    started.run_id,
                    started.tenant,
                    started.request_id,
                    started.principal,
                    started.agent,
                    "" if sealed is not None else started.input,
                    "[]" if sealed is not None else json.dumps(evidence),
                    started.attended,
                    None if manifest is None else json.dumps(manifest),
                    sealed,
                ),
                tenant=started.tenant,
                kind=RUN_STARTED,
                subject=started.run_id,
                run_id=started.run_id,
                payload=RunStartedEntry(
                    request_id=started.request_id,
                    principal=started.principal,
                    agent=started.agent,
                    input=started.input,
                    evidence=evidence,
                    attended=started.attended,
                    manifest=manifest,
                ),
            )
        )

    async def create_branch(self, conn: asyncpg.Connection, branch: RunRow) -> bool:
        """Record a branch run (another agent a run called) in the caller's transaction, with
        its start journaled under its own id; False if it exists already (a redelivery)."""
        assert branch.manifest is not None
        sealed = await sealed_run(self._journal, branch.tenant, branch.run_id, branch.input, [])
        created = await conn.fetchval(
            "INSERT INTO planner.runs (run_id, tenant, request_id, principal, agent, input, "
            "evidence, status, attended, manifest, sealed) VALUES ($1, $2, $3, $4, $5, $6, "
            "'[]'::jsonb, 'running', $8, $7::jsonb, $9) ON CONFLICT DO NOTHING RETURNING true",
            branch.run_id,
            branch.tenant,
            branch.request_id,
            branch.principal,
            branch.agent,
            "" if sealed is not None else branch.input,
            json.dumps(branch.manifest),
            branch.attended,
            sealed,
        )
        if created:
            await self._capture(
                conn,
                tenant=branch.tenant,
                kind=RUN_STARTED,
                subject=branch.run_id,
                run_id=branch.run_id,
                payload=RunStartedEntry(
                    request_id=branch.request_id,
                    principal=branch.principal,
                    agent=branch.agent,
                    input=branch.input,
                    evidence=[],
                    attended=False,
                    manifest=branch.manifest,
                ),
            )
        return bool(created)

    async def pending_reviews(
        self, tenant: str, limit: int, pending_id: str | None = None
    ) -> list[asyncpg.Record]:
        """The tenant's runs stopped at a review (`review-<run>-<step>`), newest first; with
        `pending_id`, only the run stopped at that one (looked up by id, however many wait)."""
        return await self._pool.fetch(
            "SELECT pending_id, run_id, agent, principal, updated_at, "
            "coalesce(error_message, '') AS prompt FROM planner.runs "
            "WHERE tenant = $1 AND status = 'awaiting_human' AND pending_id LIKE 'review-%' "
            "AND ($3::text IS NULL OR pending_id = $3) "
            "ORDER BY updated_at DESC LIMIT $2",
            tenant,
            limit,
            pending_id,
        )

    async def run(
        self, conn: asyncpg.Connection, run_id: str, *, fresh: bool = False
    ) -> RunRow | None:
        """The run as committed, unlocked (a branch's end, read by the run that called it);
        `fresh`: its window key read again, as what a person reads must be."""
        row = await conn.fetchrow(
            f"SELECT {RUN_COLUMNS} FROM planner.runs WHERE run_id = $1", run_id
        )
        return None if row is None else await open_run(conn, self._journal, row, again=fresh)

    def acquire(self) -> Any:
        """A pooled connection."""
        return self._pool.acquire()

    async def lock_run(self, conn: asyncpg.Connection, run_id: str) -> RunRow | None:
        """The run, locked until the caller's transaction ends (and that transaction counted
        on its row, as `locked` needs of every transaction that locks a run)."""
        row = await conn.fetchrow(LOCK, run_id)
        return None if row is None else await open_run(conn, self._journal, row)

    async def locked(self, conn: asyncpg.Connection, run_id: str) -> tuple[RunRow, RunState] | None:
        """`lock_run` and `state` in one round trip; None if there is no such run.

        One statement has one snapshot, taken before it waits for the lock: a transaction
        that held the lock and committed meanwhile is invisible to it. Each transaction that
        locks a run counts itself on the row, and the lock returns the newest count: if it is
        not the one this snapshot saw plus this transaction's, the state is read again, under
        the lock now (`state`)."""
        known = self._steps.get(run_id, ())
        row = await conn.fetchrow(LOCKED, run_id, known[-1].seq if known else -1)
        if row is None:
            return None
        run = await open_run(conn, self._journal, row)
        if row["seen_version"] == row["version"] - 1:
            state = self._state_of(row, run, known)
            if state is not None:
                return run, state
        return run, await self.state(conn, run)

    async def state(self, conn: asyncpg.Connection, run: RunRow) -> RunState:
        """The locked run's steps in order, its cancellation and its reservations, in one
        round trip (call it after `lock_run`, in the same transaction)."""
        known = self._steps.get(run.run_id, ())
        row = await conn.fetchrow(STATE, run.run_id, run.tenant, known[-1].seq if known else -1)
        state = self._state_of(row, run, known)
        if state is None:  # a step below those read before: read them all
            row = await conn.fetchrow(STATE, run.run_id, run.tenant, -1)
            state = self._state_of(row, run, ())
        assert state is not None  # every step read, by the statement that counted them
        return state

    def _state_of(
        self, row: asyncpg.Record, run: RunRow, known: tuple[Step, ...]
    ) -> RunState | None:
        """The state `row` read after the `known` steps; None if they are not all the run's
        steps before those it read (another planner committed one below them)."""
        steps = [*known, *STEPS.decode(row["steps"])]
        if len(steps) != row["step_count"]:
            return None
        own = row["own_from"]
        self._remember(run.run_id, [st for st in steps if own is None or st.seq < own])
        return RunState(
            steps=steps,
            cancelled_by=row["cancelled_by"],
            reservations=RESERVATIONS.decode(row["reservations"]),
            now=row["now"],
        )

    async def steps(self, conn: asyncpg.Connection, run_id: str) -> list[Step]:
        """The run's steps in order."""
        rows = await conn.fetch(
            "SELECT seq, kind, payload FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id
        )
        return [Step(seq=r["seq"], kind=r["kind"], payload=json.loads(r["payload"])) for r in rows]

    async def _add_step(
        self,
        conn: asyncpg.Connection,
        run: RunRow,
        seq: int,
        kind: str,
        payload: dict[str, Any],
        input_digest: str | None = None,
        *,
        journal_kind: str,
        entry: msgspec.Struct,
    ) -> bool:
        """Record a step once, with its journal row in the same statement."""
        return bool(
            await self._changed_and_captured(
                conn,
                "INSERT INTO planner.steps (run_id, seq, kind, payload, input_digest) "
                "VALUES ($1, $2, $3, $4::jsonb, $5) ON CONFLICT DO NOTHING RETURNING true",
                (run.run_id, seq, kind, json.dumps(payload), input_digest),
                tenant=run.tenant,
                kind=journal_kind,
                subject=f"{run.run_id}/{seq}",
                run_id=run.run_id,
                payload=entry,
            )
        )

    async def add_decision(
        self,
        conn: asyncpg.Connection,
        run: RunRow,
        seq: int,
        response: dict[str, Any],
        *,
        turn: int,
        input_digest: str,
        proposal: ProposalEntry | None,
    ) -> bool:
        """Record a captured model response once, and the proposal the runtime made of it."""
        if not await self._add_step(
            conn,
            run,
            seq,
            "decision",
            response,
            input_digest,
            journal_kind=DECISION,
            entry=DecisionEntry(seq=seq, turn=turn, input_digest=input_digest, response=response),
        ):
            return False
        subject = f"{run.run_id}/{seq}"
        if proposal is not None:
            await self._capture(
                conn,
                tenant=run.tenant,
                kind=PROPOSAL,
                subject=subject,
                run_id=run.run_id,
                payload=proposal,
            )
        return True

    async def add_critic(
        self,
        conn: asyncpg.Connection,
        run: RunRow,
        seq: int,
        *,
        step: int,
        round: int,
        verdict: dict[str, Any],
        input_digest: str,
    ) -> bool:
        """Record a captured critic verdict on the answer of `step` once."""
        return await self._add_step(
            conn,
            run,
            seq,
            "critic",
            verdict,
            input_digest,
            journal_kind=CRITIC,
            entry=CriticEntry(
                seq=seq, step=step, round=round, input_digest=input_digest, verdict=verdict
            ),
        )

    async def add_proposal(
        self, conn: asyncpg.Connection, run: RunRow, proposal: ProposalEntry
    ) -> None:
        """Journal the proposal a checked `select_capability` became (once its capability call
        was reserved: the caller records it with that reservation, once)."""
        await self._capture(
            conn,
            tenant=run.tenant,
            kind=PROPOSAL,
            subject=f"{run.run_id}/{proposal.step}",
            run_id=run.run_id,
            payload=proposal,
        )

    async def reservation(
        self, conn: asyncpg.Connection, run_id: str, step_key: str
    ) -> Reservation | None:
        """The reservation recorded for this step key, if any."""
        row = await conn.fetchrow(
            f"SELECT {RESERVATION_COLUMNS} FROM planner.reservations "
            "WHERE run_id = $1 AND step_key = $2",
            run_id,
            step_key,
        )
        return None if row is None else Reservation(**dict(row))

    async def hold(
        self,
        conn: asyncpg.Connection,
        run_id: str,
        *held: Reservation,
        closing: dict[str, list[str]] | None = None,
    ) -> bool:
        """Record open reservations (a step's, or a lease and its first draw); False if the
        first one's step key has one already. `closing`: step keys (by run id) governance
        settled with it, recorded closed in the same statement."""
        closing = dict(closing or {})
        same = closing.pop(run_id, [])
        for other, keys in closing.items():  # a branch's settlement carried by its root's
            await self.closed(conn, other, *keys)
        columns = [[getattr(r, f) for r in held] for f in HELD]
        return bool(
            await conn.fetchval(
                "WITH closed AS (UPDATE planner.reservations SET state = 'closed' "
                "WHERE run_id = $1 AND step_key = ANY($2::text[])), "
                "held AS (INSERT INTO planner.reservations (run_id, state, step_key, "
                "reservation_id, lease, reserved_provider_calls, reserved_tokens, "
                "reserved_capability_calls, expires_at) SELECT $1, 'open', * FROM "
                "unnest($3::text[], $4::text[], $5::text[], $6::int[], $7::int[], $8::int[], "
                "$9::float8[]) ON CONFLICT DO NOTHING RETURNING step_key) "
                "SELECT EXISTS (SELECT 1 FROM held WHERE step_key = $3[1])",
                run_id,
                same,
                *columns,
            )
        )

    async def spent(
        self,
        conn: asyncpg.Connection,
        run_id: str,
        step_key: str,
        *,
        provider_calls: int = 0,
        tokens: int = 0,
        capability_calls: int = 0,
    ) -> Reservation | None:
        """The step is over: record what it used (once); the reservation if it is now due."""
        row = await conn.fetchrow(
            # A draw on a lease is closed here: the lease is settled for it (`budgeting.py`).
            "UPDATE planner.reservations SET provider_calls = $3, tokens = $4, "
            "capability_calls = $5, "
            "state = CASE WHEN lease IS NULL THEN 'due' ELSE 'closed' END "
            "WHERE run_id = $1 AND step_key = $2 AND state = 'open' "
            f"RETURNING {RESERVATION_COLUMNS}",
            run_id,
            step_key,
            provider_calls,
            tokens,
            capability_calls,
        )
        return None if row is None else Reservation(**dict(row))

    async def due(self, conn: asyncpg.Connection, run_id: str) -> list[Reservation]:
        """The run's reservations whose use is known but not yet settled in governance."""
        rows = await conn.fetch(
            f"SELECT {RESERVATION_COLUMNS} FROM planner.reservations "
            "WHERE run_id = $1 AND state = 'due' ORDER BY step_key",
            run_id,
        )
        return [Reservation(**dict(r)) for r in rows]

    async def closed(self, conn: asyncpg.Connection, run_id: str, *step_keys: str) -> None:
        """Governance has settled these reservations."""
        await conn.execute(
            "UPDATE planner.reservations SET state = 'closed' "
            "WHERE run_id = $1 AND step_key = ANY($2::text[])",
            run_id,
            list(step_keys),
        )

    async def add_observation(
        self,
        conn: asyncpg.Connection,
        run: RunRow,
        seq: int,
        *,
        step: int,
        output: dict[str, Any],
        observation: dict[str, Any],
    ) -> bool:
        """Record what the model observes of a captured tool output once."""
        return await self._add_step(
            conn,
            run,
            seq,
            "observation",
            observation,
            journal_kind=OBSERVATION,
            entry=ObservationEntry(seq=seq, step=step, output=output, observation=observation),
        )

    async def set_status(
        self,
        conn: asyncpg.Connection,
        run: RunRow,
        status: str,
        *,
        step: int | None = None,
        answer: str | None = None,
        error_code: str | None = None,
        error_message: str | None = None,
        pending_id: str | None = None,
    ) -> int | None:
        """Move the run to `status` (`pending_id`: the decision it now waits for): the run's
        new `state_version`, None (and nothing journaled) if it was there already."""
        return await self._changed_and_captured(
            conn,
            "UPDATE planner.runs SET status = $2, answer = $3, error_code = $4, "
            "error_message = $5, pending_id = $6, updated_at = now(), "
            "result_due = $2 IN ('succeeded', 'failed', 'cancelled'), "
            "state_version = state_version + 1 WHERE run_id = $1 "
            "AND (status, answer, error_code, error_message, pending_id) "
            "IS DISTINCT FROM ($2, $3, $4, $5, $6) "
            "RETURNING state_version",
            (run.run_id, status, answer, error_code, error_message, pending_id),
            tenant=run.tenant,
            kind=RUN_STATUS,
            subject=run.run_id,
            run_id=run.run_id,
            payload=StatusEntry(
                status=status,
                step=step,
                answer=answer,
                error_code=error_code,
                error_message=error_message,
            ),
        )

    async def read_replay(
        self, tenant: str, run_id: str
    ) -> tuple[list[Captured], RunRecord | None, int]:
        """What `replay_run` needs of one run of `tenant`."""
        if self._journal is None:
            raise RuntimeError("the planner has no journal to replay from")
        async with self._pool.acquire() as conn:
            return await read_replay(conn, self._journal, tenant=tenant, run_id=run_id)
