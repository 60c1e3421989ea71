"""`writ.int.planner.run`: where one run stands (ingress's `GET /runs/{run_id}` asks it).

400 undecodable, 404 no such run of the tenant (another tenant's run is not told apart from
one that does not exist), 500 a failure of the planner's own.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from nats.micro.request import Request

from schemas.api import EvidenceRef, RunEvents, RunView
from schemas.host import ActionResult, ErrorInfo
from schemas.reads import GetRun, GetRunEvents, ListReviews, PendingReview, PendingReviews
from services.planner.progress import step_recorded
from services.planner.store import PlannerStore, RunRow, Step

__all__ = ["ReviewsEndpoint", "RunEventsEndpoint", "RunStatusEndpoint", "run_view"]

log = logging.getLogger("writ.planner")


def run_view(run: Any, steps: list[Any]) -> RunView:
    """The host's view of a run row and its steps."""
    actions = [
        ActionResult(
            action=p["action"],
            operation_id=p["operation_id"],
            state=p["state"],
            receipt=p.get("receipt"),
            reason=p.get("reason"),
            outcome=p.get("outcome"),
            correlation_id=p.get("correlation_id"),
        )
        for s in steps
        if s.kind == "observation" and "operation_id" in (p := s.payload)
    ]
    error = (
        ErrorInfo(code=run.error_code, message=(run.error_message or "")[:512])
        if run.error_code
        else None
    )
    evidence = [
        EvidenceRef(
            document_id=str(e.get("document_id", ""))[:512],
            kind=str(e.get("kind", ""))[:512],
            title=str(e.get("title", ""))[:512],
        )
        for e in (run.evidence or [])[:16]
        if isinstance(e, dict)
    ]
    return RunView(
        run_id=run.run_id,
        request_id=run.request_id,
        status=run.status,
        agent=run.agent,
        answer=run.answer,
        error=error,
        actions=actions,
        pending_id=run.pending_id if run.status == "awaiting_human" else None,
        evidence=evidence,
        version=run.state_version,
        payload=None if run.expired is None else "expired",
    )


async def _tenant_run(
    store: PlannerStore, request: Request, tenant: str, run_id: str, what: str
) -> tuple[RunRow, list[Step]] | None:
    """The tenant's run and its steps, or None once the request was answered 404 (no such run
    for this tenant) or 500 (the store failed)."""
    try:
        async with store.acquire() as conn:
            run = await store.run(conn, run_id, fresh=True)
            steps = [] if run is None or run.tenant != tenant else await store.steps(conn, run_id)
    except Exception as exc:
        log.warning("%s failed: %r", what, exc)
        await request.respond_error("500", f"{what} failed")
        return None
    if run is None or run.tenant != tenant:
        await request.respond_error("404", "no such run")
        return None
    return run, steps


class RunStatusEndpoint:
    """Answers `GetRun` from the planner's own tables."""

    def __init__(self, *, store: PlannerStore) -> None:
        self._store = store
        self._decoder = msgspec.json.Decoder(GetRun)
        self._encoder = msgspec.json.Encoder()

    async def __call__(self, request: Request) -> None:
        """Answer one `GetRun`."""
        try:
            ask = self._decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid GetRun: {exc}"[:500])
            return
        found = await _tenant_run(self._store, request, ask.tenant, ask.run_id, "run status")
        if found is None:
            return
        run, steps = found
        await request.respond(self._encoder.encode(run_view(run, steps)))


class RunEventsEndpoint:
    """`writ.int.planner.events`: answers `GetRunEvents` with the steps after `after` (each
    as `StepRecorded`, the same summary the planner announces), from its own tables."""

    def __init__(self, *, store: PlannerStore) -> None:
        self._store = store
        self._decoder = msgspec.json.Decoder(GetRunEvents)
        self._encoder = msgspec.json.Encoder()

    async def __call__(self, request: Request) -> None:
        """Answer one `GetRunEvents`."""
        try:
            ask = self._decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid GetRunEvents: {exc}"[:500])
            return
        found = await _tenant_run(self._store, request, ask.tenant, ask.run_id, "run events")
        if found is None:
            return
        run, steps = found
        after = [step_recorded(run.tenant, run.run_id, s) for s in steps if s.seq > ask.after]
        await request.respond(
            self._encoder.encode(RunEvents(run=run_view(run, steps), steps=after))
        )


class ReviewsEndpoint:
    """`writ.int.planner.reviews`: answers `ListReviews` with the tenant's runs stopped at a
    review (the approval console's inbox), newest first."""

    def __init__(self, *, store: PlannerStore) -> None:
        self._store = store
        self._decoder = msgspec.json.Decoder(ListReviews)
        self._encoder = msgspec.json.Encoder()

    async def __call__(self, request: Request) -> None:
        """Answer one `ListReviews`."""
        try:
            ask = self._decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid ListReviews: {exc}"[:500])
            return
        try:
            rows = await self._store.pending_reviews(ask.tenant, ask.limit, ask.pending_id)
        except Exception as exc:
            log.warning("pending reviews failed: %r", exc)
            await request.respond_error("500", "pending reviews failed")
            return
        await request.respond(
            self._encoder.encode(
                PendingReviews(
                    reviews=[
                        PendingReview(
                            pending_id=r["pending_id"],
                            run_id=r["run_id"],
                            agent=r["agent"],
                            principal=r["principal"],
                            since=r["updated_at"].isoformat(),
                            prompt=r["prompt"][:2048],
                        )
                        for r in rows
                    ]
                )
            )
        )
