"""Sealing: chain committed rows, sign a checkpoint per batch, record it outside the database.

The sealer never signs over what it did not seal. It knows the last head it signed (the record's
newest checkpoint, read at start-up and after anything unexpected) and refuses to extend a chain
whose head is another one, or whose last seal lies past its last checkpoint: someone cut, spliced
or re-hashed the chain, and sealing on top would launder it. It writes a batch's seals and
checkpoint in one transaction and records the checkpoint before it commits. Refusing is loud (a
log line, `writ_journal_seal_refusals_total{service}`) and seals nothing.

It never adopts a record that lacks what the database holds: a record with no checkpoint of a
journal that has signed some (deleted, purged, replaced) or one that stops before the database's
last checkpoint (short) is refused like a cut chain. Only an operator starts a record again, with
a signed re-anchoring that names what was lost (`writ audit re-anchor`, `_anchor.py`); the sealer
then goes on from the anchor it finds on top of the record.

A row it cannot accept (its payload does not authenticate, or it was recorded well before the
head it would follow: re-inserted) does not stop the chain: it takes its place as a rejection,
with the reason, in the signed chain (`writ_journal_rows_rejected_total{service}`). A stalled
chain would let rows behind it be deleted without a trace.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.abc
import asyncpg
from prometheus_client import CollectorRegistry, Counter, Gauge

from libs.journal._codec import entry_hash, genesis_hash, micros
from libs.journal._keys import JournalError, SigningKey
from libs.journal._record import JetStreamRecord, signed_checkpoint
from libs.journal._window import WindowKeys
from libs.journal._write import _ROW, Journal
from libs.telemetry import ServiceFamily
from schemas.journal import JournalCheckpoint

log = logging.getLogger("writ.journal")

# Why a sealing round is refused (`writ_journal_seal_refusals_total{service}{reason}`).
REFUSALS = ("head_differs", "seal_past_checkpoint", "record_missing", "record_short")


class _Refused(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class Sealer:
    """Chains a service's committed journal rows and signs a checkpoint per batch.

    Several processes of a service may run one each: a transaction-scoped advisory lock lets one
    seal at a time, and only sealers ever wait for it. Writers are never notified (NOTIFY takes a
    cluster-wide lock at commit): the sealer polls every `interval` seconds. Without a `record`
    (tests of other things) the last head it signed is only remembered in memory.
    """

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        journal: Journal,
        signing: SigningKey,
        record: JetStreamRecord | None = None,
        registry: CollectorRegistry | None = None,
        batch: int = 500,
        interval: float = 0.5,
        max_lag_s: float = 60.0,
    ) -> None:
        self._pool, self._journal, self._signing = pool, journal, signing
        self._record = record
        self._batch, self._interval = batch, interval
        # How much earlier than the head a row may have been recorded: a transaction that
        # began before the head's and committed after it. Older is a re-inserted row.
        self._max_lag = timedelta(seconds=max_lag_s)
        self.service = service = journal.service
        s = journal.schema
        self._lock = int.from_bytes(
            hashlib.sha256(f"writ-journal:{s}".encode()).digest()[:8], "big", signed=True
        )
        self._head_sql = (
            f"SELECT seq, entry_id, xid::text AS xid, entry_hash "
            f"FROM {s}.journal_seals ORDER BY seq DESC LIMIT 1"
        )
        self._floor_sql = (
            f"SELECT j.recorded_at FROM {s}.journal_seals s "
            f"JOIN {s}.journal j ON j.id = s.entry_id WHERE s.rejected IS NULL "
            "ORDER BY s.seq DESC LIMIT 1"
        )
        self._last_checkpoint_sql = (
            f"SELECT seq, prev_seq, head_hash FROM "
            f"{s}.journal_checkpoints ORDER BY seq DESC LIMIT 1"
        )
        # The row comparison walks the (xid, id) index from the head; the snapshot's xmin is
        # the one of this very statement, so every row below it is visible here if committed.
        # (ORDER BY names the table's columns: a bare `xid` would be the text output column.)
        self._next_sql = (
            f"SELECT {_ROW} FROM {s}.journal j "
            "WHERE (j.xid, j.id) > ($1::text::xid8, $2) "
            "AND j.xid < pg_snapshot_xmin(pg_current_snapshot()) "
            "ORDER BY j.xid, j.id LIMIT $3"
        )
        self._seal_sql = (
            f"INSERT INTO {s}.journal_seals "
            "(seq, entry_id, xid, prev_hash, entry_hash, rejected) "
            "SELECT * FROM unnest($1::bigint[], $2::bigint[], "
            "$3::text[]::xid8[], $4::bytea[], $5::bytea[], $6::text[])"
        )
        self._checkpoint_sql = (
            f"INSERT INTO {s}.journal_checkpoints "
            "(seq, prev_seq, head_hash, key_id, signature) "
            "VALUES ($1, $2, $3, $4, $5)"
        )
        # The newest recorded checkpoint and its stream sequence; `_known_ok` False: read it
        # from the record again before trusting it (start-up, another replica, a failed round).
        self._known: JournalCheckpoint | None = None
        self._known_at = 0
        self._known_ok = False
        self.refused: str | None = None  # why the last round refused to seal, if it did
        registry = registry if registry is not None else CollectorRegistry()
        # One family per metric for every service, the service a label (`service="planner"`).
        self._refusals = ServiceFamily(
            Counter(
                "writ_journal_seal_refusals",
                "Sealing rounds refused because the chain's "
                "head is not the one this sealer signed last (tampering)",
                ["service", "reason"],
                registry=registry,
            ),
            service,
        )
        self._rejected = ServiceFamily(
            Counter(
                "writ_journal_rows_rejected",
                "Journal rows sealed as rejections: not "
                "authentic, or recorded before the head they follow",
                ["service", "reason"],
                registry=registry,
            ),
            service,
        )
        self._sealed = ServiceFamily(
            Counter(
                "writ_journal_rows_sealed", "Journal rows sealed", ["service"], registry=registry
            ),
            service,
        )
        self._alive = ServiceFamily(
            Gauge(
                "writ_journal_sealer_ok_timestamp_seconds",
                "When the sealer last completed a round without refusing or failing",
                ["service"],
                registry=registry,
            ),
            service,
        )
        self._sealed.labels()
        for reason in REFUSALS:
            self._refusals.labels(reason=reason)
        for reason in ("unauthentic", "late"):
            self._rejected.labels(reason=reason)

    async def seal_once(self) -> int:
        """Seal one batch of committed rows in one transaction; the number sealed (0 when it
        refused: `refused` says why)."""
        try:
            sealed = await self._round()
        except _Refused as refusal:
            self._refusals.labels(reason=refusal.reason).inc()
            if self.refused != refusal.detail:
                log.error(
                    "journal of %s: REFUSING TO SEAL (tampering?): %s", self.service, refusal.detail
                )
            self.refused = refusal.detail
            self._known_ok = False  # read the record again next round
            return 0
        except BaseException:
            self._known_ok = False
            raise
        if self.refused is not None:
            log.warning(
                "journal of %s: sealing again: its head is the one last signed", self.service
            )
        self.refused = None
        self._alive.set(time.time())
        return sealed

    async def _recorded(self) -> JournalCheckpoint | None:
        """The last checkpoint this service signed, from the record when it may have moved."""
        if self._record is not None and not self._known_ok:
            self._known_at, self._known = await self._record.last(self.service)
            self._known_ok = True
        return self._known

    async def _round(self) -> int:
        service = self.service
        async with self._pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", self._lock):
                return 0  # another process of this service is sealing
            head = await conn.fetchrow(self._head_sql)
            seq, prev = (
                (head["seq"], bytes(head["entry_hash"])) if head else (0, genesis_hash(service))
            )
            # The head is checked on every round, rows to seal or not: a cut tail is refused
            # (and alerted on) at once, not at the next request.
            last_cp = await conn.fetchrow(self._last_checkpoint_sql)
            if (last_cp["seq"] if last_cp else 0) != seq:
                raise _Refused(
                    "seal_past_checkpoint",
                    f"its last seal (seq {seq}) lies past "
                    f"its last checkpoint (seq {last_cp['seq'] if last_cp else 0})",
                )
            if last_cp is not None and bytes(last_cp["head_hash"]) != prev:
                raise _Refused(
                    "seal_past_checkpoint",
                    f"its last checkpoint (seq {seq}) names another head than its last seal's",
                )
            known = await self._recorded()
            if known is None and self._record is not None and last_cp is not None:
                # Another replica may have recorded and committed since this one last read
                # an empty record: only a record read now may be found missing.
                known = await self._reread()
            if known is None and self._record is not None and last_cp is not None:
                raise _Refused(
                    "record_missing",
                    f"the record outside the database has no checkpoint of this journal, whose "
                    f"last signed checkpoint is seq {seq}: the record was deleted, purged or "
                    "replaced, and sealing on would adopt whatever head the database has now "
                    f"(`writ audit re-anchor --service {service}` starts the record again, "
                    "naming what was lost)",
                )
            if known is None and self._record is None and head is not None:
                # No record: trust the head met first, and hold every later one to it.
                known = self._remember(service, seq, prev, last_cp)
            differs = known is not None and (known.seq, known.head) != (seq, prev.hex())
            if differs:
                known = await self._reread()
                differs = known is None or (known.seq, known.head) != (seq, prev.hex())
            rows = await conn.fetch(
                self._next_sql,
                head["xid"] if head else "0",
                head["entry_id"] if head else 0,
                self._batch,
            )
            floor = await conn.fetchval(self._floor_sql) if rows else None
            keys = self._journal.keys
            unknown = (
                sorted({r["key_id"] for r in rows if keys.unknown(r["key_id"])})
                if isinstance(keys, WindowKeys)
                else []
            )
            if unknown and isinstance(keys, WindowKeys):
                # Window keys another replica made (or this one no longer holds in memory).
                await keys.load(conn, unknown)
            if differs:
                return await self._finish(conn, known, seq, prev, rows, floor)
            if not rows:
                return 0
            return await self._seal(conn, seq, prev, rows, floor, last_cp["seq"] if last_cp else 0)

    def _remember(self, service: str, seq: int, prev: bytes, last_cp: Any) -> JournalCheckpoint:
        self._known = JournalCheckpoint(
            service=service,
            seq=seq,
            prev_seq=last_cp["prev_seq"] if last_cp else 0,
            head=prev.hex(),
            prev_head="",
            key_id="",
            signature="",
        )
        return self._known

    async def _reread(self) -> JournalCheckpoint | None:
        if self._record is None:
            return self._known
        self._known_ok = False
        return await self._recorded()

    def _verdicts(
        self, seq: int, prev: bytes, rows: list[Any], floor: datetime | None
    ) -> tuple[list[Any], int, bytes]:
        """(seq, id, xid, prev hash, hash, rejection) of each row from `seq` + 1."""
        seals = []
        for row in rows:
            rejected = None
            try:
                self._journal.open(row)
            except JournalError as exc:
                rejected = f"unauthentic: {str(exc).split(': ', 1)[-1]}"
            else:
                if floor is not None and row["recorded_at"] < floor - self._max_lag:
                    rejected = (
                        f"late: recorded {(floor - row['recorded_at']).total_seconds():.0f}"
                        " s before the head it follows (re-inserted)"
                    )
            seq += 1
            digest = entry_hash(
                prev,
                service=self.service,
                seq=seq,
                row=row if rejected is None else {**row, "rejected": rejected},
            )
            seals.append((seq, row["id"], row["xid"], prev, digest, rejected))
            prev = digest
        return seals, seq, prev

    async def _seal(
        self,
        conn: asyncpg.Connection,
        seq: int,
        prev: bytes,
        rows: list[Any],
        floor: datetime | None,
        prev_seq: int,
    ) -> int:
        service = self.service
        seals, head_seq, head = self._verdicts(seq, prev, rows, floor)
        checkpoint = signed_checkpoint(
            self._signing,
            service=service,
            seq=head_seq,
            prev_seq=prev_seq,
            head=head,
            prev_head=prev,
            signed_at=micros(datetime.now(UTC)),
        )
        await self._store(conn, seals, checkpoint)
        if self._record is not None:
            # Recorded before the commit: the record never lacks a checkpoint the database
            # has. A commit that then fails leaves the record one ahead; `_finish` completes it.
            at = await self._record.append(checkpoint, after=self._known_at)
            self._known, self._known_at = checkpoint, at
        else:
            self._known = checkpoint
        return len(seals)

    async def _store(
        self, conn: asyncpg.Connection, seals: list[Any], checkpoint: JournalCheckpoint
    ) -> None:
        columns = list(zip(*seals, strict=True))
        await conn.execute(self._seal_sql, *columns)
        await conn.execute(
            self._checkpoint_sql,
            checkpoint.seq,
            checkpoint.prev_seq,
            bytes.fromhex(checkpoint.head),
            checkpoint.key_id,
            base64.b64decode(checkpoint.signature),
        )
        for s in seals:
            if s[5] is not None:
                self._rejected.labels(reason=s[5].split(":", 1)[0]).inc()
                log.error(
                    "journal of %s: row %s sealed as REJECTED at seq %s: %s",
                    self.service,
                    s[1],
                    s[0],
                    s[5],
                )
        self._sealed.inc(len(seals))

    async def _finish(
        self,
        conn: asyncpg.Connection,
        known: JournalCheckpoint | None,
        seq: int,
        prev: bytes,
        rows: list[Any],
        floor: datetime | None,
    ) -> int:
        """The record is ahead of the database by the checkpoint of a round whose commit did
        not happen: seal the same rows again, and only if they give the recorded head."""
        if known is None:
            raise _Refused(
                "head_differs",
                f"its head is seq {seq} but the record has no "
                "checkpoint of it (a checkpoint the record never saw)",
            )
        wanted = f"(seq {known.seq}, {known.head[:16]}…)"
        have = f"seq {seq}, {prev.hex()[:16]}…"
        if known.seq < seq:
            raise _Refused(
                "record_short",
                f"its head ({have}) is past the last checkpoint recorded outside the database "
                f"{wanted}: the record is short (replaced by one that lacks its end), or a "
                f"checkpoint was signed the record never saw (`writ audit re-anchor --service "
                f"{self.service}` starts the record again, naming what was lost)",
            )
        if (known.prev_seq, known.prev_head) == (seq, prev.hex()) and len(rows) >= known.seq - seq:
            seals, head_seq, head = self._verdicts(seq, prev, rows[: known.seq - seq], floor)
            if head.hex() == known.head:
                await self._store(conn, seals, known)
                log.warning(
                    "journal of %s: completed checkpoint %s (recorded, then not committed)",
                    self.service,
                    known.seq,
                )
                return len(seals)
        raise _Refused(
            "head_differs",
            f"its head ({have}) is not the last one it signed "
            f"{wanted}: the chain was cut, spliced or re-hashed",
        )

    async def seal_all(self) -> int:
        """Seal batches until nothing sealable is left; the number sealed."""
        total = 0
        while (sealed := await self.seal_once()) > 0:
            total += sealed
            if sealed < self._batch:
                break
        return total

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Seal every `interval` seconds until cancelled; a failed round is retried."""
        try:  # the last head it signed, before anything else
            await self._recorded()
        except Exception as exc:
            log.warning("journal of %s: cannot read its record yet: %r", self.service, exc)
        task_status.started()
        while True:
            try:
                while True:
                    # A round is short and bounded by the statement timeout: finishing it beats
                    # a rollback that cancellation would interrupt too.
                    with anyio.CancelScope(shield=True):
                        sealed = await self.seal_once()
                    if sealed < self._batch:
                        break
            except Exception as exc:  # the service goes on deciding; the alert flags the lag
                log.warning("journal of %s: sealing failed, retrying: %r", self.service, exc)
            await anyio.sleep(self._interval)
