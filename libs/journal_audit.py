"""A service's own answer to `VerifyJournal`: its journal verified with its own keys, for the
auditors' `GET /api/v1/audit/verify` (ingress asks each journaling service; it reads no
database itself).

The checkpoint key is the service's current signing key. Checkpoints signed by a retired key
are reported as not verifying here; `writ audit verify`, which reads the verifiers' key file
with the retired keys, is the full check.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import asyncpg
import msgspec
from nats.micro.request import Request

from libs.journal import (
    Journal,
    JournalError,
    SigningKey,
    VerifyReport,
    load_verify_keys,
    verify,
)
from libs.runtime import Endpoint
from schemas.reads import JournalEntryView, JournalState, VerifyJournal, journal_verify

__all__ = ["JournalVerifyEndpoint"]

log = logging.getLogger("writ.journal")


class JournalVerifyEndpoint:
    """`writ.int.<service>.journal_verify`: 400 undecodable, 500 unreadable journal."""

    def __init__(
        self, *, service: str, pool: asyncpg.Pool, journal: Journal, signing: SigningKey
    ) -> None:
        self._service, self._pool, self._journal = service, pool, journal
        self._keys = load_verify_keys(json.dumps({service: {signing.key_id: signing.public_pem()}}))
        self._decoder = msgspec.json.Decoder(VerifyJournal)
        self._encoder = msgspec.json.Encoder()

    def endpoint(self) -> Endpoint:
        """The endpoint to serve with the service's micro service."""
        return Endpoint("journal_verify", journal_verify(self._service), self, concurrency=2)

    async def __call__(self, request: Request) -> None:
        """Verify the whole chain once and answer its state."""
        try:
            ask = self._decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid VerifyJournal: {exc}"[:500])
            return
        try:
            async with self._pool.acquire() as conn:
                report = await verify(
                    conn,
                    service=self._service,
                    keys=self._keys,
                    tenant=ask.tenant,
                    journal=self._journal,
                )
                found = await self._found(conn, ask, report)
        except Exception as exc:
            log.warning("journal verify failed: %r", exc)
            await request.respond_error("500", "the journal could not be read")
            return
        await request.respond(
            self._encoder.encode(
                JournalState(
                    service=self._service,
                    ok=report.ok,
                    entries=report.entries,
                    checkpoints=report.checkpoints,
                    unsealed=report.unsealed,
                    tenant_entries=report.tenant_entries,
                    first_problem=str(report.problems[0])[:512] if report.problems else None,
                    found=found,
                )
            )
        )

    async def _found(
        self, conn: asyncpg.Connection, ask: VerifyJournal, report: VerifyReport
    ) -> list[JournalEntryView]:
        """The tenant's entries about the asked subjects, in chain order, each checked: sealed
        into the chain, its payload authentic, named by no finding, in a chain that verifies."""
        if not ask.subjects:
            return []
        s = self._journal.schema
        rows = await conn.fetch(
            f"SELECT s.seq, s.rejected, j.id, j.tenant, j.kind, j.subject, j.run_id, "
            f"j.recorded_at, j.key_id, j.nonce, j.ciphertext "
            f"FROM {s}.journal j LEFT JOIN {s}.journal_seals s ON s.entry_id = j.id "
            "WHERE j.tenant = $1 AND j.subject = ANY($2::text[]) "
            "ORDER BY s.seq NULLS LAST, j.id LIMIT 256",
            ask.tenant,
            list(dict.fromkeys(ask.subjects)),
        )
        found: list[JournalEntryView] = []
        for row in rows:
            seq, problem = row["seq"], None
            payload: dict[str, Any] = {}
            try:
                opened = msgspec.json.decode(self._journal.open(row))
                payload = opened if isinstance(opened, dict) else {"value": opened}
            except JournalError as exc:
                problem = f"its payload is not authentic ({exc})"
            if problem is None and seq is None:
                problem = "not sealed into the signed chain yet"
            elif problem is None and row["rejected"] is not None:
                problem = f"the sealer rejected it: {row['rejected']}"
            problem = problem or next(
                (str(p) for p in report.problems if p.seq == seq or p.entry_id == row["id"]),
                None,
            )
            if problem is None and not report.ok:
                problem = f"the {self._service} journal does not verify: {report.problems[0]}"
            found.append(
                JournalEntryView(
                    seq=seq,
                    kind=row["kind"],
                    subject=row["subject"],
                    recorded_at=row["recorded_at"].isoformat(),
                    payload=payload,
                    verified=problem is None,
                    problem=problem[:512] if problem else None,
                )
            )
        return found
