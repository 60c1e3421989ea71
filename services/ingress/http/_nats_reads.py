"""The HTTP API's reads for hosts on NATS (`schemas.host_reads`): the same token check, the
same roles and the same questions to the owning services, answered by request/reply."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from nats.micro.request import Request

from libs.runtime import Endpoint
from schemas import subjects
from schemas.api import RunEvents, RunView
from schemas.governance import ListPending, PendingDecisions
from schemas.host import CommandResult
from schemas.host_reads import HOST_READS, HostRead, host_read
from schemas.planner import ReplayReport, ReplayRun
from schemas.reads import (
    COMMAND_STATUS,
    PROPOSAL_GET,
    PROPOSALS_LIST,
    RUN_EVENTS,
    RUN_STATUS,
    GetCommand,
    GetProposal,
    GetRun,
    GetRunEvents,
    ListProposals,
    ProposalDetail,
    Proposals,
)
from services.ingress.http._api import Api
from services.ingress.http._problems import STATUS, ApiError
from services.ingress.http._wait import wait_news
from services.ingress.logic import APPROVER_ROLE, AUDITOR_ROLE, Rejection

__all__ = ["nats_read_endpoints"]

log = logging.getLogger("writ.ingress")
_DECODER: Final = msgspec.json.Decoder(HostRead)
_ENCODER: Final = msgspec.json.Encoder()
# The role each read needs, as over HTTP.
_ROLES: Final = {
    "pending": APPROVER_ROLE,
    "proposals": APPROVER_ROLE,
    "proposal": APPROVER_ROLE,
    "replay": AUDITOR_ROLE,
}


def _need(value: str | None, name: str) -> str:
    if not value:
        raise ApiError("INVALID_REQUEST", f"this read needs `{name}`")
    return value


async def _answer(api: Api, read: str, tenant: str, ask: HostRead) -> msgspec.Struct:
    checked = api.door.check_token(ask.token, tenant=tenant)
    if isinstance(checked, Rejection):
        raise ApiError(checked.code, checked.message)
    role = _ROLES.get(read)
    if role is not None and role not in checked[1]:
        raise ApiError("FORBIDDEN", f"this needs the {role} role")
    if read == "run":
        return await api.ask(
            RUN_STATUS, GetRun(tenant=tenant, run_id=_need(ask.run_id, "run_id")), RunView
        )
    if read == "wait":
        got = await wait_news(
            api, tenant, _need(ask.run_id, "run_id"), after=ask.after, timeout_s=ask.timeout_s
        )
        if isinstance(got, RunView):
            raise ApiError(
                "TIMEOUT",
                f"no result newer than version {ask.after} within {ask.timeout_s:g} s; "
                f"the run is {got.status} at version {got.version}",
            )
        return got
    if read == "events":
        return await api.ask(
            RUN_EVENTS,
            GetRunEvents(tenant=tenant, run_id=_need(ask.run_id, "run_id"), after=ask.after),
            RunEvents,
        )
    if read == "command":
        return await api.ask(
            COMMAND_STATUS,
            GetCommand(tenant=tenant, operation_key=_need(ask.operation_key, "operation_key")),
            CommandResult,
        )
    # A page as the HTTP door's lists give it: `limit` after `cursor`, filtered alike.
    paged: dict[str, Any] = {"cursor": ask.cursor, "agent": ask.agent}
    if ask.limit is not None:
        paged["limit"] = ask.limit
    if read == "pending":
        return await api.ask(
            subjects.PENDING_LIST,
            ListPending(tenant=tenant, principal=ask.requester, **paged),
            PendingDecisions,
        )
    if read == "proposals":
        return await api.ask(
            PROPOSALS_LIST,
            ListProposals(tenant=tenant, state=ask.state, requester=ask.requester, **paged),
            Proposals,
        )
    if read == "proposal":
        return await api.ask(
            PROPOSAL_GET,
            GetProposal(tenant=tenant, proposal_id=_need(ask.proposal_id, "proposal_id")),
            ProposalDetail,
        )
    return await api.ask(
        subjects.REPLAY,
        ReplayRun(tenant=tenant, run_id=_need(ask.run_id, "run_id")),
        ReplayReport,
        timeout=30.0,
    )


async def answer_host(
    request: Request, what: str, answer: Callable[[str], Awaitable[bytes]]
) -> None:
    """Answer a host's request on `writ.api.<tenant>.*` with what `answer(tenant)` encodes,
    or with its error as the HTTP door would say it: 400 undecodable, the ApiError's status
    and code, 500 for anything else (logged, never shown)."""
    try:
        encoded = await answer(request.subject.split(".")[2])
    except msgspec.DecodeError as exc:
        await request.respond_error("400", f"INVALID_REQUEST: {exc}"[:500])
    except ApiError as exc:
        await request.respond_error(
            str(STATUS.get(exc.code, 400)), f"{exc.code}: {exc.detail}"[:500]
        )
    except Exception as exc:
        log.warning("host %s failed: %r", what, exc)
        await request.respond_error("500", f"INTERNAL: the {what.split()[0]} failed")
    else:
        await request.respond(encoded)


def nats_read_endpoints(api: Api) -> list[Endpoint]:
    """One micro endpoint per read, on `writ.api.*.<read>`."""

    def serve(read: str) -> Any:
        async def handle(request: Request) -> None:
            async def answer(tenant: str) -> bytes:
                return _ENCODER.encode(
                    await _answer(api, read, tenant, _DECODER.decode(request.data))
                )

            await answer_host(request, f"read {read}", answer)

        return handle

    return [
        Endpoint(f"read_{read}", host_read("*", read), serve(read), concurrency=32)
        for read in HOST_READS
    ]
