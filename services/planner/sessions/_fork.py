"""A session's fork (docs/chat.md, "Fork never carries an effect"): a new session whose
history is the parent's up to the end of a turn, or up to a recorded step of one; a fork at a
step runs that turn again from there, as a run of its own, the model asked afresh."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Final

import msgspec

from schemas.sessions import SessionForked, SessionOpened, TurnStarted
from services.planner.memory import conversation, entries_of
from services.planner.sessions._store import SessionRow, SessionStore, TurnRow, step_entry_of
from services.planner.sessions.logic import turn_run_id

__all__ = ["COPIED", "ForkRefused", "SessionForks"]

# Events a fork copies from its parent: the conversation and what became of the turns' steps,
# as history. Never an effect or the authority for one (DESIGN.md §6): no admitted or
# dispatched command, no proposal, plan or ask a person could still answer, no approval; nor
# the parent's own pauses, closes or forks (so forking twice at one point copies the same).
COPIED: Final = frozenset(
    {
        "UserMessage",
        "TurnStarted",
        "CapabilitySelected",
        "Observed",
        "StepOutcome",
        "WriterNote",
        "TurnEnded",
        "SessionInjected",
        "ChildSession",
    }
)


def _is_start(event: Any, turn: int) -> bool:
    return type(event).__name__ == "TurnStarted" and event.turn == turn


class ForkRefused(Exception):
    """The fork point is not one a fork can start from (its message says why)."""


class SessionForks:
    """Makes forks in the caller's transaction."""

    def __init__(self, *, store: SessionStore, memory_tokens: Callable[[SessionRow], int]) -> None:
        self._store, self._memory_tokens = store, memory_tokens

    async def make(
        self, conn: Any, parent: SessionRow, fork_id: str, turn: int, step: int | None
    ) -> TurnRow | None:
        """Make the fork `fork_id` of the (locked) parent at (`turn`, `step`), once: the same
        id again changes nothing. Returns the turn a fork at a step runs again, else None.

        Raises:
            ForkRefused: `turn` has not ended and no step is named, or has no message.
        """
        cut = await self._cut(conn, parent, turn, step)
        if not await self._store.create(
            conn,
            session_id=fork_id,
            tenant=parent.tenant,
            principal=parent.principal,
            agent=parent.agent,
            plan_mode=parent.plan_mode,
            open_key=f"fork:{fork_id}",
            parent=parent,
            fork_turn=turn,
            fork_step=step,
        ):
            return None
        fork = await self._store.lock(conn, fork_id)
        assert fork is not None
        fork = await self._store.move(conn, fork, "active", turn=turn, turn_open=False)
        fork, _ = await self._store.add_event(
            conn,
            fork,
            "opened",
            lambda n: SessionOpened(
                session_id=fork_id,
                n=n,
                agent=parent.agent,
                principal=parent.principal,
                plan_mode=parent.plan_mode,
                parent_session_id=parent.session_id,
            ),
        )
        # The parent's history up to the fork point, as history: nothing in it runs again (a
        # turn of the fork is a run of its own, with its own operation ids).
        copied = [
            e
            for e in await self._store.events(conn, parent.session_id, upto=cut)
            if type(e).__name__ in COPIED
            # (a fork at a step runs that turn again: its start is the fork's own)
            and not (step is not None and _is_start(e, turn))
        ]
        for event in copied:
            fork, _ = await self._store.add_event(
                conn, fork, f"copy:{parent.session_id}:{event.n}", partial(_copied, event, fork_id)
            )
        for target in (parent, fork):
            target, _ = await self._store.add_event(
                conn,
                target,
                f"fork:{fork_id}",
                partial(_forked, target.session_id, parent.session_id, fork_id, turn, step),
            )
        if step is None:
            return None
        return await self._resume_at(conn, fork, turn, copied)

    async def _resume_at(
        self, conn: Any, fork: SessionRow, turn: int, copied: list[Any]
    ) -> TurnRow:
        """A fork at a recorded step of `turn` runs that turn again from there, as a run of
        its own: its input is the conversation before the turn, the turn's message and what
        the turn recorded up to the fork point (history, never an effect), and its first
        decision is a new model call."""
        before = [e for e in copied if (getattr(e, "turn", None) or 0) < turn]
        history = entries_of(before)
        message = next(
            (e.text for e in copied if type(e).__name__ == "UserMessage" and e.turn == turn), None
        )
        if message is None:
            raise ForkRefused(f"turn {turn} has no message to run again")
        so_far = [
            h
            for h in (step_entry_of(e) for e in copied if getattr(e, "turn", None) == turn)
            if h is not None
        ]
        run_id = turn_run_id(fork.session_id, turn)
        fork = await self._store.move(conn, fork, "processing", turn=turn, turn_open=True)
        await self._store.add_turn(
            conn,
            fork.session_id,
            turn,
            run_id,
            f"fork-at-step:{turn}",
            conversation(history, message, budget=self._memory_tokens(fork), so_far=so_far),
            tenant=fork.tenant,
        )
        await self._store.add_event(
            conn,
            fork,
            f"turn:{turn}",
            lambda n: TurnStarted(session_id=fork.session_id, n=n, turn=turn, run_id=run_id),
        )
        started = await self._store.turn_by_key(conn, fork.session_id, f"fork-at-step:{turn}")
        assert started is not None
        return started

    async def _cut(self, conn: Any, parent: SessionRow, turn: int, step: int | None) -> int:
        """The number of the parent's last event a fork at (turn, step) keeps."""
        events = [
            e
            for e in await self._store.events(conn, parent.session_id)
            if type(e).__name__ in COPIED  # (a later fork of the parent moves no cut)
        ]
        cut = 0
        for event in events:
            at = getattr(event, "turn", None)
            if at is None or at < turn:
                cut = event.n if at is not None else cut
                continue
            if at > turn:
                break
            if step is None or type(event).__name__ in ("UserMessage", "TurnStarted"):
                cut = event.n
            elif (at_step := getattr(event, "step", None)) is not None and at_step <= step:
                cut = event.n
        if step is None and not any(
            type(e).__name__ == "TurnEnded" and getattr(e, "turn", None) == turn for e in events
        ):
            raise ForkRefused(f"turn {turn} has not ended: fork at one of its recorded steps")
        return cut


def _copied(event: Any, session_id: str, n: int) -> Any:
    """A parent's event, as the fork's `n`th."""
    return msgspec.structs.replace(event, session_id=session_id, n=n)


def _forked(
    session_id: str, parent_id: str, fork_id: str, turn: int, step: int | None, n: int
) -> SessionForked:
    return SessionForked(
        session_id=session_id,
        n=n,
        parent_session_id=parent_id,
        fork_session_id=fork_id,
        turn=turn,
        step=step,
    )
