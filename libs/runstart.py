"""Starting a run: what ingress does for a host's request and the planner for a chat turn.

Two request/replies at once: governance registers the run (what only a verified host may say
about it, and its budget) and retrieval searches the tenant's documents for its evidence. Then
one durable message hands the run to the planner: `EvidenceGathered` on
`writ.int.evidence.<tenant>` with `Nats-Msg-Id` `evidence:<run id>`, so a start that is retried
(its delivery redelivered after a crash or an outage) is a duplicate, never a second run.

The run's identity (tenant, principal, agent, attended) goes from the starter to the planner
directly; retrieval, which reads untrusted content, answers with the evidence only and cannot
publish a run's start (its NATS user may not).
"""

from __future__ import annotations

from typing import Final

import anyio
import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from libs.bus import publish
from libs.deadline import timed_request
from libs.errors import RetryableError, single_error
from schemas import subjects
from schemas.governance import RegisterRun, RegisterTurn
from schemas.retrieval import Evidence, EvidenceFound, EvidenceGathered, SearchEvidence

__all__ = ["start_run"]

DEFAULT_TIMEOUT_S: Final = 2.0
_FOUND: Final = msgspec.json.Decoder(EvidenceFound)


async def _ask(
    nc: Client, subject: str, body: msgspec.Struct, *, what: str, timeout: float
) -> bytes:
    try:
        reply = await timed_request(nc, subject, msgspec.json.encode(body), timeout=timeout)
    except (NatsTimeoutError, NoRespondersError) as exc:
        raise RetryableError(f"{what}: no answer ({exc!r})") from exc
    if reply.headers and (code := reply.headers.get("Nats-Service-Error-Code")):
        raise RetryableError(f"{what}: {code} {reply.headers.get('Nats-Service-Error', '')}")
    return reply.data


async def _search(
    nc: Client, *, tenant: str, run_id: str, text: str, timeout: float = DEFAULT_TIMEOUT_S
) -> list[Evidence]:
    """The evidence retrieval finds for a starting run.

    Raises:
        RetryableError: retrieval did not answer, or could not search now.
    """
    data = await _ask(
        nc,
        subjects.SEARCH,
        SearchEvidence(tenant=tenant, run_id=run_id, input=text),
        what=f"retrieval did not search for run {run_id}",
        timeout=timeout,
    )
    try:
        found = _FOUND.decode(data)
    except msgspec.DecodeError as exc:
        raise RetryableError(f"retrieval's evidence for run {run_id} is unreadable: {exc}") from exc
    if found.run_id != run_id:
        raise RetryableError(f"retrieval answered for run {found.run_id}, not {run_id}")
    return found.evidence


async def start_run(
    nc: Client,
    js: JetStreamContext,
    run: RegisterRun | RegisterTurn,
    *,
    request_id: str,
    text: str,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Register `run` with governance and find its evidence (both at once), then hand it to
    the planner. Idempotent: a run started again registers as before and publishes a
    duplicate.

    Raises:
        RetryableError: governance or retrieval did not answer (nothing was handed on).
    """
    evidence: list[Evidence] = []

    async def find() -> None:
        evidence.extend(
            await _search(nc, tenant=run.tenant, run_id=run.run_id, text=text, timeout=timeout)
        )

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(find)
            await _ask(
                nc,
                # Ingress registers a host's run, the planner a chat turn: each may publish
                # only its own subject, and only a host's run carries grants.
                subjects.REGISTER_RUN if isinstance(run, RegisterRun) else subjects.REGISTER_TURN,
                run,
                what=f"governance did not register run {run.run_id}",
                timeout=timeout,
            )
    except BaseExceptionGroup as group:  # the error itself: callers retry by its class
        raise single_error(group) from None
    await publish(
        js,
        subjects.evidence(run.tenant),
        EvidenceGathered(
            run_id=run.run_id,
            request_id=request_id,
            tenant=run.tenant,
            principal=run.principal,
            agent=run.agent,
            input=text,
            evidence=evidence,
            attended=run.attended,
        ),
        msg_id=f"evidence:{run.run_id}",
    )
