"""What the replay of a plan-mode chat turn knows of its plans (`_walk.py`). No I/O here.

A turn plans first when its session does (`session.SessionOpened`'s `plan_mode`, from the
session's own journal). Then, as the loop does (`sessions/_plans.py`, whose pure rules this
asks — `plan_refusal`, `plan_drafts`): a selection is refused `PLANNED` while no plan is
approved and `NOT_IN_PLAN` when it is not the approved plan's next step; an answer with steps
recorded is frozen as a plan — `session.PlanProposed`, whose steps and digest must be exactly
what the captured selections resolve to — and the run waits for the user; the user's answer
(`session.PlanDecided`) either approves it (its approval is the model's next observation) or
rejects it (the run fails `REJECTED` with the user's reason). `compare` checks the runtime's
`planner.plans` rows against what the journal captured.
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.sessions import PlanDecided, PlanProposed, PlanStep
from services.planner.journal_entries import PlanRecord, StepRecord
from services.planner.provider import SelectCapability
from services.planner.sessions._plans import (
    PLAN_STALE,
    facts_bound,
    marked,
    plan_digest,
    plan_drafts,
    plan_next,
    plan_outline,
    plan_refusal,
)
from services.planner.store import Step

__all__ = ["PLAN_STALE", "PlanTrack"]


def _steps(recorded: dict[int, StepRecord]) -> list[Step]:
    return [Step(seq=r.seq, kind=r.kind, payload=r.payload) for _, r in sorted(recorded.items())]


class PlanTrack:
    """A turn's plans as its replay finds them, in chain order."""

    def __init__(self) -> None:
        self.planning = False  # the session plans first (set by its `SessionOpened`)
        self.proposed: dict[str, tuple[PlanProposed, int]] = {}  # plan id -> (entry, step)
        self.answers: dict[str, str] = {}  # plan id -> approved | rejected | superseded
        self.approved: tuple[list[PlanStep], int] | None = None
        self.reasons: dict[str, str] = {}

    def _plans(self, recorded: dict[int, StepRecord]) -> bool:
        # The turn plans if its session does, or the model marked a selection consequential.
        return self.planning or marked(_steps(recorded))

    def refusal(
        self, recorded: dict[int, StepRecord], decision: SelectCapability
    ) -> tuple[str, str] | None:
        """The refusal the loop's plan check gives the selection just recorded, if any."""
        if not self._plans(recorded):
            return None
        taken = plan_refusal(_steps(recorded), self.approved, decision)
        return None if isinstance(taken, PlanStep) else taken

    def request(
        self, recorded: dict[int, StepRecord], decision: SelectCapability
    ) -> dict[str, Any] | None:
        """The plan's frozen request an approved step sends in place of the model's spelling
        (None: no plan governs the selection, or it was frozen before requests were kept)."""
        if not self._plans(recorded) or self.approved is None:
            return None
        taken = plan_refusal(_steps(recorded), self.approved, decision)
        return taken.request if isinstance(taken, PlanStep) else None

    def may_be_stale(self, recorded: dict[int, StepRecord], decision: SelectCapability) -> bool:
        """Whether the loop may have refused this approved step `PLAN_STALE` (its facts are
        read again when it is taken; replay reads none, so it accepts either)."""
        return self.request(recorded, decision) is not None and facts_bound(
            decision.capability, decision.arguments
        )

    def next(self, recorded: dict[int, StepRecord]) -> SelectCapability | tuple[str, str] | None:
        """What Writ takes next itself under the approved plan (`plan_next`): its next step,
        or the plan's end (code, reason), or None (the model is asked)."""
        if not self._plans(recorded) or self.approved is None:
            return None
        return plan_next(_steps(recorded), self.approved[0])

    def drafts(self, recorded: dict[int, StepRecord]) -> list[tuple[str, dict[str, Any]]]:
        """The plan an answer just recorded freezes (empty: the answer ends the turn)."""
        if not self._plans(recorded):
            return []
        return plan_drafts(_steps(recorded), None if self.approved is None else self.approved[1])

    def proposal_differs(
        self, entry: PlanProposed, step: int, expected: list[tuple[str, dict[str, Any]]]
    ) -> str | None:
        """Record a captured plan; what in it differs from the selections it froze, if
        anything."""
        plan = entry.plan
        self.proposed[plan.plan_id] = (entry, step)
        held = _canon(
            [
                [s.capability, s.request if s.request is not None else s.arguments]
                for s in plan.steps
            ]
        )
        if held != plan_outline(expected):
            return f"plan {plan.plan_id} with steps {held.decode()}"
        if plan.digest != plan_digest(list(plan.steps)):
            return f"plan {plan.plan_id} whose digest {plan.digest} is not its steps' sha256"
        return None

    def answered(self, entry: PlanDecided) -> tuple[int, str] | None:
        """The user's answer to a plan of this turn: (the plan's step, its answer), or None
        if the turn never proposed it."""
        proposed = self.proposed.get(entry.plan_id)
        if proposed is None:
            return None
        self.answers[entry.plan_id] = entry.answer
        self.reasons[entry.plan_id] = entry.reason
        if entry.answer == "approved":
            self.approved = (list(proposed[0].plan.steps), proposed[1])
        return proposed[1], entry.answer

    def compare(self, plans: list[PlanRecord]) -> list[tuple[str, str]]:
        """(expected, found) for each way `planner.plans` differs from the journal."""
        found: list[tuple[str, str]] = []
        recorded = {p.plan_id: p for p in plans}
        for plan_id, (entry, _) in self.proposed.items():
            row = recorded.get(plan_id)
            state = self.answers.get(plan_id, "proposed")
            if row is None:
                found.append((f"plan {plan_id} in planner.plans", "no such plan"))
                continue
            captured = _captured(entry.plan.digest, entry.plan.steps, state)
            held = _captured(row.digest, row.steps, row.state)
            if captured != held:
                found.append((f"plan {plan_id} {captured} (captured)", f"{held} (planner.plans)"))
        for plan_id in recorded.keys() - self.proposed.keys():
            found.append(
                ("a journal entry for every plan", f"plan {plan_id} the journal never captured")
            )
        return found


def _canon(value: Any) -> bytes:
    return msgspec.json.encode(value, order="sorted")


def _captured(digest: str, steps: Any, state: str) -> str:
    return f"{state}, digest {digest}, steps {_canon(steps).decode()}"
