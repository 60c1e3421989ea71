"""A run's next step: take (or reuse) the model's next decision and act on it, or end the run.

`RunSteps.next` is the decision protocol's dispatch (`protocol.py`): a selection is checked,
then refused, proposed, read or called as a branch (`capabilities.py`); a review request or a
decision that waits for a person stops the run (`waits.py`, which this collaborator owns and
hands its own `next`, `finish` and `result`); an answer ends the run, or first asks the agent's
critic (`critic.py`). `decide` reserves the provider call in the run's budget, asks the model,
settles and records its response; `finish` records a run's end. A collaborator of
`PlannerService` (`service.py`) and of `RunAdvance` (`advance.py`)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import msgspec
from opentelemetry.trace import Tracer

from libs.budget import BudgetExhausted, NoBudget
from libs.errors import PermanentError, RetryableError
from schemas.control import CANCEL_CODE
from schemas.host import ProposalView
from services.planner.agents import AgentRegistry
from services.planner.budgeting import RunBudgets, step_key
from services.planner.cancel import cancelled_by
from services.planner.capabilities import Capabilities, Waiting
from services.planner.codes import BUDGET_CODE, EXPIRED_CODE
from services.planner.critic import Critic
from services.planner.effects import AGAIN, Effect, Effects, Finished
from services.planner.inputs import input_digest, model_input, with_injected
from services.planner.provider import (
    AnswerDirectly,
    DecisionProvider,
    ModelDecision,
    RequestCapabilities,
    RequestHumanReview,
    SelectCapability,
)
from services.planner.results import result_effect
from services.planner.review import await_review, review_id
from services.planner.sessions import ModelCallAbandoned, SessionTurns
from services.planner.sessions._plans import PLAN_WAIT, model_payload, plan_taken
from services.planner.sessions.logic import is_turn_run
from services.planner.snapshot import branch_of, has_critic, selection_outcome
from services.planner.store import PlannerStore, RunRow, Step
from services.planner.waits import PersonWaits

__all__ = ["RunSteps"]

log = logging.getLogger("writ.planner")
_DECISION_DECODER = msgspec.json.Decoder(ModelDecision)


class _Undescribed(Exception):
    """A capability of the run's catalog has no description: no model call is made."""


class RunSteps:
    """Takes a run's next step, under the row lock its caller holds."""

    def __init__(
        self,
        *,
        store: PlannerStore,
        provider: DecisionProvider,
        agents: AgentRegistry,
        budget: RunBudgets,
        capabilities: Capabilities,
        critic: Critic,
        sessions: SessionTurns | None,
        tracer: Tracer,
        max_decisions: int,
        reserve_tokens: int,
    ) -> None:
        self._store, self._provider, self._agents = store, provider, agents
        self._budget, self._capabilities, self._critic = budget, capabilities, critic
        self._sessions, self._tracer = sessions, tracer
        self._max_decisions, self._reserve_tokens = max_decisions, reserve_tokens
        self.waits = PersonWaits(
            store=store,
            capabilities=capabilities,
            budget=budget,
            sessions=sessions,
            next_step=self.next,
            finish=self.finish,
            result=self.result,
        )

    def agent_refusal(self, run: RunRow) -> tuple[str, str] | None:
        """Why the run's agent takes no run, as (code, message); None if it takes this one.

        Raises:
            AgentUnavailable: the agent is initializing or stopping here (retry elsewhere).
        """
        agent = self._agents.get(run.agent)
        if agent is None or run.manifest is None:
            return "UNKNOWN_AGENT", f"no manifest declares agent {run.agent}"
        reason = agent.accepts_work()
        return None if reason is None else ("AGENT_UNAVAILABLE", reason)

    async def next(
        self, conn: Any, run: RunRow, steps: list[Step], finished: Finished
    ) -> Effects | None:
        """Take (or reuse) the next decision and act on it; `AGAIN` if the runtime answered it
        itself (a catalog sent, a selection refused, a critic's replan) or committed it before
        acting on it (an answer before its critic, a read's or a branch's selection before the
        call; an action's proposal is recorded with its decision and sent after the commit)."""
        if run.expired is not None:
            # Its input and evidence were erased (retention, an erasure) while it was still
            # open: no model may be asked without them, and nothing may stand in for them.
            return [
                await self.finish(
                    conn,
                    run,
                    steps,
                    "failed",
                    finished,
                    error=(EXPIRED_CODE, f"payload expired (window {run.expired})"),
                )
            ]
        last = steps[-1] if steps else None
        fresh = False
        if (
            last is not None
            and last.kind == "decision"
            and (last.payload.get("decision") != "request_capabilities")
        ):
            decision = _DECISION_DECODER.decode(msgspec.json.encode(model_payload(last.payload)))
            if (
                isinstance(decision, SelectCapability)
                and self._sessions is not None
                and await self._sessions.holds(conn, run)
            ):
                await self._sessions.hold(conn, self._store, run, last.seq)
                return []  # nothing it selects is admitted until the session resumes
        else:
            if self._sessions is not None and not await self._sessions.gate(conn, run, steps):
                return []  # its session is paused: no decision until it resumes
            decisions = sum(
                1 for s in steps if s.kind == "decision" and plan_taken(s.payload) is None
            )
            if self._sessions is not None and (
                planned := await self._sessions.plans.next_step(conn, run, steps)
            ):
                if isinstance(planned, tuple):  # a step of the approved plan did not succeed
                    return [await self.finish(conn, run, steps, "failed", finished, error=planned)]
                await self._sessions.plans.take(
                    conn, self._store, run, steps, planned, turn=decisions
                )
                return AGAIN  # committed before it is acted on, as a model's selection
            if decisions >= self._max_decisions:
                return [
                    await self.finish(
                        conn,
                        run,
                        steps,
                        "failed",
                        finished,
                        error=(BUDGET_CODE, f"{decisions} model decisions"),
                    )
                ]
            try:
                decision = await self._decide(conn, run, steps, turn=decisions)
            except _Undescribed as exc:  # a capability without a description: no model call
                return [
                    await self.finish(
                        conn,
                        run,
                        steps,
                        "failed",
                        finished,
                        error=("CAPABILITY_UNDESCRIBED", str(exc)),
                    )
                ]
            except NoBudget as exc:
                return [await self.out_of_budget(conn, run, steps, finished, exc)]
            except ModelCallAbandoned:  # its session closed mid-call: nothing more is asked
                by = await cancelled_by(conn, run) or "the session's close"
                return [
                    await self.finish(
                        conn,
                        run,
                        steps,
                        "cancelled",
                        finished,
                        error=(CANCEL_CODE, f"cancelled by {by}"),
                    )
                ]
            except PermanentError as exc:
                return [await self.model_failed(conn, run, steps, finished, exc)]
            last, fresh = steps[-1], True
        if isinstance(decision, AnswerDirectly):
            if (
                fresh
                and self._sessions is not None
                and await self._sessions.plans.planning(conn, run, steps)
            ):
                # The answer is committed before its plan is frozen: the facts a plan's
                # preview reads may fail to be read, and are then read again, not the model.
                return AGAIN
            if self._sessions is not None and (
                plan_id := await self._sessions.plans.freeze(conn, run, steps, last.seq)
            ):
                return await self.waits.wait_for_person(  # the plan waits for the user's answer
                    conn, run, steps, finished, step=last.seq, pending_id=plan_id, message=PLAN_WAIT
                )
            if not has_critic(run.manifest):
                return [
                    await self.finish(
                        conn,
                        run,
                        steps,
                        "succeeded",
                        finished,
                        answer=decision.answer,
                        step=last.seq,
                    )
                ]
            if fresh:
                return AGAIN  # the answer is committed before the critic is asked about it
            try:
                accepted = await self._critic.accepts(conn, run, steps, last.seq, decision)
            except NoBudget as exc:
                return [await self.out_of_budget(conn, run, steps, finished, exc)]
            except PermanentError as exc:
                return [await self.model_failed(conn, run, steps, finished, exc)]
            if not accepted:
                return AGAIN  # the critic's reason is the next decision's observation
            return [
                await self.finish(
                    conn, run, steps, "succeeded", finished, answer=decision.answer, step=last.seq
                )
            ]
        if isinstance(decision, RequestCapabilities):
            return AGAIN  # the next model input carries the catalog
        if isinstance(decision, RequestHumanReview):
            run = await await_review(self._store, conn, run, last.seq, decision, finished)
            return [self.result(run, steps, pending_id=review_id(run.run_id, last.seq))]
        refused = selection_outcome(
            run.manifest, agent=run.agent, target=decision.capability, arguments=decision.arguments
        )
        plan_preview = None
        if refused is None and self._sessions is not None:  # a plan-mode turn's plan
            check = await self._sessions.plans.check(
                conn, run, steps, decision, read_facts=not fresh
            )
            refused, decision, plan_preview = check.refused, check.decision, check.plan_preview
        if refused is not None:
            await self._capabilities.refuse(conn, run, steps, last.seq, decision, refused)
            return AGAIN  # (an approved plan's step refused ends the plan: `plans.next_step`)
        if fresh and (is_turn_run(run.run_id) or not self._capabilities.proposes(run, decision)):
            # The decision is committed before its capability call starts: a read or a branch
            # that fails is made again without asking the model again, and so is a plan
            # step's facts read. A proposal is only published once the transaction that
            # records it (and the decision) commits, so it is proposed in the same one.
            return AGAIN
        try:
            acted = await self._capabilities.act(
                conn, run, steps, last.seq, decision, plan_preview=plan_preview
            )
        except NoBudget as exc:
            return [await self.out_of_budget(conn, run, steps, finished, exc)]
        if isinstance(acted, Waiting):
            return await self.waits.wait_for_person(
                conn,
                run,
                steps,
                finished,
                step=last.seq,
                pending_id=acted.pending_id,
                message=acted.message,
            )
        return acted

    async def model_failed(
        self, conn: Any, run: RunRow, steps: list[Step], finished: Finished, exc: PermanentError
    ) -> Effect:
        """The provider gave no decision (or verdict) and asking again will not give one: a
        malformed answer, a refusal, a rejected request. The run fails saying so; nothing is
        guessed at, and the run is never left running with nobody to drive it."""
        log.warning("run %s: the model call failed for good: %r", run.run_id, exc)
        return await self.finish(
            conn,
            run,
            steps,
            "failed",
            finished,
            error=("MODEL_FAILED", f"{type(exc).__name__}: {exc}"),
        )

    async def out_of_budget(
        self, conn: Any, run: RunRow, steps: list[Step], finished: Finished, exc: NoBudget
    ) -> Effect:
        """No step starts: the run fails naming the budget that ran out (the model is not asked
        whether to go on).

        Raises:
            RetryableError: only the concurrent-steps budget ran out, which frees itself once a
                step in flight settles.
        """
        if isinstance(exc, BudgetExhausted):
            if exc.kind == "concurrent_steps":
                raise RetryableError(f"run {run.run_id}: {exc}") from exc
            log.info("run %s: %s budget exhausted, no new step", run.run_id, exc.kind)
            return await self.finish(
                conn, run, steps, "failed", finished, error=(BUDGET_CODE, f"{exc.kind}: {exc}")
            )
        return await self.finish(
            conn,
            run,
            steps,
            "failed",
            finished,
            error=("NO_BUDGET", f"governance has no budget for the run: {exc}"),
        )

    async def _decide(
        self, conn: Any, run: RunRow, steps: list[Step], *, turn: int
    ) -> ModelDecision:
        """Reserve the call, ask the model, settle, and record its response, journaled.

        Raises:
            _Undescribed: a capability has no description (nothing reserved, no call).
            NoBudget: a budget ran out (or the run has none): no call.
            ModelCallAbandoned: a chat turn's session closed during the call (settled as
                its reservation, nothing recorded).
        """
        try:
            injected = [
                text
                for s in steps
                if s.kind == "injected"
                for text in s.payload.get("injected", [])
            ]
            value = model_input(
                user=with_injected(run.input, injected),
                evidence=run.evidence,
                observations=[s.payload for s in steps if s.kind == "observation"],
                turn=turn,
                agent=run.agent,
                manifest=run.manifest,
                catalog_requested=any(
                    s.kind == "decision" and s.payload.get("decision") == "request_capabilities"
                    for s in steps
                ),
            )
        except ValueError as exc:
            raise _Undescribed(str(exc)) from exc
        digest = input_digest(value)
        seq = steps[-1].seq + 1 if steps else 0
        key = step_key(run.run_id, seq, "model")
        await self._budget.reserve(conn, run, key, provider_calls=1, tokens=self._reserve_tokens)
        with self._tracer.start_as_current_span("planner model") as span:
            span.set_attribute("writ.model_input.sha256", digest)
            try:
                async with self._text_sink(run, seq) as sink:
                    decision, tokens = await self._budget.provider_call(
                        conn, run, key, self._provider.decide_with_usage(value, text=sink)
                    )
            except ModelCallAbandoned:
                # What the cut call used is unknown: it is settled as all it reserved.
                await self._budget.spent(
                    conn, run, key, provider_calls=1, tokens=self._reserve_tokens
                )
                raise
        await self._budget.spent(conn, run, key, provider_calls=1, tokens=tokens)
        payload = msgspec.to_builtins(decision)
        # A selection's proposal is journaled once its capability call is reserved
        # (`capabilities.py`).
        await self._store.add_decision(
            conn, run, seq, payload, turn=turn, input_digest=digest, proposal=None
        )
        steps.append(Step(seq=seq, kind="decision", payload=payload))
        return decision

    def _text_sink(self, run: RunRow, seq: int) -> Any:
        """Where the model call's text streams: a chat turn's session, else nowhere."""
        if self._sessions is None:
            return contextlib.nullcontext(None)
        return self._sessions.text_sink(run, seq)

    async def finish(
        self,
        conn: Any,
        run: RunRow,
        steps: list[Step],
        status: str,
        finished: Finished,
        *,
        answer: str | None = None,
        error: tuple[str, str] | None = None,
        step: int | None = None,
    ) -> Effect:
        code, message = error if error else (None, None)
        # The run's last transaction: what is still due (its lease) is recorded before the
        # status, so the status's statement writes it too (`PlannerStore.writing_behind`).
        await self._budget.settle_deferred(conn)
        version = await self._store.set_status(
            conn, run, status, step=step, answer=answer, error_code=code, error_message=message
        )
        if self._sessions is not None:
            await self._sessions.ended(conn, run, status, answer=answer, code=code, steps=steps)
        if branch_of(run.manifest) is None:  # a branch's end is its caller's to observe
            finished.append((status, code))
        run = msgspec.structs.replace(
            run,
            status=status,
            answer=answer,
            error_code=code,
            error_message=message,
            state_version=run.state_version if version is None else version,
        )
        return self.result(run, steps)

    def result(
        self,
        run: RunRow,
        steps: list[Step],
        *,
        pending_id: str | None = None,
        proposal: ProposalView | None = None,
    ) -> Effect:
        return result_effect(run, steps, pending_id=pending_id, proposal=proposal)
