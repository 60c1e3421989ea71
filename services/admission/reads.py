"""Admission's read endpoints for ingress's HTTP door: a host command by its operation key
(`writ.int.admission.command`), the tenant's proposals (`writ.int.admission.proposals`) and one
proposal (`writ.int.admission.proposal`). Each is one statement on admission's own tables,
scoped to the tenant asked for: another tenant's key or id is not told apart from none.
400 undecodable, 404 none (saying what is missing), 500 a failure of admission's own."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Final

import asyncpg
import msgspec
from nats.micro.request import Request

from actions import ACTIONS
from actions.base import outcome_of
from libs.journal import WindowKeys
from libs.runtime import Endpoint
from schemas.host import CommandResult, ErrorInfo, ProposalView
from schemas.reads import (
    COMMAND_STATUS,
    PROPOSAL_GET,
    PROPOSALS_LIST,
    ApprovalGiven,
    GetCommand,
    GetProposal,
    ListProposals,
    ProposalDetail,
    Proposals,
)
from services.admission._rows import approvals_of
from services.admission._sealed import open_payload
from services.admission._statements import APPROVALS_OF

__all__ = ["AdmissionReads"]

log = logging.getLogger("writ.admission")
_COMMAND: Final = """
SELECT c.request_id, c.operation_id::text AS operation_id, c.state, c.receipt, c.reason
FROM admission.commands c WHERE c.tenant = $1 AND c.operation_key = $2"""
# A host command that waits for a person has a proposal and no command yet.
_WAITING: Final = """
SELECT p.request_id, p.public_id, p.action, coalesce(p.preview, '{}'::jsonb) AS preview,
       p.expires_at, p.state, p.reason, p.tenant, p.proposal_id::text AS proposal_id, p.sealed
FROM admission.proposals p WHERE p.tenant = $1 AND p.operation_key = $2
ORDER BY p.created_at DESC LIMIT 1"""
# A proposal's state as the API lists it: `executing` until its command has its outcome, then
# `completed` (the outcome says how, `unknown` included: reconciliation follows the command);
# `pending` past its expiry is `expired`, whether or not anyone tried to approve it since.
_STATE: Final = """CASE
    WHEN p.state = 'executing' AND c.state IN ('succeeded', 'failed', 'denied', 'expired',
                                               'revision_required', 'unknown') THEN 'completed'
    WHEN p.state = 'pending' AND p.expires_at <= now() THEN 'expired'
    ELSE p.state END"""
_PROPOSALS: Final = f"""
SELECT p.public_id, p.run_id, p.action, coalesce(p.preview, '{{}}'::jsonb) AS preview,
       encode(p.request_hash, 'hex') AS request_hash, {_STATE} AS state, p.expires_at,
       p.decision_id::text AS decision_id, p.reason, p.approved_by, p.approved_at,
       c.operation_id::text AS operation_id, c.state AS command_state, c.receipt,
       c.reason AS command_reason, p.principal, p.agent, p.created_at, p.facts,
       p.facts_read_at, p.decision_line,
       p.policy_version, p.tenant, p.proposal_id::text AS proposal_id, p.sealed,
       {APPROVALS_OF.format(proposal="p")} AS approvals
FROM admission.proposals p
LEFT JOIN admission.commands c ON c.tenant = p.tenant AND c.proposal_id = p.proposal_id
WHERE p.tenant = $1 AND p.public_id IS NOT NULL"""


# Why an approval no longer counts, in English words, by the code `approval_void` gives.
VOID_REASONS: Final = {"APPROVER_REVOKED": "the approver's access was revoked after they approved"}


def _detail(row: Any) -> ProposalDetail:
    preview = json.loads(row["preview"])
    given = approvals_of(row["approvals"])
    expired = row["expired"] is not None
    return ProposalDetail(
        proposal_id=row["public_id"],
        run_id=row["run_id"],
        action=row["action"],
        preview=preview,
        request_hash=row["request_hash"],
        state=row["state"],
        expires_at=row["expires_at"] and row["expires_at"].isoformat(),
        decision_id=row["decision_id"],
        reason=row["reason"],
        approved_by=row["approved_by"],
        approved_at=row["approved_at"] and row["approved_at"].isoformat(),
        operation_id=row["operation_id"],
        command_state=row["command_state"],
        receipt=row["receipt"],
        command_reason=row["command_reason"] and row["command_reason"][:512],
        requester=row["principal"],
        agent=row["agent"],
        created_at=row["created_at"].isoformat(),
        facts=None if row["facts"] is None else json.loads(row["facts"]),
        facts_read_at=row["facts_read_at"] and row["facts_read_at"].isoformat(),
        decision_line=row["decision_line"],
        policy_version=row["policy_version"],
        approvals=[a.approver for a in given if a.counts],
        approvals_given=[
            ApprovalGiven(
                approver=a.approver,
                approved_at=a.approved_at,
                counts=a.counts,
                code=a.void,
                reason=None if a.counts else VOID_REASONS.get(a.void or "", a.void),
            )
            for a in given
        ],
        approvals_needed=(
            contract.approvers_needed(preview)
            if (contract := ACTIONS.get(row["action"])) and not expired
            else 1
        ),
        payload="expired" if expired else None,
    )


def _cursor(raw: str | None) -> tuple[datetime, str] | None:
    """A page's cursor: (created_at, public id) of the last proposal before it. One that does
    not parse starts from the first page (it names no proposal anyway)."""
    if not raw or "|" not in raw:
        return None
    when, public_id = raw.split("|", 1)
    try:
        return datetime.fromisoformat(when), public_id
    except ValueError:
        return None


class AdmissionReads:
    """Answers ingress's reads from admission's tables."""

    def __init__(self, pool: asyncpg.Pool, *, keys: WindowKeys | None = None) -> None:
        self._pool, self._keys = pool, keys
        self._encoder = msgspec.json.Encoder()

    def endpoints(self) -> list[Endpoint]:
        """The three read endpoints, to serve with the process's micro service."""
        return [
            Endpoint(
                "command",
                COMMAND_STATUS,
                self._serve(GetCommand, self.command, "no command under this operation id"),
            ),
            Endpoint(
                "proposals",
                PROPOSALS_LIST,
                self._serve(ListProposals, self.list, "no proposals to list"),
            ),
            Endpoint(
                "proposal",
                PROPOSAL_GET,
                self._serve(GetProposal, self.proposal, "no such proposal"),
            ),
        ]

    def _serve(
        self, kind: type[Any], answer: Callable[[Any], Awaitable[Any]], missing: str
    ) -> Callable[[Request], Awaitable[None]]:
        decoder = msgspec.json.Decoder(kind)

        async def serve(request: Request) -> None:
            try:
                ask = decoder.decode(request.data)
            except msgspec.DecodeError as exc:
                await request.respond_error("400", f"invalid {kind.__name__}: {exc}"[:500])
                return
            try:
                reply = await answer(ask)
            except Exception as exc:
                log.warning("%s failed: %r", kind.__name__, exc)
                await request.respond_error("500", f"{kind.__name__} failed")
                return
            if reply is None:
                await request.respond_error("404", missing)
                return
            await request.respond(self._encoder.encode(reply))

        return serve

    async def command(self, ask: GetCommand) -> CommandResult | None:
        """The recorded state of the host's command under its key."""
        row = await self._pool.fetchrow(_COMMAND, ask.tenant, ask.operation_key)
        if row is not None:
            return _command_result(row, ask.operation_key)
        found = await self._pool.fetchrow(_WAITING, ask.tenant, ask.operation_key)
        if found is None:
            return None
        row = dict(found)
        await open_payload(self._pool, self._keys, [row])
        if row["state"] == "pending":
            return CommandResult(
                request_id=row["request_id"] or "",
                operation_key=ask.operation_key,
                status="awaiting_human",
                pending_id=row["public_id"],
                proposal=ProposalView(
                    proposal_id=row["public_id"],
                    action=row["action"],
                    preview=json.loads(row["preview"]),
                    expires_at=row["expires_at"] and row["expires_at"].isoformat() or "",
                    payload=None if row["expired"] is None else "expired",
                ),
            )
        return CommandResult(
            request_id=row["request_id"] or "",
            operation_key=ask.operation_key,
            status="rejected",
            error=ErrorInfo(code="REJECTED", message=(row["reason"] or row["state"])[:512]),
        )

    async def list(self, ask: ListProposals) -> Proposals:
        """The tenant's proposals, newest first, a page at a time, and how many match."""
        where = ""
        args: list[object] = [ask.tenant]
        decision: uuid.UUID | None = None
        if ask.decision_id is not None:
            try:
                decision = uuid.UUID(ask.decision_id)
            except ValueError:
                return Proposals(proposals=[], total=0)  # no decision has such an id
        for value, condition in (
            (decision, "p.decision_id"),
            (ask.state, _STATE),
            (ask.run_id, "p.run_id"),
            (ask.action, "p.action"),
            (ask.agent, "p.agent"),
            (ask.requester, "p.principal"),
        ):
            if value is not None:
                args.append(value)
                where += f" AND {condition} = ${len(args)}"
        if ask.older_than_s is not None:
            args.append(ask.older_than_s)
            where += f" AND p.created_at <= now() - make_interval(secs => ${len(args)})"
        total = await self._pool.fetchval(
            f"SELECT count(*) FROM ({_PROPOSALS}{where}) AS matching", *args
        )
        after = _cursor(ask.cursor)
        if after is not None:
            args += list(after)
            where += f" AND (p.created_at, p.public_id) < (${len(args) - 1}, ${len(args)})"
        rows = await self._pool.fetch(
            f"{_PROPOSALS}{where} ORDER BY p.created_at DESC, p.public_id DESC "
            f"LIMIT {int(ask.limit) + 1}",
            *args,
        )
        page, more = [dict(r) for r in rows[: ask.limit]], len(rows) > ask.limit
        await open_payload(self._pool, self._keys, page)
        last = page[-1] if page and more else None
        return Proposals(
            proposals=[_detail(r) for r in page],
            total=total,
            next_cursor=None
            if last is None
            else f"{last['created_at'].isoformat()}|{last['public_id']}",
        )

    async def proposal(self, ask: GetProposal) -> ProposalDetail | None:
        """One proposal by its public id."""
        found = await self._pool.fetchrow(
            _PROPOSALS + " AND p.public_id = $2", ask.tenant, ask.proposal_id
        )
        if found is None:
            return None
        row = dict(found)
        await open_payload(self._pool, self._keys, [row])
        return _detail(row)


def _command_result(row: asyncpg.Record, operation_key: str) -> CommandResult:
    """A recorded command as the host was told of it when it ended: its state, receipt, error,
    and the outcome (what may be done next), classified as `_answer_host` classifies it."""
    state, reason, operation_id = row["state"], row["reason"], row["operation_id"]
    outcome = None
    if operation_id is not None:
        outcome = outcome_of(
            state, receipt=row["receipt"], reason=reason, operation_id=operation_id
        )
        if outcome.kind == "terminal_failure":
            reason = outcome.detail  # a correlation id, never the provider's words
    error = None
    if state not in ("succeeded", "pending", "dispatching"):
        error = ErrorInfo(code=state.upper(), message=(reason or state)[:512])
    return CommandResult(
        request_id=row["request_id"] or "",
        operation_key=operation_key,
        status=state,
        operation_id=operation_id,
        receipt=row["receipt"],
        error=error,
        outcome=outcome.kind if outcome else None,
        correlation_id=outcome.correlation_id if outcome else None,
    )
