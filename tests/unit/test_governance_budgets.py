"""Run budgets' pure decisions: which budget a step would exceed, and where limits come from."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.errors import ConfigError
from schemas.governance import RunBudget
from services.governance.__main__ import load_budget_defaults
from services.governance.budgets import BudgetDefaults, BudgetState, Limits, leased, refusal

LIMITS = Limits(
    provider_calls=3, tokens=100, capability_calls=2, wall_time_s=60, max_concurrent_steps=2
)


def ask(
    state: BudgetState, provider_calls: int = 0, tokens: int = 0, capability_calls: int = 0
) -> str | None:
    refused = refusal(
        state, provider_calls=provider_calls, tokens=tokens, capability_calls=capability_calls
    )
    return refused[0] if refused else None


def test_a_step_that_fits_is_not_refused() -> None:
    state = BudgetState(limits=LIMITS, reserved_tokens=40, used_tokens=20, open_steps=1)
    assert ask(state, provider_calls=1, tokens=40) is None
    assert ask(state, tokens=41) == "tokens"


def test_overspent_use_counts_and_only_what_is_asked_is_checked() -> None:
    state = BudgetState(limits=LIMITS, used_tokens=130)  # settled above its reservation
    assert state.remaining("tokens") == -30
    assert ask(state, provider_calls=1, tokens=1) == "tokens"
    assert ask(state, capability_calls=1) is None


def test_time_and_concurrency_stop_every_step() -> None:
    assert ask(BudgetState(limits=LIMITS, elapsed_s=60.0)) == "wall_time"
    assert ask(BudgetState(limits=LIMITS, open_steps=2), capability_calls=1) == "concurrent_steps"
    assert BudgetState(limits=LIMITS, elapsed_s=75.0).wall_time_left_s == 0.0


def test_the_agent_overrides_global_and_the_run_can_only_lower_them() -> None:
    defaults = BudgetDefaults(default=LIMITS, agents={"a": RunBudget(tokens=10, wall_time_s=5)})
    # The operator's agent limits replace the global ones, up or down.
    assert defaults.limits_for("a", None) == Limits(
        provider_calls=3, tokens=10, capability_calls=2, wall_time_s=5, max_concurrent_steps=2
    )
    # What the run asks lowers a limit, and asking more than the limit changes nothing.
    assert defaults.limits_for(
        "a", RunBudget(wall_time_s=4, tokens=10_000, max_concurrent_steps=1)
    ) == Limits(
        provider_calls=3, tokens=10, capability_calls=2, wall_time_s=4, max_concurrent_steps=1
    )
    assert defaults.limits_for("b", None) == LIMITS
    assert LIMITS.lowered(RunBudget()) is LIMITS


def test_the_defaults_file_is_checked(tmp_path: Path) -> None:
    good = tmp_path / "budgets.json"
    good.write_text('{"default": {"tokens": 5}, "agents": {"a": {"provider_calls": 1}}}')
    loaded = load_budget_defaults(str(good))
    assert loaded.limits_for("a", None).provider_calls == 1
    assert loaded.limits_for("b", None).tokens == 5
    assert load_budget_defaults("") == BudgetDefaults()
    bad = tmp_path / "bad.json"
    bad.write_text('{"agents": {"a": {"token": 5}}}')
    with pytest.raises(ConfigError):
        load_budget_defaults(str(bad))


def test_a_lease_takes_what_is_left_up_to_its_amounts_never_less_than_asked() -> None:
    state = BudgetState(limits=LIMITS, reserved_tokens=40, used_tokens=20, used_provider_calls=1)
    # 2 provider calls and 40 tokens are left, 2 capability calls.
    assert leased(
        state,
        {"provider_calls": 1, "tokens": 10, "capability_calls": 0},
        {"provider_calls": 8, "tokens": 30, "capability_calls": 8},
    ) == {"provider_calls": 2, "tokens": 30, "capability_calls": 2}
    # Over-spent already (used above the limit): what was asked, never a negative amount.
    over = BudgetState(limits=LIMITS, used_tokens=150)
    assert leased(
        over,
        {"provider_calls": 1, "tokens": 0, "capability_calls": 0},
        {"provider_calls": 1, "tokens": 50, "capability_calls": 0},
    ) == {"provider_calls": 1, "tokens": 0, "capability_calls": 0}
