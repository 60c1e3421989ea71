"""`/runs` and `/commands`: what a host asks for, and where it stands."""

from __future__ import annotations

import time
from typing import Annotated, Any, Final

import msgspec
from litestar import Request, Response, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, JSONBody, QueryParameter

from schemas.api import CommandBody, RunAccepted, RunView, StartRun
from schemas.control import CancelRun
from schemas.host import (
    CommandResult,
    RunRequest,
    RunResult,
    SubmitCommand,
)
from schemas.reads import (
    COMMAND_STATUS,
    GetCommand,
)
from services.ingress.http._api import Api
from services.ingress.http._problems import ApiError, IdempotencyKey, problems
from services.ingress.http._wait import run_view, wait_news
from services.ingress.logic import Verified

__all__ = ["run_handlers"]

_ENCODER: Final = msgspec.json.Encoder()
_ERRORS: Final = problems(
    s400="INVALID_REQUEST: undecodable, an unknown field, a bound exceeded",
    s401="UNAUTHENTICATED, UNKNOWN_TENANT, BAD_SIGNATURE, TOKEN_EXPIRED or INVALID_TOKEN",
    s403="WRONG_TENANT or FORBIDDEN (a role is missing)",
    s409="CONFLICT: the Idempotency-Key was used with another body",
    s413="TOO_LARGE: refused before it was read whole",
)


class _NoBody(msgspec.Struct, frozen=True):
    """A POST without a body: its route alone is its fingerprint."""


_NO_BODY: Final = _NoBody()


def _json(value: msgspec.Struct, status: int = 200) -> Response[Any]:
    return Response(_ENCODER.encode(value), status_code=status, media_type="application/json")


def run_handlers(api: Api, *, answer_timeout_s: float = 30.0) -> list[HTTPRouteHandler]:
    """The run and command routes over `api`."""

    @post("/runs", status_code=202, summary="Start a run", tags=["runs"], responses=_ERRORS)
    async def start_run(
        request: Request[Any, Any, Any], data: JSONBody[StartRun], idempotency_key: IdempotencyKey
    ) -> Response[RunAccepted]:
        """A `RunRequest` without its token: `202` with the run's id and where to follow it."""

        def build(request_id: str, token: str) -> RunRequest:
            return RunRequest(
                request_id=request_id,
                token=token,
                agent=data.agent,
                input=data.input,
                attended=data.attended,
                grants=data.grants,
                budget=data.budget,
            )

        async def answer(outcome: Verified) -> tuple[int, msgspec.Struct]:
            await api.door.hand_on(outcome)
            base = f"/api/v1/runs/{outcome.run_id}"
            return 202, RunAccepted(
                run_id=outcome.run_id,
                request_id=outcome.request.request_id,
                links={
                    "self": base,
                    "wait": f"{base}/wait",
                    "events": f"{base}/events",
                    "cancel": f"{base}/cancel",
                },
            )

        return await api.post(request, kind="requests", body=data, build=build, answer=answer)

    @get(
        "/runs/{run_id:str}",
        summary="Where a run stands",
        tags=["runs"],
        responses=problems(
            s401="UNAUTHENTICATED, BAD_SIGNATURE, TOKEN_EXPIRED, ...",
            s404="NOT_FOUND: no such run of the tenant (or not started yet)",
        ),
    )
    async def get_run(request: Request[Any, Any, Any], run_id: FromPath[str]) -> RunView:
        """Status, answer, actions and their outcomes, from the planner."""
        caller = api.caller(request)
        return await run_view(api, caller.tenant, run_id)

    @get(
        "/runs/{run_id:str}/wait",
        summary="Wait for news of a run",
        tags=["runs"],
        responses={
            202: ResponseSpec(RunView, description="No result newer than `after` within timeout_s"),
            **problems(
                s400="INVALID_REQUEST: `after` or `timeout_s` out of bounds",
                s401="UNAUTHENTICATED, BAD_SIGNATURE, TOKEN_EXPIRED, ...",
                s404="NOT_FOUND",
            ),
        },
    )
    async def wait_run(
        request: Request[Any, Any, Any],
        run_id: FromPath[str],
        timeout_s: Annotated[float, QueryParameter(ge=0, le=60)] = 30.0,
        after: Annotated[int, QueryParameter(ge=-1, le=2**53)] = -1,
    ) -> RunResult:
        """Long-poll for the run's `RunResult` (`awaiting_human` counts: the run stopped)
        whose `version` is above `after` (the version of the last result the caller saw;
        omitted: any result). Until `timeout_s` ran out: `202` with the run as it stands."""
        caller = api.caller(request)
        got = await wait_news(api, caller.tenant, run_id, after=after, timeout_s=timeout_s)
        if isinstance(got, RunView):
            return _json(got, 202)  # type: ignore[return-value]
        return got

    @post(
        "/commands",
        status_code=200,
        summary="Do exactly this, under my operation key",
        tags=["commands"],
        responses={**_ERRORS, **problems(s504="TIMEOUT: ask again, same Idempotency-Key")},
    )
    async def submit_command(
        request: Request[Any, Any, Any],
        data: JSONBody[CommandBody],
        idempotency_key: IdempotencyKey,
    ) -> CommandResult:
        """A `SubmitCommand` without its token: its `CommandResult` once it is decided."""

        def build(request_id: str, token: str) -> SubmitCommand:
            return SubmitCommand(
                request_id=request_id,
                token=token,
                agent=data.agent,
                operation_key=data.operation_key,
                action=data.action,
                arguments=data.arguments,
                expected_revision=data.expected_revision,
            )

        async def answer(outcome: Verified) -> tuple[int, msgspec.Struct]:
            request_id = outcome.request.request_id
            async with api.results.watch(outcome.tenant, request_id) as waiter:
                await api.door.hand_on(outcome)
                deadline = time.monotonic() + answer_timeout_s
                while (remaining := deadline - time.monotonic()) > 0 and not waiter.closing:
                    got = await waiter.next(remaining)
                    if isinstance(got, CommandResult) and got.status not in (
                        "pending",
                        "dispatching",
                    ):
                        return 200, got
            # No result came: a retry whose first try's result was published already (the
            # hand-on was a duplicate), a slow command, or this process is stopping.
            # Admission knows where it stands.
            try:
                known = await api.ask(
                    COMMAND_STATUS,
                    GetCommand(tenant=outcome.tenant, operation_key=data.operation_key),
                    CommandResult,
                )
            except ApiError:
                known = None
            if known is not None and known.status not in ("pending", "dispatching"):
                return 200, known
            raise ApiError(
                "TIMEOUT",
                "the command's result did not come in time; ask again "
                "with the same Idempotency-Key",
            )

        return await api.post(request, kind="commands", body=data, build=build, answer=answer)  # type: ignore[return-value]

    @post(
        "/runs/{run_id:str}/cancel",
        status_code=202,
        summary="Cancel a run",
        tags=["runs"],
        responses=_ERRORS,
    )
    async def cancel_run(
        request: Request[Any, Any, Any], run_id: FromPath[str], idempotency_key: IdempotencyKey
    ) -> Response[RunAccepted]:
        """Idempotent, accepted even while the run is being started: nothing more is
        scheduled, an admitted command runs to its outcome, the run ends `cancelled` (its
        `RunResult` through `wait`, and on the host's results stream)."""

        def build(request_id: str, token: str) -> CancelRun:
            return CancelRun(request_id=request_id, token=token, run_id=run_id)

        async def answer(outcome: Verified) -> tuple[int, msgspec.Struct]:
            await api.door.hand_on(outcome)
            base = f"/api/v1/runs/{run_id}"
            return 202, RunAccepted(
                run_id=run_id,
                request_id=outcome.request.request_id,
                links={"self": base, "wait": f"{base}/wait"},
            )

        return await api.post(request, kind="cancels", body=_NO_BODY, build=build, answer=answer)

    @get(
        "/commands/{operation_key:str}",
        summary="What became of my command",
        tags=["commands"],
        responses=problems(
            s401="UNAUTHENTICATED, BAD_SIGNATURE, TOKEN_EXPIRED, ...",
            s404="NOT_FOUND: no command of the tenant under this key",
        ),
    )
    async def get_command(
        request: Request[Any, Any, Any], operation_key: FromPath[str]
    ) -> CommandResult:
        """The recorded state of the host's command under its operation key (admission's)."""
        caller = api.caller(request)
        return await api.ask(
            COMMAND_STATUS,
            GetCommand(tenant=caller.tenant, operation_key=operation_key),
            CommandResult,
        )

    return [start_run, get_run, wait_run, cancel_run, submit_command, get_command]
