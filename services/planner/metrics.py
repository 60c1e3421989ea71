"""The planner's own metrics (`writ_planner_*`), each label value registered up front so a
dashboard sees zeros before the first run; the actor loop's and endpoints' metrics are
`libs.runtime`'s."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter

__all__ = ["PlannerMetrics"]

_RUN_RESULT_STATUSES: Final = ("succeeded", "failed", "awaiting_human")
_SELECTION_CHECKS: Final = ("uses", "callable_by", "arguments", "depth", "cycle", "unsupported")
_READ_OUTCOMES: Final = ("read", "unknown_tool", "invalid_arguments", "denied", "ask")
_CALL_OUTCOMES: Final = ("answered", "failed", "awaiting_human", "denied", "ask", "unknown_agent")


class PlannerMetrics:
    """The counters of runs finished, selections refused, reads, agent calls and budget stops."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.finished = Counter(
            "writ_planner_runs_finished",
            "Runs that ended (or stopped for a person) with a result",
            ["status"],
            registry=registry,
        )
        for status in _RUN_RESULT_STATUSES:
            self.finished.labels(status)
        self.selections_refused = Counter(
            "writ_planner_selections_refused",
            "Selections refused before any handler ran",
            ["check"],
            registry=registry,
        )
        for check in _SELECTION_CHECKS:
            self.selections_refused.labels(check)
        self.reads = Counter(
            "writ_planner_reads",
            "Reads by retrieval observed by a run, by outcome (a read that may "
            "succeed later is retried, not counted)",
            ["outcome"],
            registry=registry,
        )
        for outcome in _READ_OUTCOMES:
            self.reads.labels(outcome)
        self.agent_calls = Counter(
            "writ_planner_agent_calls",
            "Calls to other agents observed by a run, by how they ended "
            "(or why they never started)",
            ["outcome"],
            registry=registry,
        )
        for outcome in _CALL_OUTCOMES:
            self.agent_calls.labels(outcome)
        # Label-free: which budget ran out is governance's writ_governance_budget_exhausted
        # (by `budget`) and the run's error message; this counts the runs the planner stopped.
        self.budget_exhausted = Counter(
            "writ_planner_budget_exhaustions",
            "Runs the planner stopped because a budget ran out (its own decision cap included)",
            registry=registry,
        )
        self.swept = Counter(
            "writ_planner_runs_swept",
            "Running runs nobody drove for a while, driven again from the database",
            registry=registry,
        )
