"""The sessions' SQL: sessions, their turns, events and injected messages (migration 009).

Every event is numbered under the session's row lock (the caller holds it: `lock`) and written
with its audit journal row (`session.<EventType>`, journaled under the session's id) in the
caller's transaction; `source` names what produced it, so deriving it again adds nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import asyncpg
import msgspec

from libs.journal import Expired, Journal, WindowKeys, column_aad, refresh, seal, unseal
from schemas.sessions import AnySessionEvent, SessionEvent
from services.planner.memory import HistoryEntry, entries_of

__all__ = ["SessionRow", "SessionStore", "TurnRow", "entry_of", "step_entry_of"]

_EVENT_DECODER: Final = msgspec.json.Decoder(AnySessionEvent)
_COLUMNS: Final = (
    "session_id, tenant, principal, agent, plan_mode, state, turn, turn_open, "
    "parent_session_id, fork_turn, fork_step, branch_run_id, last_n, "
    "published_n"
)


class SessionRow(msgspec.Struct, frozen=True, kw_only=True):
    """One session as the planner recorded it."""

    session_id: str
    tenant: str
    principal: str
    agent: str
    plan_mode: bool
    state: str
    turn: int
    turn_open: bool
    parent_session_id: str | None
    fork_turn: int | None
    fork_step: int | None
    branch_run_id: str | None
    last_n: int
    published_n: int


class TurnRow(msgspec.Struct, frozen=True, kw_only=True):
    """One turn of a session and the run that drives it."""

    session_id: str
    turn: int
    run_id: str
    message_key: str
    input: str
    status: str
    started: bool
    # The window key of its input if that key was destroyed (then `input` is empty).
    expired: str | None = None


def _session(row: asyncpg.Record | None) -> SessionRow | None:
    return None if row is None else SessionRow(**dict(row))


class SessionStore:
    """Sessions in the planner's database; `journal` None only in tests of something else."""

    def __init__(self, pool: asyncpg.Pool, *, journal: Journal | None = None) -> None:
        self._pool, self._journal = pool, journal

    @property
    def journal(self) -> Journal | None:
        """The planner's audit journal."""
        return self._journal

    @property
    def _keys(self) -> WindowKeys | None:
        keys = None if self._journal is None else self._journal.keys
        return keys if isinstance(keys, WindowKeys) else None

    async def _seal(self, tenant: str, session_id: str, plain: bytes, aad: bytes) -> bytes | None:
        """`plain` under the session's window key (None: no window keys)."""
        keys = self._keys
        if keys is None or self._journal is None:
            return None
        await self._journal.prepare(tenant, session_id)
        return seal(keys, keys.key_for(tenant, datetime.now(UTC), session_id), plain, aad)

    async def _turns(self, conn: asyncpg.Connection, rows: list[asyncpg.Record]) -> list[TurnRow]:
        """The turns of `rows`, their sealed inputs opened (`expired` set where the key is
        gone)."""
        keys = self._keys
        if keys is not None:
            await refresh(conn, keys, [r["sealed"] for r in rows])
        out = []
        for row in rows:
            values = dict(row)
            values.pop("created_at", None)
            sealed = values.pop("sealed", None)
            if sealed is not None:
                assert keys is not None, "sealed turns need the window keys"
                opened = unseal(keys, sealed, _turn_aad(values["run_id"]))
                if isinstance(opened, Expired):
                    values["expired"] = opened.key_id
                else:
                    values["input"] = opened.decode()
            out.append(TurnRow(**values))
        return out

    def acquire(self) -> Any:
        """A pooled connection."""
        return self._pool.acquire()

    def acquire_soon(self, timeout: float = 2.0) -> Any:
        """A pooled connection, or TimeoutError if none frees up within `timeout`."""
        return self._pool.acquire(timeout=timeout)

    async def create(
        self,
        conn: asyncpg.Connection,
        *,
        session_id: str,
        tenant: str,
        principal: str,
        agent: str,
        plan_mode: bool,
        open_key: str,
        state: str = "active",
        parent: SessionRow | None = None,
        fork_turn: int | None = None,
        fork_step: int | None = None,
        branch_run_id: str | None = None,
    ) -> bool:
        """Record a new session; False if it exists already (the same key, again)."""
        return bool(
            await conn.fetchval(
                "INSERT INTO planner.sessions (session_id, tenant, principal, agent, plan_mode, "
                "state, parent_session_id, fork_turn, fork_step, branch_run_id, open_key) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) "
                "ON CONFLICT DO NOTHING RETURNING true",
                session_id,
                tenant,
                principal,
                agent,
                plan_mode,
                state,
                None if parent is None else parent.session_id,
                fork_turn,
                fork_step,
                branch_run_id,
                open_key,
            )
        )

    async def lock(self, conn: asyncpg.Connection, session_id: str) -> SessionRow | None:
        """The session, locked until the caller's transaction ends."""
        return _session(
            await conn.fetchrow(
                f"SELECT {_COLUMNS} FROM planner.sessions WHERE session_id = $1 FOR UPDATE",
                session_id,
            )
        )

    async def get(self, conn: asyncpg.Connection, session_id: str) -> SessionRow | None:
        """The session as committed."""
        return _session(
            await conn.fetchrow(
                f"SELECT {_COLUMNS} FROM planner.sessions WHERE session_id = $1", session_id
            )
        )

    async def children(self, conn: asyncpg.Connection, session_id: str) -> list[str]:
        """The sessions forked from this one or shown as its children, oldest first."""
        rows = await conn.fetch(
            "SELECT session_id FROM planner.sessions "
            "WHERE parent_session_id = $1 ORDER BY created_at, session_id",
            session_id,
        )
        return [r["session_id"] for r in rows]

    async def move(
        self,
        conn: asyncpg.Connection,
        session: SessionRow,
        state: str,
        *,
        turn: int | None = None,
        turn_open: bool | None = None,
    ) -> SessionRow:
        """Set the session's state (and turn), conditioned on the state it was read in: a
        concurrent change makes this fail rather than overwrite it."""
        new_turn = session.turn if turn is None else turn
        new_open = session.turn_open if turn_open is None else turn_open
        changed = await conn.fetchval(
            "UPDATE planner.sessions SET state = $2, turn = $3, turn_open = $4, "
            "updated_at = now() WHERE session_id = $1 AND state = $5 AND turn = $6 "
            "RETURNING true",
            session.session_id,
            state,
            new_turn,
            new_open,
            session.state,
            session.turn,
        )
        if not changed:
            raise RuntimeError(f"session {session.session_id} changed under its lock")
        return msgspec.structs.replace(session, state=state, turn=new_turn, turn_open=new_open)

    async def add_event(
        self,
        conn: asyncpg.Connection,
        session: SessionRow,
        source: str,
        build: Callable[[int], SessionEvent],
    ) -> tuple[SessionRow, int | None]:
        """Number and record one event (`build(n)`) with its journal row; (the session as it
        is now, the event's number or None if `source` had produced it already)."""
        n = session.last_n + 1
        event = build(n)
        body = msgspec.json.encode(event)
        sealed = await self._seal(
            session.tenant, session.session_id, body, _event_aad(session.session_id, n)
        )
        added = await conn.fetchval(
            "INSERT INTO planner.session_events (session_id, n, type, source, body, sealed) "
            "VALUES ($1, $2, $3, $4, $5::jsonb, $6) ON CONFLICT DO NOTHING RETURNING true",
            session.session_id,
            n,
            type(event).__name__,
            source,
            "{}" if sealed is not None else body.decode(),
            sealed,
        )
        if not added:
            return session, None
        await conn.execute(
            "UPDATE planner.sessions SET last_n = $2 WHERE session_id = $1", session.session_id, n
        )
        if self._journal is not None:
            await self._journal.write(
                conn,
                tenant=session.tenant,
                kind=f"session.{type(event).__name__}",
                subject=f"{session.session_id}/{n}",
                run_id=session.session_id,
                payload=event,
            )
        return msgspec.structs.replace(session, last_n=n), n

    async def events(
        self, conn: asyncpg.Connection, session_id: str, *, after: int = 0, upto: int | None = None
    ) -> list[AnySessionEvent]:
        """The session's events numbered after `after` (up to `upto`), in order; those whose
        window key was destroyed (retention, an erasure) are gone and left out: what the
        model remembers of a conversation is what is left of it."""
        rows = await conn.fetch(
            "SELECT n, body, sealed FROM planner.session_events WHERE session_id = $1 "
            "AND n > $2 AND ($3::int IS NULL OR n <= $3) ORDER BY n",
            session_id,
            after,
            upto,
        )
        keys = self._keys
        if keys is not None:
            await refresh(conn, keys, [r["sealed"] for r in rows])
        out: list[AnySessionEvent] = []
        for r in rows:
            body = r["body"]
            if r["sealed"] is not None:
                assert keys is not None, "sealed session events need the window keys"
                opened = unseal(keys, r["sealed"], _event_aad(session_id, r["n"]))
                if isinstance(opened, Expired):
                    continue
                body = opened
            out.append(_EVENT_DECODER.decode(body))
        return out

    async def mark_published(self, conn: asyncpg.Connection, session_id: str, n: int) -> None:
        """Events up to `n` are on the session's subject."""
        await conn.execute(
            "UPDATE planner.sessions SET published_n = greatest(published_n, $2) "
            "WHERE session_id = $1",
            session_id,
            n,
        )

    async def unpublished(self, conn: asyncpg.Connection, limit: int = 100) -> list[SessionRow]:
        """Sessions with events not yet published (a crash between commit and publish)."""
        rows = await conn.fetch(
            f"SELECT {_COLUMNS} FROM planner.sessions WHERE published_n < last_n LIMIT $1", limit
        )
        return [SessionRow(**dict(r)) for r in rows]

    async def turn_by_key(
        self, conn: asyncpg.Connection, session_id: str, key: str
    ) -> TurnRow | None:
        """The turn a message under this key started, if one did."""
        row = await conn.fetchrow(
            "SELECT * FROM planner.session_turns WHERE session_id = $1 AND message_key = $2",
            session_id,
            key,
        )
        return None if row is None else (await self._turns(conn, [row]))[0]

    async def turn_of_run(self, conn: asyncpg.Connection, run_id: str) -> TurnRow | None:
        """The turn a run drives, if it drives one."""
        row = await conn.fetchrow("SELECT * FROM planner.session_turns WHERE run_id = $1", run_id)
        return None if row is None else (await self._turns(conn, [row]))[0]

    async def add_turn(
        self,
        conn: asyncpg.Connection,
        session_id: str,
        turn: int,
        run_id: str,
        key: str,
        run_input: str,
        *,
        tenant: str = "",
    ) -> None:
        """Record a turn accepted under the session's lock (its input sealed under the
        session's window key, given its `tenant`)."""
        sealed = (
            await self._seal(tenant, session_id, run_input.encode(), _turn_aad(run_id))
            if tenant
            else None
        )
        await conn.execute(
            "INSERT INTO planner.session_turns (session_id, turn, run_id, message_key, input, "
            "sealed) VALUES ($1, $2, $3, $4, $5, $6)",
            session_id,
            turn,
            run_id,
            key,
            "" if sealed is not None else run_input,
            sealed,
        )

    async def end_turn(self, conn: asyncpg.Connection, run_id: str, status: str) -> bool:
        """Record how a turn's run ended; False if it had ended already."""
        return bool(
            await conn.fetchval(
                "UPDATE planner.session_turns SET status = $2 WHERE run_id = $1 "
                "AND status = 'running' RETURNING true",
                run_id,
                status,
            )
        )

    async def unstarted(self, conn: asyncpg.Connection, limit: int = 100) -> list[TurnRow]:
        """Turns accepted whose run was not handed on yet."""
        # Older than a few seconds: the message's own handler starts its turn right after
        # the commit; the sweep is for one a crash left.
        rows = await conn.fetch(
            "SELECT * FROM planner.session_turns WHERE NOT started "
            "AND created_at < now() - interval '3 seconds' "
            "ORDER BY created_at LIMIT $1",
            limit,
        )
        return await self._turns(conn, rows)

    async def mark_started(self, conn: asyncpg.Connection, run_id: str) -> None:
        """The turn's run is registered and handed to retrieval."""
        await conn.execute(
            "UPDATE planner.session_turns SET started = true WHERE run_id = $1", run_id
        )

    async def history(
        self, conn: asyncpg.Connection, session_id: str, *, upto: int | None = None
    ) -> list[HistoryEntry]:
        """The session's memory entries so far (up to event `upto`), oldest first
        (`memory.entries_of`)."""
        return entries_of(await self.events(conn, session_id, upto=upto))

    async def inject(self, conn: asyncpg.Connection, session_id: str, n: int, text: str) -> None:
        """Keep an injected message until a decision takes it."""
        await conn.execute(
            "INSERT INTO planner.session_injections (session_id, n, text) "
            "VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            session_id,
            n,
            text,
        )

    async def take_injections(
        self, conn: asyncpg.Connection, session_id: str, run_id: str, seq: int
    ) -> list[tuple[int, str]]:
        """The injected messages no decision has seen yet, now taken by `run_id`'s step."""
        rows = await conn.fetch(
            "UPDATE planner.session_injections SET taken_by = $2, taken_seq = $3 "
            "WHERE session_id = $1 AND taken_by IS NULL RETURNING n, text",
            session_id,
            run_id,
            seq,
        )
        return sorted((r["n"], r["text"]) for r in rows)


def _turn_aad(run_id: str) -> bytes:
    return column_aad("planner.session_turns", "sealed", run_id)


def _event_aad(session_id: str, n: int) -> bytes:
    return column_aad("planner.session_events", "sealed", f"{session_id}/{n}")


def entry_of(event: Any) -> HistoryEntry | None:
    """The conversation entry an event is, if it is one."""
    kind = type(event).__name__
    if kind == "UserMessage":
        return HistoryEntry(turn=event.turn, role="user", text=event.text)
    if kind == "SessionInjected":
        return HistoryEntry(turn=event.turn, role="injected", text=event.text)
    if kind == "TurnEnded" and event.answer:
        return HistoryEntry(turn=event.turn, role="agent", text=event.answer)
    if kind == "WriterNote":
        return HistoryEntry(turn=event.turn, role="writ", text=event.text)
    return None


def step_entry_of(event: Any) -> HistoryEntry | None:
    """What a recorded step of a turn is in the conversation, if anything: the capability the
    agent selected, the outcome Writ wrote, a read's observation (no content)."""
    kind = type(event).__name__
    if kind == "CapabilitySelected":
        return HistoryEntry(turn=event.turn, role="selected", text=event.capability)
    if kind == "StepOutcome":
        return HistoryEntry(turn=event.turn, role="writ", text=event.text or event.state)
    if kind == "Observed":
        return HistoryEntry(turn=event.turn, role="writ", text=event.summary)
    return None
