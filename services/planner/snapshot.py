"""The agent snapshot a run carries (`planner.runs.manifest`, journaled with `run.started`):
taken from the agent as the run starts, and read back to answer what the run may do — whether a
critic verifies its answers, the limits its manifest sets for its budgets, where a branch run
sits, and what a selection's target names in the
run's catalog (a read tool, another agent, else an action) or why it is refused. Shared by the
service and the replay, so both decide the same from the same snapshot.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from actions import ACTIONS
from schemas.governance import RunBudget
from services.planner.agents import AgentProcess
from services.planner.protocol import agent_target, check_selection, read_tool

__all__ = [
    "agent_call_target",
    "branch_of",
    "has_critic",
    "manifest_limit",
    "read_target",
    "selection_outcome",
    "snapshot_of",
]


def snapshot_of(agent: AgentProcess | None, *, chat_turn: bool = False) -> dict[str, Any] | None:
    """The snapshot a run of `agent` starts with; None if no manifest declares the agent.
    `chat_turn`: the run is a chat session's turn, whose model may mark a selection
    consequential (plan-mode) and is told so (`inputs.PLAN_MARK_INSTRUCTION`); kept in the
    snapshot so the replay rebuilds the same model input."""
    if agent is None:
        return None
    return {
        "name": agent.name,
        "version": agent.manifest.version,
        "responsibility": agent.manifest.responsibility,
        "catalog": agent.catalog,
        "critic": agent.manifest.critic,
        "budgets": msgspec.to_builtins(agent.manifest.budgets),
        **({"chat_turn": True} if chat_turn else {}),
    }


def has_critic(manifest: dict[str, Any] | None) -> bool:
    """Whether the run's agent snapshot has a critic verify its answers."""
    return bool((manifest or {}).get("critic", False))


def manifest_limit(manifest: dict[str, Any] | None) -> RunBudget | None:
    """The limits a root run's manifest sets for its budgets, as governance takes them (each
    lowers the run's limit, never raises it); None for a branch, which spends its root's
    budgets under the root's limits, and for a snapshot that sets none."""
    budgets = (manifest or {}).get("budgets")
    if budgets is None or branch_of(manifest) is not None:
        return None
    return RunBudget(
        provider_calls=budgets["provider_calls"],
        tokens=budgets["tokens"],
        capability_calls=budgets["capability_calls"],
        wall_time_s=math.ceil(budgets["wall_time_s"]),
        max_concurrent_steps=budgets["concurrent_steps"],
    )


def branch_of(manifest: dict[str, Any] | None) -> dict[str, Any] | None:
    """Where a branch run sits, from its snapshot: `root_run_id` (whose budgets it spends),
    `parent_run_id` and `parent_step` (the call it answers), `chain` (the agents that called it,
    outermost first); None for a run a host started."""
    return (manifest or {}).get("branch")


def selection_outcome(
    manifest: dict[str, Any] | None, *, agent: str, target: str, arguments: dict[str, Any]
) -> tuple[str, str] | None:
    """(check, reason) if the runtime refuses this selection before any handler, else None.

    A run from before manifests (no snapshot) has no catalog to check against: admission's
    contract checks were its only ones.
    """
    if manifest is None:
        return None
    branch = branch_of(manifest) or {}
    _, refusal = check_selection(
        manifest.get("catalog", []),
        caller=agent,
        target=target,
        arguments=arguments,
        actions=ACTIONS,
        chain=tuple(branch.get("chain", ())),
    )
    return None if refusal is None else (refusal.check, refusal.reason)


def read_target(manifest: dict[str, Any] | None, target: str) -> str | None:
    """The read tool a selection's target names in the run's catalog, else None (an action)."""
    return None if manifest is None else read_tool(manifest.get("catalog", []), target)


def agent_call_target(manifest: dict[str, Any] | None, target: str) -> str | None:
    """The agent a selection's target names in the run's catalog, else None."""
    return None if manifest is None else agent_target(manifest.get("catalog", []), target)
