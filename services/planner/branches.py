"""Calls to other agents from the planner's side: a run's agent may call
another agent that lists it in `callable_by`, as a governed capability.

A checked call (in `uses`, `callable_by`, the signature, not deeper than `MAX_BRANCH_DEPTH`,
no agent twice on the chain: `protocol.check_selection`) is first decided by governance like any
capability: the planner asks `decide` for the tool `agent:<name>` (`AGENT_CALL_PREFIX`), with the
request as first argument. Governance classifies no family for it and gives it the
conversation's scope, so it is allowed unless policy refuses the tool or a deny rule matches it;
whatever the callee then does is decided on its own. Only an allowed call starts a branch.

A branch is a run of its own (`planner.runs`, id `<caller>.b<step>`), started in the caller's
transaction with the callee's snapshot and where it sits (`branch`: root run, caller and step,
the chain of agents above it). It has its own steps and observations: its model sees the request
it was given and what it did, never the caller's evidence or observations, and the caller sees
only how the branch ended (`observations.AgentObserved`: the answer, untrusted and bounded). It
spends the root run's budgets (`budgeting.budget_run_id`). Each branch step is recorded and
journaled like any run's, and replayed on its own.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client

from libs.decide import DecideUnavailable as GovernanceUnavailable
from libs.decide import decide
from libs.errors import RetryableError
from schemas.governance import AGENT_CALL_PREFIX, DecideRequest, Decision
from schemas.planner import branch_run_id
from services.planner.agents import AgentProcess
from services.planner.budgeting import budget_run_id
from services.planner.snapshot import branch_of
from services.planner.store import RunRow

__all__ = ["CallDecider", "CallDecisionUnavailable", "branch_run"]


class CallDecisionUnavailable(RetryableError):
    """Governance gave no usable answer: no answer is not an allow, so the call is asked again
    (the delivery is retried; the caller's decision stays recorded)."""

    def __init__(self, msg: str, *, run_id: str, agent: str) -> None:
        super().__init__(msg, delay=1.0)
        self.run_id, self.agent = run_id, agent


class CallDecider:
    """Ask governance's `decide` whether a run's agent may call another agent now."""

    def __init__(self, *, nc: Client, timeout: float = 2.0) -> None:
        self._nc, self._timeout = nc, timeout

    async def decide(self, run: RunRow, callee: str, request: str) -> Decision:
        """Governance's verdict on `run`'s agent calling `callee` with `request`.

        Raises:
            CallDecisionUnavailable: no answer, an error, or an answer that does not decode.
        """
        ask = DecideRequest(
            tenant=run.tenant,
            principal=run.principal,
            agent=run.agent,
            run_id=budget_run_id(run),
            tool=f"{AGENT_CALL_PREFIX}{callee}"[:512],
            first_argument=request[:512],
        )
        try:
            return await decide(self._nc, ask, timeout=self._timeout)
        except GovernanceUnavailable as exc:
            raise CallDecisionUnavailable(str(exc), run_id=run.run_id, agent=callee) from exc


def branch_run(
    caller: RunRow, step: int, callee: AgentProcess, arguments: dict[str, Any]
) -> RunRow:
    """The branch run a checked, allowed call of `callee` at `step` starts: the callee's
    snapshot, the request it was given and nothing else of the caller's."""
    above = branch_of(caller.manifest) or {}
    run_id = branch_run_id(caller.run_id, step)
    snapshot = {
        "name": callee.name,
        "version": callee.manifest.version,
        "responsibility": callee.manifest.responsibility,
        "catalog": callee.catalog,
        "critic": callee.manifest.critic,
        "branch": {
            "root_run_id": budget_run_id(caller),
            "parent_run_id": caller.run_id,
            "parent_step": step,
            "chain": [*above.get("chain", []), caller.agent],
        },
    }
    return RunRow(
        run_id=run_id,
        tenant=caller.tenant,
        request_id=run_id,
        principal=caller.principal,
        agent=callee.name,
        input=str(arguments.get("request", "")),
        evidence=[],
        status="running",
        answer=None,
        error_code=None,
        error_message=None,
        manifest=snapshot,
        attended=caller.attended,
    )
