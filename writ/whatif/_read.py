"""What `writ policy whatif` reads and writes: sealed journal entries, and one report row.

Decisions come from governance's journal, amounts from admission's (a proposal's and an
admitted command's frozen arguments), both read with an auditor's read-only DSN and the
services' data keys, sealed entries only: what is not in the verified chain is not evidence.

The report's digest is journaled the way `writ eval record` journals an evaluation's: as the
eval role, through the one function it may call, into the planner's journal (kind
`eval.report`, subject `policy-whatif`), where the planner's sealer chains and signs it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

import asyncpg
import msgspec

from libs.journal import EXPIRED_TEXT, Journal, read_entries
from writ.whatif._redecide import Amount, JournaledDecision, Report

__all__ = ["SUBJECT", "journaled_window", "record_report", "sealed_report"]

SUBJECT: Final = "policy-whatif"
_KIND: Final = "eval.report"  # the one kind the eval role's function writes


def _amount(payload: dict[str, Any], operation: str) -> Amount | None:
    arguments = payload.get("arguments")
    if not isinstance(arguments, dict):
        return None
    cents, currency = arguments.get("amount_cents"), arguments.get("currency")
    if type(cents) is not int or not isinstance(currency, str):
        return None
    return Amount(operation=operation, amount_cents=cents, currency=currency)


async def journaled_window(
    conn: asyncpg.Connection,
    governance: Journal,
    admission: Journal,
    *,
    tenant: str,
    since: datetime,
    until: datetime,
    not_evaluable: list[str] | None = None,
) -> tuple[list[JournaledDecision], dict[str, Amount]]:
    """The tenant's sealed decisions recorded in [since, until), in chain order, and the
    amounts of those made on a proposal, by decision id.

    A decision whose payload expired (its window key destroyed), or whose proposal's arguments
    did, cannot be ruled again: it is left out and named in `not_evaluable` (decision id and
    window), and the rest of the window is read."""
    gone: list[Mapping[str, Any]] = []
    decisions = [
        msgspec.json.decode(plaintext, type=JournaledDecision)
        for _, row, plaintext in await read_entries(conn, governance, tenant=tenant, expired=gone)
        if row["kind"] == "decision" and since <= row["recorded_at"] < until
    ]
    lost = not_evaluable if not_evaluable is not None else []
    lost.extend(
        f"{row['subject']}: {EXPIRED_TEXT} (window {row['key_id']})"
        for row in gone
        if row["kind"] == "decision" and since <= row["recorded_at"] < until
    )
    # Runs whose proposals' or commands' arguments expired: their amounts are unknown.
    unpriced: dict[str, str] = {}
    admitted_gone: list[Mapping[str, Any]] = []
    by_proposal: dict[str, Amount] = {}
    by_decision: dict[str, Amount] = {}  # an admitted command's, by the decision it stood on
    admission_rows = await read_entries(conn, admission, tenant=tenant, expired=admitted_gone)
    for row in admitted_gone:
        if row["kind"].startswith("proposal.") or row["kind"] == "command.admitted":
            unpriced.setdefault(row["run_id"], row["key_id"])
    for _, row, plaintext in admission_rows:
        kind = row["kind"]
        if not (kind.startswith("proposal.") or kind == "command.admitted"):
            continue
        payload = json.loads(plaintext)
        proposal_id = payload.get("proposal_id")
        if not isinstance(proposal_id, str):
            continue
        if kind == "proposal.approved":
            # Approved: no arguments of its own, but the operation it became and the answer
            # (decision) the dispatcher's re-check stands on.
            known, operation = by_proposal.get(proposal_id), payload.get("operation_id")
            if known is not None and isinstance(operation, str):
                known = msgspec.structs.replace(known, operation=operation)
                by_proposal[proposal_id] = known
                if isinstance(payload.get("decision_id"), str):
                    by_decision[payload["decision_id"]] = known
            continue
        admitted = kind == "command.admitted"
        operation = payload.get("operation_id" if admitted else "public_id")
        amount = _amount(payload, str(operation))
        if amount is not None and (admitted or proposal_id not in by_proposal):
            by_proposal[proposal_id] = amount  # an admitted command names its operation
        if amount is not None and admitted and isinstance(payload.get("decision_id"), str):
            by_decision[payload["decision_id"]] = amount
    amounts: dict[str, Amount] = {}
    kept: list[JournaledDecision] = []
    for d in decisions:
        priced = d.decision_id in amounts or (
            d.proposal_id is not None and d.proposal_id in by_proposal
        )
        asks = d.proposal_id is not None or d.approval_id is not None
        if asks and not priced and d.run_id in unpriced:
            lost.append(
                f"{d.decision_id}: {EXPIRED_TEXT} (its proposal's arguments, window "
                f"{unpriced[d.run_id]})"
            )
            continue
        kept.append(d)
    decisions = kept
    for d in decisions:
        if d.proposal_id is not None and d.proposal_id in by_proposal:
            amounts[d.decision_id] = by_proposal[d.proposal_id]
        elif d.approval_id is not None and d.approval_id in by_decision:
            amounts[d.decision_id] = by_decision[d.approval_id]
    return decisions, amounts


async def record_report(
    conn: asyncpg.Connection, planner: Journal, report: Report, digest: str
) -> int:
    """One planner journal row naming the report's digest, as the eval role; its id."""
    e = planner.entry(
        tenant=report.tenant,
        kind=_KIND,
        subject=SUBJECT,
        payload={
            "digest": digest,
            "report": "policy.whatif",
            "candidate": report.candidate,
            "candidate_digest": report.candidate_digest,
            "flips": len(report.flips),
        },
    )
    row_id = await conn.fetchval(
        "SELECT planner.record_eval_report($1, $2, $3, $4, $5, $6)",
        e.tenant,
        e.subject,
        e.key_id,
        e.nonce,
        e.ciphertext,
        e.recorded_at,
    )
    return int(row_id)


async def sealed_report(
    conn: asyncpg.Connection, planner: Journal, report: Report, digest: str
) -> int | None:
    """The planner journal seq sealing the report's digest, if one does."""
    for seq, row, plaintext in await read_entries(
        conn, planner, tenant=report.tenant, subject=SUBJECT
    ):
        entry = json.loads(plaintext)
        if row["kind"] == _KIND and entry.get("report") == "policy.whatif":
            if entry.get("digest") == digest:
                return int(seq)
    return None
