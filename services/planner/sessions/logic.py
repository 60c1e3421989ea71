"""Chat sessions' pure rules (no I/O): the one transition table that moves a session's state,
the ids of sessions, turns and forks; the conversation a turn's model sees is `memory`'s.

States (docs/design.md §6): `active`, `processing`, `paused`, `closed`. Only `transition` moves
them; anything it does not list is refused with a `SessionRefused` naming a stable code.
"""

from __future__ import annotations

import uuid
from typing import Final, Literal, cast

from libs.errors import PermanentError
from services.planner.memory import (
    HISTORY_TOKENS,
    MAX_ENTRY_CHARS,
    HistoryEntry,
    conversation,
    estimate_tokens,
)

__all__ = [
    "HISTORY_TOKENS",
    "MAX_ENTRY_CHARS",
    "SESSION_PREFIX",
    "TRANSITIONS",
    "HistoryEntry",
    "SessionRefused",
    "child_id_for",
    "conversation",
    "estimate_tokens",
    "fork_id_for",
    "is_turn_run",
    "session_id_for",
    "transition",
    "turn_of",
    "turn_run_id",
]

State = Literal["active", "processing", "paused", "closed"]
# What happens to a session: a user's message, the turn in flight ending, pause, resume
# (with or without a turn still in flight), an injected message, close, fork (of this one).
Happening = Literal["message", "turn_ended", "pause", "resume", "inject", "close", "fork"]

SESSION_PREFIX: Final = "ses-"
_NAMESPACE: Final = uuid.UUID("0b7c2d4e-9a61-4f3b-8e25-6d1a7c9f0e42")

# (state, happening) -> the next state. `resume` is keyed further by whether a turn is still
# in flight (a paused turn goes on; a session paused between turns is simply active again).
TRANSITIONS: Final[dict[tuple[State, str], State]] = {
    ("active", "message"): "processing",
    ("active", "pause"): "paused",
    ("active", "inject"): "active",
    ("active", "close"): "closed",
    ("active", "fork"): "active",
    ("processing", "turn_ended"): "active",
    ("processing", "pause"): "paused",
    ("processing", "inject"): "processing",
    ("processing", "close"): "closed",
    ("processing", "fork"): "processing",
    ("paused", "resume:turn"): "processing",
    ("paused", "resume:idle"): "active",
    ("paused", "inject"): "paused",
    ("paused", "turn_ended"): "paused",
    ("paused", "close"): "closed",
    ("paused", "fork"): "paused",
    # A turn cancelled by the close ends after it: the session stays closed.
    ("closed", "turn_ended"): "closed",
    ("closed", "fork"): "closed",  # history stays readable, and can be forked
}

# Why each refused (state, happening) is refused: the code a caller gets.
_REFUSALS: Final[dict[tuple[str, str], str]] = {
    ("processing", "message"): "SESSION_BUSY",
    ("paused", "message"): "SESSION_PAUSED",
}


class SessionRefused(PermanentError, ValueError):
    """A session cannot do this in its state; `code` is the caller's stable code."""

    def __init__(self, code: str, message: str, *, state: str, happening: str) -> None:
        super().__init__(message)
        self.code, self.state, self.happening = code, state, happening


def transition(state: str, happening: str, *, turn_open: bool = False) -> State:
    """The state `happening` moves a session in `state` to.

    Raises:
        SessionRefused: the table does not allow it (`SESSION_BUSY` for a message while a turn
            is in flight, `SESSION_CLOSED` for anything new on a closed session,
            `INVALID_TRANSITION` otherwise).
    """
    key = f"resume:{'turn' if turn_open else 'idle'}" if happening == "resume" else happening
    found = TRANSITIONS.get((cast(State, state), key))  # a state the table does not know: None
    if found is not None:
        return found
    if state == "closed":
        code = "SESSION_CLOSED"
    else:
        code = _REFUSALS.get((state, happening), "INVALID_TRANSITION")
    raise SessionRefused(
        code, f"a {state} session cannot take {happening!r}", state=state, happening=happening
    )


def session_id_for(tenant: str, key: str) -> str:
    """The id of the session opened under this Idempotency-Key: the same key, the same one."""
    return SESSION_PREFIX + str(uuid.uuid5(_NAMESPACE, f"{tenant}\x00open\x00{key}"))


def fork_id_for(session_id: str, key: str) -> str:
    """The id of the fork made under this Idempotency-Key."""
    return SESSION_PREFIX + str(uuid.uuid5(_NAMESPACE, f"{session_id}\x00fork\x00{key}"))


def child_id_for(branch_run_id: str) -> str:
    """The child session that shows a branch run (an agent call of a turn)."""
    return SESSION_PREFIX + str(uuid.uuid5(_NAMESPACE, f"child\x00{branch_run_id}"))


def turn_run_id(session_id: str, turn: int) -> str:
    """The run that drives turn `turn` of a session."""
    return f"{session_id}-t{turn}"


def is_turn_run(run_id: str) -> bool:
    """Whether a run is a session's turn (a branch of one is not: it is a child session)."""
    return run_id.startswith(SESSION_PREFIX) and "." not in run_id


def turn_of(run_id: str) -> tuple[str, int]:
    """(session id, turn) of a turn's run id."""
    session_id, _, turn = run_id.rpartition("-t")
    return session_id, int(turn)
