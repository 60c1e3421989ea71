"""A run's timeline as Server-Sent Events, and the operators' reconciliation routes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Final

import anyio
import msgspec
from litestar import Request, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage

from schemas import subjects
from schemas.api import ResolveBody, RunEvents
from schemas.dispatcher import ListUnknown, Reconcile, Reconciled, UnknownCommands
from schemas.reads import RUN_EVENTS, GetRunEvents
from services.ingress.http._api import Api
from services.ingress.http._problems import (
    ApiError,
    IdempotencyKey,
    LastEventId,
    event_id,
    problems,
)
from services.ingress.http._wait import FINAL_RUN, run_result
from services.ingress.logic import APPROVER_ROLE

__all__ = ["ops_handlers"]

_ENCODER: Final = msgspec.json.Encoder()
_AUTH: Final = "UNAUTHENTICATED, BAD_SIGNATURE, TOKEN_EXPIRED, ..."


def ops_handlers(
    api: Api, *, poll_s: float = 0.25, keepalive_s: float = 15.0, start_grace_s: float = 5.0
) -> list[HTTPRouteHandler]:
    """The timeline and reconciliation routes over `api`."""

    @get(
        "/runs/{run_id:str}/events",
        summary="A run's timeline (Server-Sent Events)",
        tags=["runs"],
        media_type="text/event-stream",
        responses=problems(s401=_AUTH, s404="NOT_FOUND: no such run of the tenant"),
    )
    async def events(
        request: Request[Any, Any, Any],
        run_id: FromPath[str],
        last_event_id: LastEventId = None,
        after: Annotated[int | None, QueryParameter(ge=-1)] = None,
    ) -> ServerSentEvent:
        """Each committed step as `event: step` with `id:` its sequence (`StepRecorded`), then
        `event: result` (the `RunResult`) once the run has one. `Last-Event-ID` (or `after`)
        resumes right after that step: no gap, no duplicate."""
        caller = api.caller(request)
        resumed = event_id(last_event_id, least=-1)
        start = resumed if resumed is not None else (-1 if after is None else after)
        first: RunEvents | None = None
        ask = GetRunEvents(tenant=caller.tenant, run_id=run_id, after=start)
        # A run started a moment ago may not be the planner's yet: give it a few seconds.
        with anyio.move_on_after(start_grace_s):
            while True:
                try:
                    first = await api.ask(RUN_EVENTS, ask, RunEvents)
                    break
                except ApiError as exc:
                    if exc.code != "NOT_FOUND":
                        raise
                await anyio.sleep(poll_s)
        if first is None:
            raise ApiError("NOT_FOUND", "no such run")

        async def stream() -> AsyncIterator[ServerSentEventMessage]:
            seen, batch, quiet = start, first, 0.0
            async with api.results.watch(caller.tenant, run_id) as waiter:
                while True:
                    for step in batch.steps:
                        if step.seq > seen:
                            seen = step.seq
                            yield ServerSentEventMessage(
                                data=_ENCODER.encode(step).decode(), event="step", id=step.seq
                            )
                    if batch.run.status in FINAL_RUN:
                        yield ServerSentEventMessage(
                            data=_ENCODER.encode(run_result(batch.run)).decode(), event="result"
                        )
                        return
                    got = await waiter.next(poll_s)  # a result wakes it at once
                    if waiter.closing:  # stopping: the client resumes from the last id
                        return
                    quiet = 0.0 if batch.steps or got is not None else quiet + poll_s
                    if quiet >= keepalive_s:
                        quiet = 0.0
                        yield ServerSentEventMessage(comment="keep-alive")
                    batch = await api.ask(
                        RUN_EVENTS,
                        GetRunEvents(tenant=caller.tenant, run_id=run_id, after=seen),
                        RunEvents,
                    )

        return ServerSentEvent(stream(), headers={"Cache-Control": "no-store"})

    @get(
        "/reconciliation",
        summary="Commands whose outcome nobody knows",
        tags=["operations"],
        responses=problems(s401=_AUTH, s403="FORBIDDEN: the approver role is missing"),
    )
    async def unknown(request: Request[Any, Any, Any]) -> UnknownCommands:
        """The tenant's commands in `unknown` (the dispatcher's), waiting for an operator."""
        caller = api.caller(request, role=APPROVER_ROLE)
        return await api.ask(
            subjects.UNKNOWN_LIST, ListUnknown(tenant=caller.tenant), UnknownCommands
        )

    @post(
        "/reconciliation/{operation_id:str}/resolve",
        status_code=200,
        tags=["operations"],
        summary="Record what an operator established about an unknown command",
        responses=problems(
            s400="INVALID_REQUEST",
            s401=_AUTH,
            s403="FORBIDDEN: the approver role is missing",
            s404="NOT_FOUND: no command under this operation id",
            s409="CONFLICT: the Idempotency-Key was used with another body",
        ),
    )
    async def resolve(
        request: Request[Any, Any, Any],
        operation_id: FromPath[str],
        data: JSONBody[ResolveBody],
        idempotency_key: IdempotencyKey,
    ) -> Reconciled:
        """The command keeps its operation id whatever is decided (`Reconciled`)."""
        caller = api.caller(request, role=APPROVER_ROLE)
        try:
            uuid.UUID(operation_id)
        except ValueError:  # operation ids are UUIDs: nothing to ask the dispatcher about
            raise ApiError("NOT_FOUND", "no command under this operation id") from None

        async def answer() -> tuple[int, msgspec.Struct]:
            return 200, await api.ask(
                subjects.RECONCILE,
                Reconcile(
                    tenant=caller.tenant,
                    operation_id=operation_id,
                    state=data.state,
                    evidence=data.evidence,
                    resolved_by=caller.principal,
                    receipt=data.receipt,
                ),
                Reconciled,
                timeout=15.0,
            )

        return await api.write(
            request,
            caller=caller,
            body=data,  # type: ignore[return-value]
            answer=answer,
        )

    return [events, unknown, resolve]
