"""Chat sessions (docs/design.md §10): durable conversations of one principal with one
agent, on the planner's own run loop. `logic` holds the transition table and the conversation
rule; `_store` the SQL (migration 009); `_ops` the operations ingress hands on
(`writ.int.planner.session`), `_fork` a fork's copy; `_turns` what the run loop tells a
session; `_deliver` what follows its commits; `_text` a model call's streamed text."""

from services.planner.sessions._inflight import ModelCallAbandoned
from services.planner.sessions._ops import SessionOpsEndpoint
from services.planner.sessions._store import SessionRow, SessionStore, TurnRow
from services.planner.sessions._turns import SessionTurns, outcome_note

__all__ = [
    "ModelCallAbandoned",
    "SessionOpsEndpoint",
    "SessionRow",
    "SessionStore",
    "SessionTurns",
    "TurnRow",
    "outcome_note",
]
