"""What the planner says of a run's steps as they are committed, for whoever watches the bus
(`writ run`'s timeline, an operator's `nats sub`): `StepRecorded` on core NATS
`writ.events.planner.<tenant>`, published after the step's transaction committed.

Progress only: nothing consumes it to decide anything, nothing stores it (no stream captures
`writ.events.>`), and a publish that fails changes nothing in the run. It names what happened —
the decision and its target, the critic's verdict, a summary of an observation — never the
model's input, the arguments or the untrusted content a read returned.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from nats.aio.client import Client

from schemas import subjects
from schemas.planner import StepRecorded
from services.planner.store import RunRow, Step

__all__ = ["announce", "step_recorded"]

log = logging.getLogger("writ.planner")
_ENCODER = msgspec.json.Encoder()


def _summary(payload: dict[str, Any]) -> str:
    if "tool" in payload:
        if payload.get("executed"):
            # How many, never which: a title is the documents' content.
            return f"{len(payload.get('items', []))} items from {payload['tool']}, untrusted"
        return f"{payload['tool']} not read: {payload.get('refused')}"
    if "operation_id" in payload:
        return f"{payload.get('action')} {payload.get('state')} (outcome {payload.get('outcome')})"
    if "target" in payload:
        return f"{payload['target']} refused before any handler: {payload.get('refused')}"
    if "critic" in payload:
        return "the critic asked for a replan"
    if "review" in payload:
        return f"review {payload['review']} by {payload.get('reviewer')}"
    if "refused" in payload:
        return f"{payload.get('action')} refused: {payload['refused']}"
    return ""


def step_recorded(tenant: str, run_id: str, step: Step) -> StepRecorded:
    """The announcement of one committed step."""
    payload = step.payload
    if step.kind == "decision":
        target = payload.get("capability")
        return StepRecorded(
            tenant=tenant,
            run_id=run_id,
            seq=step.seq,
            kind=step.kind,
            decision=str(payload.get("decision", ""))[:512],
            target=None if target is None else str(target)[:512],
        )
    if step.kind == "critic":
        return StepRecorded(
            tenant=tenant,
            run_id=run_id,
            seq=step.seq,
            kind=step.kind,
            verdict=str(payload.get("verdict", ""))[:512],
        )
    return StepRecorded(
        tenant=tenant, run_id=run_id, seq=step.seq, kind=step.kind, summary=_summary(payload)[:512]
    )


async def announce(nc: Client, run: RunRow, steps: list[Step]) -> None:
    """Announce committed steps on core NATS; progress only, so a failed publish is logged and
    changes nothing."""
    for step in steps:
        try:
            await nc.publish(
                subjects.planner_progress(run.tenant),
                _ENCODER.encode(step_recorded(run.tenant, run.run_id, step)),
            )
        except Exception as exc:
            log.debug("run %s: step %d not announced: %r", run.run_id, step.seq, exc)
