"""The walk of a run's journal entries in chain order (`replay_run`, `__init__.py`): what each
entry implies comes next (`Expect`, `_expect.py`), and what the walk found — divergences and what
is missing. A tool output's observation is checked in `_observe.py`. No I/O here."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from schemas.planner import Divergence
from schemas.sessions import PlanDecided, PlanProposed, SessionOpened
from services.planner.codes import BUDGET_CODE, REVIEW_CODE
from services.planner.inputs import critic_input, input_digest, model_input, with_injected
from services.planner.journal_entries import (
    CRITIC,
    DECISION,
    INJECTED,
    OBSERVATION,
    PROPOSAL,
    RUN_STARTED,
    RUN_STATUS,
    Captured,
    CriticEntry,
    DecisionEntry,
    InjectedEntry,
    ObservationEntry,
    ProposalEntry,
    RunStartedEntry,
    StatusEntry,
    StepRecord,
)
from services.planner.protocol import action_name
from services.planner.provider import (
    AnswerDirectly,
    CriticVerdict,
    ModelDecision,
    Replan,
    RequestCapabilities,
    RequestHumanReview,
    SelectCapability,
)
from services.planner.replay._expect import Expect, canon, show
from services.planner.replay._observe import observe
from services.planner.replay._plans import PLAN_STALE, PlanTrack
from services.planner.sessions._plans import (
    HELD_CODE,
    PLAN_REJECTED,
    PLAN_WAIT,
    model_payload,
    plan_taken,
)
from services.planner.snapshot import (
    agent_call_target,
    has_critic,
    read_target,
    selection_outcome,
)

__all__ = ["Walk"]

_TERMINAL: Final = frozenset({"succeeded", "failed", "cancelled"})
_BUDGET_KINDS: Final = frozenset(
    {"provider_calls", "tokens", "capability_calls", "wall_time", "concurrent_steps"}
)
_MAX_FINDINGS: Final = 100  # ReplayReport's bound
HELD: Final = frozenset({"propose", "read", "call"})  # what a paused session's turn holds


_DECODERS: Final[dict[str, type]] = {
    RUN_STARTED: RunStartedEntry,
    DECISION: DecisionEntry,
    PROPOSAL: ProposalEntry,
    OBSERVATION: ObservationEntry,
    RUN_STATUS: StatusEntry,
    CRITIC: CriticEntry,
    INJECTED: InjectedEntry,
    # A chat turn's session: whether it plans first, its plans and their answers.
    "session.SessionOpened": SessionOpened,
    "session.PlanProposed": PlanProposed,
    "session.PlanDecided": PlanDecided,
}


class Walk:
    """One run's walk: fed each entry in chain order, then told the journal ended."""

    def __init__(self, run_id: str, unsealed: int) -> None:
        self.run_id, self.unsealed = run_id, unsealed
        self.divergences: list[Divergence] = []
        self.missing: list[str] = []
        self.started: RunStartedEntry | None = None
        self.status = "running"
        self.last_status: StatusEntry | None = None
        self.next_seq = 0
        self.decisions = 0
        self.observations: list[dict[str, Any]] = []
        self.injected: list[str] = []  # a chat turn's injected messages, in order
        self.catalog_requested = False
        self.critics = 0
        # After a missing step the model inputs that follow cannot be recomputed.
        self.inputs_known = True
        self.expect = Expect(what="decide")
        self.steps: dict[int, StepRecord] = {}
        self.plans = PlanTrack()
        self.held: Expect | None = None  # what a paused session held, until its resume

    def diverged(self, step: int | None, expected: str, found: str) -> None:
        if len(self.divergences) < _MAX_FINDINGS:
            self.divergences.append(
                Divergence(step=step, expected=expected[:512], found=found[:512])
            )

    def lacks(self, what: str) -> None:
        if len(self.missing) < _MAX_FINDINGS:
            self.missing.append(what[:512])

    def entry(self, captured: Captured) -> None:
        kind = _DECODERS.get(captured.kind)
        if kind is None:
            self.diverged(
                None,
                "a planner journal entry",
                f"kind {captured.kind!r} (chain seq {captured.seq})",
            )
            return
        try:
            entry: Any = msgspec.convert(captured.payload, kind)
        except msgspec.ValidationError as exc:
            self.diverged(
                None,
                f"a {captured.kind} entry",
                f"an unreadable one (chain seq {captured.seq}): {exc}",
            )
            self.expect = Expect(what="unknown")
            return
        if isinstance(entry, SessionOpened | PlanProposed | PlanDecided):
            self.session_entry(entry)
            return
        if self.status in _TERMINAL:
            self.diverged(
                getattr(entry, "step", getattr(entry, "seq", None)),
                str(self.expect),
                f"a {captured.kind} entry after the run ended",
            )
        if isinstance(entry, RunStartedEntry):
            if self.started is not None:
                self.diverged(None, "one start of the run", "a second run.started entry")
            else:
                self.started = entry
        elif self.started is None:
            self.lacks("the run's start (the evidence its model saw) was never captured")
            self.started = RunStartedEntry(
                request_id="", principal="", agent="", input="", evidence=[]
            )
            self.inputs_known = False
        if isinstance(entry, DecisionEntry):
            self.decision(entry)
        elif isinstance(entry, ProposalEntry):
            self.proposal(entry)
        elif isinstance(entry, ObservationEntry):
            self.observation(entry)
        elif isinstance(entry, StatusEntry):
            self.status_change(entry)
        elif isinstance(entry, CriticEntry):
            self.critic(entry)
        elif isinstance(entry, InjectedEntry):
            self.injected_step(entry)

    def session_entry(self, entry: SessionOpened | PlanProposed | PlanDecided) -> None:
        """A chat turn's session: it plans first; this turn's plan proposed, or answered."""
        ex = self.expect
        if isinstance(entry, SessionOpened):
            self.plans.planning = entry.plan_mode
        elif isinstance(entry, PlanProposed):
            if ex.what != "plan":
                self.diverged(ex.step, str(ex), f"plan {entry.plan.plan_id} proposed")
                self.plans.proposed[entry.plan.plan_id] = (entry, ex.step or 0)
                return
            differs = self.plans.proposal_differs(entry, ex.step or 0, ex.plan or [])
            if differs is not None:
                self.diverged(ex.step, str(ex), differs)
            self.expect = Expect(what="plan-wait", step=ex.step)
        else:
            answered = self.plans.answered(entry)
            if answered is None:
                self.diverged(
                    ex.step,
                    str(ex),
                    f"an answer to plan {entry.plan_id}, which this turn never proposed",
                )
                return
            step, answer = answered
            if ex.what != "plan-answer" or ex.step != step:
                self.diverged(step, str(ex), f"the plan of step {step} {answer}")
            elif answer == "approved":
                self.expect = Expect(what="plan-approved", step=step)
            else:  # the loop's `_plan_answered`
                self.expect = Expect(
                    what="fail", step=step, code="REJECTED", reason=entry.reason or PLAN_REJECTED
                )

    def injected_step(self, i: InjectedEntry) -> None:
        """A chat session's injected messages: the next decision's input carries them."""
        gap = self.at_step(i.seq, "injected message")
        if not gap and self.expect.what not in ("decide", "unknown"):
            self.diverged(
                self.expect.step, str(self.expect), f"an injected message at step {i.seq}"
            )
        self.injected.extend(i.texts)
        self.next_seq = i.seq + 1
        self.steps[i.seq] = StepRecord(
            seq=i.seq, kind="injected", payload={"injected": list(i.texts)}
        )

    def at_step(self, seq: int, kind: str) -> bool:
        """Check a step's position; True if steps before it were never captured."""
        if seq in self.steps:
            self.diverged(seq, "each step recorded once", f"a second {kind} at step {seq}")
        if seq > self.next_seq:
            lost = (
                f"step {self.next_seq}"
                if seq == self.next_seq + 1
                else f"steps {self.next_seq}..{seq - 1}"
            )
            if self.expect.what in ("output", "read"):
                lost += f" (the tool output of step {self.expect.step})"
            elif self.expect.what == "decide":
                lost += " (a model response)"
            self.lacks(f"{lost} was never captured")
            self.inputs_known = False
            return True
        if seq < self.next_seq:
            self.diverged(seq, f"step {self.next_seq} next", f"a {kind} at step {seq}")
        return False

    def decision(self, d: DecisionEntry) -> None:
        gap = self.at_step(d.seq, "decision")
        if not gap and self.expect.what not in ("decide", "unknown"):
            self.diverged(self.expect.step, str(self.expect), f"a model decision at step {d.seq}")
        taken = plan_taken(d.response)
        expected = self.plans.next(self.steps)
        if taken is not None:  # Writ took the approved plan's step: no model call
            if not isinstance(expected, SelectCapability) or canon(
                msgspec.to_builtins(expected)
            ) != canon(model_payload(d.response)):
                self.diverged(
                    d.seq,
                    f"the approved plan's next step {show(msgspec.to_builtins(expected))}"
                    if isinstance(expected, SelectCapability)
                    else "no plan step for Writ to take",
                    f"plan step {taken} {show(model_payload(d.response))} taken",
                )
        elif (
            expected is not None
            and not gap
            and not (  # a turn recorded before Writ took the steps: the model took them
                isinstance(expected, SelectCapability)
                and d.response.get("decision") == "select_capability"
                and d.response.get("capability") == expected.capability
            )
        ):
            self.diverged(
                d.seq,
                "Writ to take the approved plan's next step, or end the plan, with no model call",
                f"a model decision at step {d.seq}",
            )
        if taken is None and self.inputs_known and self.started is not None:
            if d.turn != self.decisions:
                self.diverged(d.seq, f"decision turn {self.decisions}", f"turn {d.turn}")
            try:
                digest = input_digest(
                    model_input(
                        user=with_injected(self.started.input, self.injected),
                        evidence=self.started.evidence,
                        observations=self.observations,
                        turn=self.decisions,
                        agent=self.started.agent,
                        manifest=self.started.manifest,
                        catalog_requested=self.catalog_requested,
                    )
                )
            except ValueError as exc:
                digest = f"none ({exc})"
            if digest != d.input_digest:
                self.diverged(
                    d.seq,
                    f"a model input of sha256 {digest} (from the captured "
                    "evidence and tool outputs)",
                    f"sha256 {d.input_digest}",
                )
        if taken is None:
            self.decisions = d.turn + 1 if not self.inputs_known else self.decisions + 1
        self.next_seq = d.seq + 1
        self.steps[d.seq] = StepRecord(
            seq=d.seq, kind="decision", payload=d.response, input_digest=d.input_digest
        )
        try:
            decision = msgspec.convert(model_payload(d.response), ModelDecision)
        except msgspec.ValidationError as exc:
            self.diverged(
                d.seq, "a model response that decodes as a decision", f"{show(d.response)}: {exc}"
            )
            self.expect = Expect(what="unknown")
            return
        if isinstance(decision, AnswerDirectly):
            verified = has_critic(self.started.manifest if self.started is not None else None)
            if drafts := self.plans.drafts(self.steps):  # a planning turn's answer: its plan
                self.expect = Expect(what="plan", step=d.seq, plan=drafts)
                return
            self.expect = Expect(
                what="critic" if verified else "succeed", step=d.seq, answer=decision.answer
            )
        elif isinstance(decision, RequestCapabilities):
            self.catalog_requested = True
            self.expect = Expect(what="decide")
        elif isinstance(decision, RequestHumanReview):
            self.expect = Expect(what="review", step=d.seq, reason=decision.review_prompt)
        else:
            refused = selection_outcome(
                self.started.manifest if self.started is not None else None,
                agent=self.started.agent if self.started is not None else "",
                target=decision.capability,
                arguments=decision.arguments,
            )
            if refused is None:  # a plan-mode turn's plan check, after the runtime's own
                refused = self.plans.refusal(self.steps, decision)
            manifest = self.started.manifest if self.started is not None else None
            tool = read_target(manifest, decision.capability)
            callee = agent_call_target(manifest, decision.capability)
            if refused is not None:
                self.expect = Expect(
                    what="refuse",
                    step=d.seq,
                    action=decision.capability[:512],
                    code=refused[0],
                    reason=refused[1],
                )
            elif tool is not None:
                self.expect = Expect(
                    what="read", step=d.seq, action=tool, arguments=decision.arguments
                )
            elif callee is not None:
                self.expect = Expect(
                    what="call", step=d.seq, action=callee, arguments=decision.arguments
                )
            else:  # an approved plan's step sends the plan's frozen request
                planned = self.plans.request(self.steps, decision)
                self.expect = Expect(
                    what="propose",
                    step=d.seq,
                    action=action_name(decision.capability)[:512],
                    arguments=decision.arguments if planned is None else planned,
                    code=PLAN_STALE if self.plans.may_be_stale(self.steps, decision) else None,
                )

    def critic(self, c: CriticEntry) -> None:
        ex = self.expect
        gap = self.at_step(c.seq, "critic verdict")
        if (
            not gap
            and ex.what not in ("critic", "unknown")
            or (ex.what == "critic" and c.step != ex.step)
        ):
            self.diverged(c.step, str(ex), f"a critic verdict at step {c.seq}")
        answer = ex.answer if ex.what == "critic" else None
        if self.inputs_known and self.started is not None and answer is not None:
            if c.round != self.critics:
                self.diverged(c.seq, f"critic round {self.critics}", f"round {c.round}")
            digest = input_digest(
                critic_input(
                    user=self.started.input,
                    evidence=self.started.evidence,
                    observations=self.observations,
                    answer=answer,
                    round=self.critics,
                    agent=self.started.agent,
                    manifest=self.started.manifest,
                )
            )
            if digest != c.input_digest:
                self.diverged(
                    c.seq,
                    f"a critic input of sha256 {digest} (from the captured "
                    "answer, evidence and tool outputs)",
                    f"sha256 {c.input_digest}",
                )
        self.critics = c.round + 1 if not self.inputs_known else self.critics + 1
        self.next_seq = c.seq + 1
        self.steps[c.seq] = StepRecord(
            seq=c.seq, kind="critic", payload=c.verdict, input_digest=c.input_digest
        )
        try:
            verdict = msgspec.convert(c.verdict, CriticVerdict)
        except msgspec.ValidationError as exc:
            self.diverged(
                c.seq, "a critic response that decodes as a verdict", f"{show(c.verdict)}: {exc}"
            )
            self.expect = Expect(what="unknown")
            return
        if isinstance(verdict, Replan):
            self.expect = Expect(what="replan", step=c.seq, reason=verdict.reason)
        else:
            self.expect = Expect(what="succeed", step=c.step, answer=answer)

    def proposal(self, p: ProposalEntry) -> None:
        ex = self.expect
        if ex.what != "propose" or p.step != ex.step:
            self.diverged(p.step, str(ex), f"a proposal of {p.action} at step {p.step}")
        else:
            if p.action != ex.action:
                self.diverged(p.step, f"a proposal of {ex.action}", f"a proposal of {p.action}")
            if canon(p.arguments) != canon(ex.arguments):
                self.diverged(
                    p.step,
                    f"{ex.action} with arguments {show(ex.arguments)}",
                    f"arguments {show(p.arguments)}",
                )
        self.expect = Expect(what="output", step=p.step, action=p.action)

    def observation(self, o: ObservationEntry) -> None:
        """A tool output's observation (`_observe.py`)."""
        observe(self, o)

    def status_change(self, s: StatusEntry) -> None:
        ex = self.expect
        if s.status == "awaiting_human" and ex.what == "review":
            if s.step != ex.step or (s.error_code, s.error_message) != (REVIEW_CODE, ex.reason):
                self.diverged(
                    s.step, str(ex), f"the run waiting with {s.error_code}: {show(s.error_message)}"
                )
            self.expect = Expect(what="reviewing", step=ex.step)
        elif s.status == "awaiting_human" and ex.what == "plan-wait":
            if s.step != ex.step or s.error_message != PLAN_WAIT:
                self.diverged(
                    s.step, str(ex), f"the run waiting with {s.error_code}: {show(s.error_message)}"
                )
            self.expect = Expect(what="plan-answer", step=ex.step)
        elif s.status == "awaiting_human" and s.error_code == HELD_CODE and ex.what in HELD:
            self.held = ex  # a paused session holds the selection: it is acted on at resume
        elif s.status == "awaiting_human":
            if ex.what != "output" or (s.step is not None and s.step != ex.step):
                self.diverged(s.step, str(ex), "the run waiting for a person's decision")
        elif s.status == "running" and self.held is not None:
            self.expect, self.held = self.held, None
        elif s.status == "running":
            if ex.what != "resume":
                self.diverged(s.step, str(ex), "the run resumed")
            self.expect = Expect(what="decide")
        elif s.status == "succeeded":
            if ex.what != "succeed":
                self.diverged(
                    s.step if s.step is not None else ex.step,
                    str(ex),
                    f"the run succeeded with answer {show(s.answer)}",
                )
            elif s.answer != ex.answer:
                self.diverged(ex.step, str(ex), f"the run succeeded with answer {show(s.answer)}")
        elif s.status == "failed":
            found = f"the run failed with {s.error_code}: {show(s.error_message)}"
            stop = self.plans.next(self.steps) if ex.what == "decide" else None
            if isinstance(stop, tuple):  # an approved plan's step did not succeed: it ends
                if (s.error_code, s.error_message) != stop:
                    self.diverged(
                        ex.step, f"the plan to end with {stop[0]}: {show(stop[1])}", found
                    )
            elif ex.what == "fail":
                if (s.error_code, s.error_message) != (ex.code, ex.reason):
                    self.diverged(ex.step, str(ex), found)
            elif s.error_code == BUDGET_CODE and ex.what in (
                "decide",
                "critic",
                "propose",
                "read",
                "call",
            ):
                # The planner's own cap says how many decisions it took; a budget governance
                # refused names its kind (the rest is governance's to record).
                message = s.error_message or ""
                if message.endswith(" model decisions"):
                    if message != f"{self.decisions} model decisions":
                        self.diverged(
                            None, f"the run to fail after {self.decisions} model decisions", found
                        )
                elif message.split(":", 1)[0] not in _BUDGET_KINDS:
                    self.diverged(s.step, "the run to fail naming the budget that ran out", found)
            else:
                self.diverged(s.step if s.step is not None else ex.step, str(ex), found)
        elif s.status != "cancelled":
            self.diverged(s.step, str(ex), f"status {s.status!r}")
        self.status, self.last_status = s.status, s
        if s.status in _TERMINAL:
            self.expect = Expect(what="ended")

    def end(self) -> None:
        if self.started is None:
            self.lacks("nothing of the run was captured")
        ex, waiting = self.expect, self.unsealed_note()
        if (
            ex.what in ("refuse", "review", "succeed", "fail", "replan", "plan", "plan-wait")
            and not self.unsealed
        ):
            # Written in the same transaction as the decision or output that implies it.
            self.diverged(ex.step, str(ex), "nothing")
        elif ex.what == "propose" and self.status not in _TERMINAL:
            # Proposed in the transaction after the decision's, once its capability call was
            # reserved: a planner that stopped in between proposes it when the run resumes.
            self.lacks(
                f"the proposal of step {ex.step} was never captured (the run is "
                f"{self.status}){waiting}"
            )
        elif ex.what == "propose" and not self.unsealed:
            self.diverged(ex.step, str(ex), "nothing")
        elif ex.what == "read" and self.status not in _TERMINAL:
            # Read after the decision's transaction: a planner that stopped in between (or a
            # retrieval that did not answer) reads it when the run resumes.
            self.lacks(
                f"the read of step {ex.step} was never captured (the run is {self.status}){waiting}"
            )
        elif ex.what == "read" and not self.unsealed:
            self.diverged(ex.step, str(ex), "nothing")
        elif ex.what == "call":
            # The called agent's branch is a run of its own; its end is observed when it ends.
            self.lacks(
                f"the end of the agent call of step {ex.step} was never captured (the "
                f"run is {self.status}){waiting}"
            )
        elif ex.what == "output":
            self.lacks(
                f"the tool output of step {ex.step} was never captured (the run is "
                f"{self.status}){waiting}"
            )
        elif ex.what == "plan-approved":
            self.lacks(
                f"the approval of the plan of step {ex.step} was never observed (the "
                f"run is {self.status}){waiting}"
            )
        elif ex.what == "critic":
            self.lacks(
                f"the critic's verdict on the answer of step {ex.step} was never "
                f"captured (the run is {self.status}){waiting}"
            )
        elif self.status not in _TERMINAL:
            self.lacks(f"the run has not ended (it is {self.status}){waiting}")

    def unsealed_note(self) -> str:
        return f"; {self.unsealed} entries of the run are not sealed yet" if self.unsealed else ""
