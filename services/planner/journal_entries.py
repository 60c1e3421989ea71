"""What the planner journals: the kinds and payloads (msgspec JSON before encryption) of its
audit journal entries, and the records `store.read_replay` gives the replay (`replay/`).

The planner journals, in the same transaction as what it records: the run's start with the
evidence its model saw and the agent snapshot it ran with (`run.started`), each captured model
response (`step.decision`, with the digest of the model input it answered, `inputs.py`), the
proposal the runtime made of a `select_capability` (`proposal`), each captured tool output and
the observation the runtime fed back from it (`step.observation`, `observations.py`), each critic
verdict on an answer (`step.critic`, with the digest of the critic input it answered), and every
status change (`run.status`, its error codes in `codes.py`).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

__all__ = [
    "CRITIC",
    "DECISION",
    "INJECTED",
    "OBSERVATION",
    "PROPOSAL",
    "RUN_STARTED",
    "RUN_STATUS",
    "Captured",
    "CriticEntry",
    "DecisionEntry",
    "InjectedEntry",
    "ObservationEntry",
    "PlanRecord",
    "ProposalEntry",
    "RunRecord",
    "RunStartedEntry",
    "StatusEntry",
    "StepRecord",
]

# Journal kinds of the planner.
RUN_STARTED: Final = "run.started"
DECISION: Final = "step.decision"
OBSERVATION: Final = "step.observation"
PROPOSAL: Final = "proposal"
RUN_STATUS: Final = "run.status"
CRITIC: Final = "step.critic"
# A chat session's injected user messages, recorded as the step before the decision that saw
# them (`sessions/`).
INJECTED: Final = "step.injected"


class RunStartedEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A run as it started: the request and the untrusted evidence the model was shown."""

    request_id: str
    principal: str
    agent: str
    input: str
    evidence: list[dict[str, Any]]
    attended: bool = False
    # The agent as the run started: version, responsibility, catalog (None before manifests).
    manifest: dict[str, Any] | None = None


class InjectedEntry(msgspec.Struct, frozen=True, kw_only=True):
    """User messages injected into a chat session's turn, seen by the model from step `seq`."""

    seq: int
    texts: list[str]


class DecisionEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A captured model response: the decision as returned, and what it answered."""

    seq: int
    turn: int
    input_digest: str
    response: dict[str, Any]


class ProposalEntry(msgspec.Struct, frozen=True, kw_only=True):
    """What the runtime proposed from a `select_capability` decision at `step`."""

    step: int
    action: str
    arguments: dict[str, Any]


class CriticEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A captured critic verdict (`{"verdict": "accept"}` or `{"verdict": "replan", "reason":
    ...}`) on the answer decided at `step`; `round` counts the run's earlier verdicts."""

    seq: int
    step: int
    round: int
    input_digest: str
    verdict: dict[str, Any]


class ObservationEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A captured tool output (an outcome or a refusal of step `step`) and what the model read."""

    seq: int
    step: int
    output: dict[str, Any]
    observation: dict[str, Any]


class StatusEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A run's status change; `step` is the decision or proposal that caused it."""

    status: str
    step: int | None = None
    answer: str | None = None
    error_code: str | None = None
    error_message: str | None = None


class Captured(msgspec.Struct, frozen=True, kw_only=True):
    """One decrypted journal entry of a run, with its place in the chain."""

    seq: int
    kind: str
    payload: Any


class StepRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `planner.steps`."""

    seq: int
    kind: str
    payload: dict[str, Any]
    input_digest: str | None = None


class PlanRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `planner.plans` (a plan-mode turn's plan)."""

    plan_id: str
    state: str
    digest: str
    steps: list[dict[str, Any]]


class RunRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The runtime's own record of a run: its `planner.runs` row, its steps and, for a
    plan-mode chat turn, its plans."""

    status: str
    answer: str | None
    error_code: str | None
    error_message: str | None
    evidence: list[dict[str, Any]]
    steps: list[StepRecord]
    plans: list[PlanRecord] = []
