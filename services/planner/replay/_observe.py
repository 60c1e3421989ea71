"""What a captured observation must be, given what the walk expected (`Walk.observation`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from schemas.admission import ProposalRefused
from services.planner.codes import REFUSAL_CODES
from services.planner.journal_entries import ObservationEntry, StepRecord
from services.planner.observations import (
    AgentObserved,
    CriticReplan,
    Output,
    ReadObserved,
    ReviewAnswered,
    SelectionRefused,
    observation_of,
)
from services.planner.replay._expect import Expect, canon, show
from services.planner.replay._plans import PLAN_STALE

if TYPE_CHECKING:
    from services.planner.replay._walk import Walk

__all__ = ["observe"]


def observe(walk: Walk, o: ObservationEntry) -> None:
    """Check a tool output's observation against `walk.expect`, and say what comes next."""
    ex = walk.expect
    gap = walk.at_step(o.seq, "observation")
    stale = ex.what == "propose" and ex.code == PLAN_STALE  # may be refused instead
    if (
        not gap
        and ex.what != "unknown"
        and not (
            (
                stale
                or ex.what
                in ("output", "read", "call", "refuse", "reviewing", "replan", "plan-approved")
            )
            and o.step == ex.step
        )
    ):
        walk.diverged(
            ex.step if ex.step is not None else o.step,
            str(ex),
            f"a tool output of step {o.step}",
        )
    walk.next_seq = o.seq + 1
    walk.steps[o.seq] = StepRecord(seq=o.seq, kind="observation", payload=o.observation)
    walk.observations.append(o.observation)
    try:
        output = msgspec.convert(o.output, Output)
    except msgspec.ValidationError as exc:
        walk.diverged(
            o.seq,
            "a captured tool output (an outcome or a refusal)",
            f"{show(o.output)}: {exc}",
        )
        walk.expect = Expect(what="unknown")
        return
    if output.run_id != walk.run_id or output.step != o.step:
        walk.diverged(
            o.seq,
            f"the output of run {walk.run_id} step {o.step}",
            f"the output of run {output.run_id} step {output.step}",
        )
    derived = observation_of(output)
    if canon(derived) != canon(o.observation):
        walk.diverged(
            o.seq,
            f"the observation {show(derived)} (from the captured output)",
            f"{show(o.observation)}",
        )
    if isinstance(output, ReadObserved):
        if ex.what != "read":
            walk.diverged(o.step, str(ex), f"a read of {output.tool} at step {output.step}")
        elif output.tool != ex.action or canon(output.arguments) != canon(ex.arguments):
            walk.diverged(
                o.step,
                str(ex),
                f"a read of {output.tool} with arguments {show(output.arguments)}",
            )
        walk.expect = Expect(what="decide")
        return
    if isinstance(output, AgentObserved):
        if ex.what != "call":
            walk.diverged(o.step, str(ex), f"a call of {output.agent} at step {output.step}")
        elif output.agent != ex.action or canon(output.arguments) != canon(ex.arguments):
            walk.diverged(
                o.step,
                str(ex),
                f"a call of {output.agent} with arguments {show(output.arguments)}",
            )
        walk.expect = Expect(what="decide")
        return
    if ex.what in ("read", "call"):
        walk.diverged(o.step, str(ex), f"another tool output of step {o.step}")
        walk.expect = Expect(what="unknown")
        return
    if isinstance(output, SelectionRefused):
        if ex.what == "refuse" and (output.check, output.reason) != (ex.code, ex.reason):
            walk.diverged(
                o.step,
                str(ex),
                f"the runtime refused {output.target} ({output.check}: {show(output.reason)})",
            )
        elif ex.what in ("propose", "output") and not (
            ex.what == "propose" and ex.code == PLAN_STALE == output.check
        ):
            walk.diverged(o.step, str(ex), f"the runtime refused {output.target}")
        walk.expect = Expect(what="decide")
        return
    if isinstance(output, CriticReplan):
        if ex.what != "replan" or output.reason != ex.reason:
            walk.diverged(o.step, str(ex), f"the critic's replan of step {output.step}")
        walk.expect = Expect(what="decide")
        return
    if isinstance(output, ReviewAnswered):
        if ex.what == "plan-approved" and output.answer != "approve":
            walk.diverged(o.step, str(ex), f"a review answer {output.answer}")
        elif ex.what not in ("reviewing", "plan-approved"):
            walk.diverged(o.step, str(ex), f"a review answer for step {output.step}")
        if output.answer == "approve":
            walk.expect = Expect(what="resume", step=o.step)
        else:
            walk.expect = Expect(what="fail", step=o.step, code="REJECTED", reason=output.reason)
        return
    if ex.what == "output" and output.action != ex.action:
        walk.diverged(o.step, f"the output of {ex.action}", f"the output of {output.action}")
    if isinstance(output, ProposalRefused):
        if output.verdict == "ask":
            walk.diverged(
                o.seq,
                "an ask to stop the run for a person, not an observation",
                "an ask observed",
            )
        if output.verdict == "revise":  # sent back: the run goes on, told why
            walk.expect = (
                Expect(what="resume", step=o.step)
                if walk.status == "awaiting_human"
                else Expect(what="decide")
            )
            return
        walk.expect = Expect(
            what="fail",
            step=o.step,
            code=REFUSAL_CODES.get(output.verdict, "?"),
            reason=output.reason,
        )
    elif walk.status == "awaiting_human":
        walk.expect = Expect(what="resume", step=o.step)
    else:
        walk.expect = Expect(what="decide")
