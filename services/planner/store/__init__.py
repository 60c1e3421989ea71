"""The planner's store: runs and their recorded steps, each journaled in the same transaction.

Every run started (with the evidence its model saw), every step (a captured model response,
critic verdict or tool output, and the proposal a decision became) and every status change
writes its audit
journal row (`libs/journal.py`) in the transaction that records it, and only when it recorded
something: a redelivery journals nothing twice. `read_replay` reads a run back for
`services/planner/replay/`. The run's budget reservations in governance are recorded with the
steps they pay for (`reservations`), so a redelivered step reuses its reservation and what a
step used is settled even if the planner stopped before it could tell governance.
"""

from services.planner.store._replay import read_replay
from services.planner.store._rows import TERMINAL_RUN, Reservation, RunRow, RunState, Step
from services.planner.store._stalled import (
    LastCommand,
    claim_answered,
    claim_ended,
    claim_stalled,
    last_command,
    last_refusal,
    pending_answer,
    results_sent,
)
from services.planner.store._store import PlannerStore

__all__ = [
    "TERMINAL_RUN",
    "LastCommand",
    "PlannerStore",
    "Reservation",
    "RunRow",
    "RunState",
    "Step",
    "claim_answered",
    "claim_ended",
    "claim_stalled",
    "last_command",
    "last_refusal",
    "pending_answer",
    "results_sent",
    "read_replay",
]
