"""The critic (the agent-OS runtime view's scenario A): for an agent whose manifest has one
(`snapshot.has_critic`), an `answer_directly` is verified against the objective before the run ends
with it.

The answer is committed first; the critic then reserves a provider call and tokens of the run's
budget like a decision does (`budgeting.py`, key `<run>:<seq>:critic`), and its verdict is
recorded and journaled as a step (`step.critic`, with the digest of its input, `inputs.py`).
`accept` lets the run end with the answer; `replan` feeds the critic's reason back as an
observation written by Writ (`CriticReplan`) and the agent decides again, under the same
budgets. The critic runs nothing: no tool, no shell, no code.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from opentelemetry.trace import Tracer

from services.planner.budgeting import RunBudgets, step_key
from services.planner.inputs import critic_input, input_digest
from services.planner.observations import CriticReplan, observation_of
from services.planner.provider import Accept, AnswerDirectly, DecisionProvider
from services.planner.store import PlannerStore, RunRow, Step

__all__ = ["Critic"]

log = logging.getLogger("writ.planner")


class Critic:
    """Asks the critic about a committed answer and records its verdict."""

    def __init__(
        self,
        *,
        store: PlannerStore,
        budget: RunBudgets,
        provider: DecisionProvider,
        tracer: Tracer,
        reserve_tokens: int,
    ) -> None:
        self._store, self._budget, self._provider = store, budget, provider
        self._tracer, self._reserve_tokens = tracer, reserve_tokens

    async def accepts(
        self, conn: Any, run: RunRow, steps: list[Step], seq: int, decision: AnswerDirectly
    ) -> bool:
        """Whether the critic accepts the answer of step `seq`; a replan is recorded as the
        next decision's observation.

        Raises:
            NoBudget: the critic's call could not be reserved (no call made).
        """
        rounds = sum(1 for s in steps if s.kind == "critic")
        key = step_key(run.run_id, seq + 1, "critic")
        value = critic_input(
            user=run.input,
            evidence=run.evidence,
            observations=[s.payload for s in steps if s.kind == "observation"],
            answer=decision.answer,
            round=rounds,
            agent=run.agent,
            manifest=run.manifest,
        )
        await self._budget.reserve(conn, run, key, provider_calls=1, tokens=self._reserve_tokens)
        digest = input_digest(value)
        with self._tracer.start_as_current_span("planner critic") as span:
            span.set_attribute("writ.critic_input.sha256", digest)
            verdict, tokens = await self._budget.provider_call(
                conn, run, key, self._provider.verify(value)
            )
        await self._budget.spent(conn, run, key, provider_calls=1, tokens=tokens)
        payload = msgspec.to_builtins(verdict)
        await self._store.add_critic(
            conn, run, seq + 1, step=seq, round=rounds, verdict=payload, input_digest=digest
        )
        steps.append(Step(seq=seq + 1, kind="critic", payload=payload))
        if isinstance(verdict, Accept):
            return True
        output = CriticReplan(run_id=run.run_id, step=seq + 1, reason=verdict.reason)
        observation = observation_of(output)
        await self._store.add_observation(
            conn,
            run,
            seq + 2,
            step=seq + 1,
            output=msgspec.to_builtins(output),
            observation=observation,
        )
        steps.append(Step(seq=seq + 2, kind="observation", payload=observation))
        log.info("run %s: the critic asked for a replan of step %d", run.run_id, seq)
        return False
