"""Human review: a model's `request_human_review` stops the run as `awaiting_human` (error code
`HUMAN_REVIEW`, the prompt as its message) until a person answers on `writ.int.planner.review`
(`endpoints.py`), attended or not; the host is told what to review (`pending_id`).

The answer is explicit and recorded as the observation of the review's step (`ReviewAnswered`,
journaled with it): `approve` resumes the run, whose model reads the answer next; `reject` fails
the run with `REJECTED`. An answer that does not fit — no such run of the tenant, or the run is
not waiting for this review — is refused and changes nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.planner import ReviewAnswer
from services.planner.codes import REVIEW_CODE
from services.planner.effects import Finished
from services.planner.observations import ReviewAnswered, observation_of
from services.planner.provider import RequestHumanReview
from services.planner.snapshot import branch_of
from services.planner.store import PlannerStore, RunRow, Step

__all__ = ["ReviewRefused", "await_review", "record_answer", "review_id"]


class ReviewRefused(Exception):
    """A review answer that does not fit the run (no such review waiting)."""


def review_id(run_id: str, step: int) -> str:
    """The pending id a host answers the review of step `step` with."""
    return f"review-{run_id}-{step}"[:128]


async def await_review(
    store: PlannerStore,
    conn: Any,
    run: RunRow,
    seq: int,
    decision: RequestHumanReview,
    finished: Finished,
) -> RunRow:
    """The model asked for a person at step `seq`: the run waits for an explicit answer.

    Returns the run as it now stands (`awaiting_human`)."""
    pending_id = review_id(run.run_id, seq)
    version = await store.set_status(
        conn,
        run,
        "awaiting_human",
        step=seq,
        error_code=REVIEW_CODE,
        error_message=decision.review_prompt,
        pending_id=pending_id,
    )
    if version is not None:
        if branch_of(run.manifest) is None:  # a branch's wait is counted as its caller's
            finished.append(("awaiting_human", REVIEW_CODE))
    return msgspec.structs.replace(
        run,
        status="awaiting_human",
        error_code=REVIEW_CODE,
        error_message=decision.review_prompt,
        pending_id=pending_id,
        state_version=run.state_version if version is None else version,
    )


async def record_answer(
    store: PlannerStore, conn: Any, answer: ReviewAnswer
) -> tuple[RunRow, list[Step], int]:
    """Lock the run, check it waits for this review, and record the answer as the review
    step's observation; the run (locked), its steps (the answer's included) and how many steps
    it had before.

    Raises:
        ReviewRefused: the tenant has no such run waiting for this review.
    """
    run = await store.lock_run(conn, answer.run_id)
    if run is None or run.tenant != answer.tenant:
        raise ReviewRefused("no such run")
    steps = await store.steps(conn, run.run_id)
    seen = len(steps)
    last = steps[-1] if steps else None
    if (
        run.status != "awaiting_human"
        or run.error_code != REVIEW_CODE
        or last is None
        or last.seq != answer.step
        or last.payload.get("decision") != "request_human_review"
    ):
        raise ReviewRefused("the run is not waiting for this review")
    output = ReviewAnswered(
        run_id=run.run_id,
        step=answer.step,
        answer=answer.answer,
        reviewer=answer.reviewer,
        reason=answer.reason,
    )
    observation = observation_of(output)
    await store.add_observation(
        conn,
        run,
        answer.step + 1,
        step=answer.step,
        output=msgspec.to_builtins(output),
        observation=observation,
    )
    steps.append(Step(seq=answer.step + 1, kind="observation", payload=observation))
    return run, steps, seen
