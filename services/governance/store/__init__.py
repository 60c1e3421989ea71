"""Governance's store: the facts `decide` reads, decisions, runs, pending decisions, policy
(`_store.py`) and run budgets (`_budgets.py`), each change journaled in its transaction."""

from services.governance.store._records import (
    ATTENDED_ASK_TIMEOUT,
    Answered,
    Counted,
    NotAnswerable,
    Policy,
    ToRead,
    ToRecord,
)
from services.governance.store._store import GovernanceStore

__all__ = [
    "ATTENDED_ASK_TIMEOUT",
    "Answered",
    "Counted",
    "GovernanceStore",
    "NotAnswerable",
    "Policy",
    "ToRead",
    "ToRecord",
]
