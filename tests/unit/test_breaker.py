"""`services.dispatcher.breaker`: the per-tool circuit breaker's state machine, on a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from services.dispatcher.breaker import (
    STATE_VALUES,
    Admission,
    Breakers,
    BreakerState,
    CircuitBreaker,
    outcome_of,
)

THRESHOLD, COOLDOWN = 3, 30.0


class FakeClock:
    """Time moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# A scenario is a list of steps on one breaker:
#   ("admit", name)            a call arrives and is admitted; its admission is kept as `name`
#   ("refused", remaining)     a call arrives and is refused with `remaining` seconds of cooldown
#   ("record", name, outcome)  the result of call `name` comes back
#   ("wait", seconds)          time passes
#   ("state", state)           the breaker is in `state` (reading it moves nothing)
Step = tuple[Any, ...]


def _fail(*names: str) -> list[Step]:
    """Calls admitted and failing transiently one after the other."""
    steps: list[Step] = []
    for name in names:
        steps += [("admit", name), ("record", name, "transient")]
    return steps


OPENED = _fail("f1", "f2", "f3")  # threshold reached: open since t=0 of the scenario

SCENARIOS: dict[str, list[Step]] = {
    "starts closed": [("state", "closed"), ("admit", "a"), ("state", "closed")],
    "below the threshold stays closed": [*_fail("f1", "f2"), ("state", "closed"), ("admit", "a")],
    "three consecutive transient failures open it": [*OPENED, ("state", "open")],
    "a lost response counts as a transient failure": [
        ("admit", "a"),
        ("record", "a", outcome_of("lost")),
        *_fail("b", "c"),
        ("state", "open"),
    ],
    "a success resets the count": [
        *_fail("f1", "f2"),
        ("admit", "s"),
        ("record", "s", "success"),
        *_fail("f3", "f4"),
        ("state", "closed"),
        *_fail("f5"),
        ("state", "open"),
    ],
    "neutral outcomes neither count nor reset": [
        ("admit", "n1"),
        ("record", "n1", "neutral"),
        ("admit", "n2"),
        ("record", "n2", "neutral"),
        ("admit", "n3"),
        ("record", "n3", "neutral"),
        ("state", "closed"),
        *_fail("f1", "f2"),
        ("admit", "n4"),
        ("record", "n4", "neutral"),
        ("state", "closed"),
        *_fail("f3"),
        ("state", "open"),
    ],
    "concurrent closed calls failing together open it": [
        ("admit", "a"),
        ("admit", "b"),
        ("admit", "c"),
        ("record", "a", "transient"),
        ("record", "b", "transient"),
        ("record", "c", "transient"),
        ("state", "open"),
    ],
    "open refuses with the remaining cooldown": [
        *OPENED,
        ("refused", 30.0),
        ("wait", 10.0),
        ("refused", 20.0),
        ("wait", 19.5),
        ("refused", 0.5),
        ("state", "open"),
    ],
    "no timer: an unused tool stays open after the cooldown": [
        *OPENED,
        ("wait", 3600.0),
        ("state", "open"),
    ],
    "the first call after the cooldown turns it half-open": [
        *OPENED,
        ("wait", 30.0),
        ("admit", "p"),
        ("state", "half_open"),
    ],
    "half-open admits concurrent calls": [
        *OPENED,
        ("wait", 31.0),
        ("admit", "p1"),
        ("admit", "p2"),
        ("admit", "p3"),
        ("state", "half_open"),
    ],
    "half-open: a success closes it": [
        *OPENED,
        ("wait", 30.0),
        ("admit", "p"),
        ("record", "p", "success"),
        ("state", "closed"),
        ("admit", "a"),
    ],
    "half-open: a transient failure re-opens it with a fresh cooldown": [
        *OPENED,
        ("wait", 45.0),
        ("admit", "p"),
        ("wait", 2.0),
        ("record", "p", "transient"),
        ("state", "open"),
        ("refused", 30.0),
        ("wait", 29.0),
        ("refused", 1.0),
        ("wait", 1.0),
        ("admit", "q"),
        ("state", "half_open"),
    ],
    "half-open: the first result decides, a later failure is ignored": [
        *OPENED,
        ("wait", 30.0),
        ("admit", "p1"),
        ("admit", "p2"),
        ("admit", "p3"),
        ("record", "p2", "success"),
        ("record", "p1", "transient"),
        ("record", "p3", "transient"),
        ("state", "closed"),
        ("admit", "a"),
    ],
    "half-open: the first result decides, a later success is ignored": [
        *OPENED,
        ("wait", 30.0),
        ("admit", "p1"),
        ("admit", "p2"),
        ("record", "p1", "transient"),
        ("record", "p2", "success"),
        ("state", "open"),
        ("refused", 30.0),
    ],
    "half-open: a neutral result decides nothing": [
        *OPENED,
        ("wait", 30.0),
        ("admit", "p1"),
        ("admit", "p2"),
        ("record", "p1", "neutral"),
        ("state", "half_open"),
        ("admit", "p3"),
        ("record", "p2", "success"),
        ("state", "closed"),
    ],
    "after closing from half-open the count starts at zero": [
        *OPENED,
        ("wait", 30.0),
        ("admit", "p"),
        ("record", "p", "success"),
        *_fail("f4", "f5"),
        ("state", "closed"),
        *_fail("f6"),
        ("state", "open"),
    ],
    "a closed call ending after the breaker opened is ignored": [
        ("admit", "slow"),
        *OPENED,
        ("record", "slow", "success"),
        ("state", "open"),
        ("refused", 30.0),
    ],
    "a half-open batch's late failure does not count against the new closed period": [
        *OPENED,
        ("wait", 30.0),
        ("admit", "p1"),
        ("admit", "p2"),
        ("admit", "p3"),
        ("record", "p1", "success"),
        *_fail("f4", "f5"),
        ("record", "p2", "transient"),
        ("record", "p3", "transient"),
        ("state", "closed"),
    ],
    "an open period's stale results cannot close it": [
        ("admit", "old"),
        *OPENED,
        ("wait", 30.0),
        ("admit", "p"),
        ("record", "old", "success"),
        ("state", "half_open"),
        ("record", "p", "transient"),
        ("state", "open"),
    ],
}


@pytest.mark.parametrize("steps", list(SCENARIOS.values()), ids=list(SCENARIOS))
def test_state_machine(steps: list[Step]) -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(threshold=THRESHOLD, cooldown_s=COOLDOWN, clock=clock)
    calls: dict[str, Admission] = {}
    for number, step in enumerate(steps):
        where = f"step {number}: {step}"
        match step:
            case ("admit", name):
                admission = breaker.admit()
                assert admission.allowed, where
                calls[name] = admission
            case ("refused", remaining):
                admission = breaker.admit()
                assert not admission.allowed, where
                assert admission.retry_after_s == pytest.approx(remaining), where
            case ("record", name, outcome):
                breaker.record(calls[name], outcome)
            case ("wait", seconds):
                clock.now += seconds
            case ("state", state):
                assert breaker.state == state, where
            case _:
                raise AssertionError(f"bad step {step}")


@pytest.mark.parametrize(
    ("kind", "outcome"),
    [
        ("succeeded", "success"),
        ("transient", "transient"),
        ("lost", "transient"),
        ("rejected", "neutral"),
        ("revision_mismatch", "neutral"),
        ("not_found", "neutral"),
        ("expired", "neutral"),
        ("denied", "neutral"),
    ],
)
def test_only_transient_and_lost_results_count_as_failures(kind: str, outcome: str) -> None:
    assert outcome_of(kind) == outcome


def test_a_refused_call_has_nothing_to_record() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(threshold=1, cooldown_s=COOLDOWN, clock=clock)
    breaker.record(breaker.admit(), "transient")
    refused = breaker.admit()
    assert not refused.allowed
    with pytest.raises(ValueError, match="refused"):
        breaker.record(refused, "success")


def test_the_threshold_and_cooldown_are_configurable() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(threshold=1, cooldown_s=3.0, clock=clock)
    breaker.record(breaker.admit(), "transient")
    assert breaker.state == "open"
    assert breaker.admit().retry_after_s == pytest.approx(3.0)
    clock.now += 3.0
    assert breaker.admit().allowed and breaker.state == "half_open"


@pytest.mark.parametrize(("threshold", "cooldown_s"), [(0, 30.0), (-1, 30.0), (3, -1.0)])
def test_invalid_settings_are_refused(threshold: int, cooldown_s: float) -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(threshold=threshold, cooldown_s=cooldown_s)
    with pytest.raises(ValueError):
        Breakers(threshold=threshold, cooldown_s=cooldown_s)


def test_the_default_clock_is_monotonic_time() -> None:
    breaker = CircuitBreaker(threshold=1, cooldown_s=60.0)
    breaker.record(breaker.admit(), "transient")
    remaining = breaker.admit().retry_after_s
    assert 59.0 < remaining <= 60.0


def test_breakers_are_per_tool_and_report_every_move() -> None:
    clock = FakeClock()
    moves: list[tuple[str, BreakerState]] = []
    breakers = Breakers(
        threshold=2,
        cooldown_s=5.0,
        clock=clock,
        on_change=lambda tool, state: moves.append((tool, state)),
    )
    crm = breakers.for_tool("crm.note.create")
    assert breakers.for_tool("crm.note.create") is crm
    assert moves == []  # a new breaker is closed; only moves are reported

    for _ in range(2):
        crm.record(crm.admit(), "transient")
    payments = breakers.for_tool("payment.charge.create")
    assert payments.admit().allowed  # one tool's failures never cut off another
    assert breakers.states() == {"crm.note.create": "open", "payment.charge.create": "closed"}

    clock.now += 5.0
    probe = crm.admit()
    crm.record(probe, "success")
    assert moves == [
        ("crm.note.create", "open"),
        ("crm.note.create", "half_open"),
        ("crm.note.create", "closed"),
    ]


def test_gauge_values_order_states_by_severity() -> None:
    assert STATE_VALUES == {"closed": 0, "half_open": 1, "open": 2}
