"""The dispatcher's metrics: breakers, attempts, policy re-checks and commands in `unknown`."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge

from actions import ACTIONS
from services.dispatcher.breaker import STATE_VALUES, BreakerState

__all__ = ["ATTEMPT_RESULTS", "DispatcherMeters"]

log = logging.getLogger("writ.dispatcher")
# An attempt's results (the CHECK on dispatcher.attempts.result).
ATTEMPT_RESULTS = ("succeeded", "failed", "transient", "lost", "revision_required")


class DispatcherMeters:
    """The dispatcher's counters and gauges, each label exported at zero from the start."""

    def __init__(self, *, registry: CollectorRegistry, connectors: list[str]) -> None:
        # Tool names come from the action catalog (unknown actions fail before any breaker is
        # made), so the `tool` label is a bounded set.
        self.breaker_state = Gauge(
            "writ_dispatcher_breaker_state",
            "Circuit breaker per tool: 0 closed, 1 half_open, 2 open",
            ["tool"],
            registry=registry,
        )
        self.breaker_refused = Counter(
            "writ_dispatcher_breaker_refused",
            "Calls delayed because the tool's breaker was open",
            ["tool"],
            registry=registry,
        )
        # `connector` is a connector's name (or "none": no call was made), `result` one of
        # the attempt results the attempts table allows: both bounded sets.
        self.attempts = Counter(
            "writ_dispatcher_attempts",
            "Dispatch attempts finished, by connector and result",
            ["connector", "result"],
            registry=registry,
        )
        # `outcome`: "reused" (the admission's allow stood: policy epoch unchanged) or "asked"
        # (decide was asked again).
        self.rechecks = Counter(
            "writ_dispatcher_rechecks",
            "Policy re-checks before execution, by how they were answered",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("reused", "asked"):
            self.rechecks.labels(outcome)
        self.unknown = Gauge(
            "writ_dispatcher_unknown_commands",
            "Commands in state unknown, awaiting reconciliation",
            registry=registry,
        )
        for action, contract in ACTIONS.items():
            if contract.connector in connectors:
                # Every tool is on the dashboard from the start (rate() needs the zero too).
                self.breaker_state.labels(action).set(STATE_VALUES["closed"])
                self.breaker_refused.labels(action)
        for name in [*connectors, "local"]:  # "local": operations in Postgres, no connector
            for result in ATTEMPT_RESULTS:
                self.attempts.labels(name, result)

    def breaker_moved(self, tool: str, state: BreakerState) -> None:
        """A breaker changed state: show it on its gauge and in the log."""
        self.breaker_state.labels(tool).set(STATE_VALUES[state])
        log.log(
            logging.INFO if state == "closed" else logging.WARNING,
            "circuit breaker for %s is now %s",
            tool,
            state,
        )
