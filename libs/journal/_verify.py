"""Verifying: needs only the public keys, and the record outside the database.

It recomputes every hash, checks every checkpoint and its signature, that seq is contiguous,
that (xid, id) grows along the chain, that no row outside the chain sorts before its head or
waits longer than a grace period, and, against the record, that the database has every recorded
checkpoint with the recorded head and none the record never saw. It names the first bad entry.

A record that is missing, holds nothing of a journal with signed checkpoints, or stops short of
the database's last checkpoint is a finding, named first; so is junk on the record's subject
(by its stream sequence) and an entry a sealer once adopted on its own. An operator's signed
re-anchoring acknowledges what it names as lost (reported, `VerifyReport.reanchored`): the
database is still held against every checkpoint the record kept up to the anchor, and against
everything recorded after it.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final

import asyncpg
import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from libs.journal._anchor import anchor_verifies, describe
from libs.journal._codec import checkpoint_message, entry_hash, genesis_hash
from libs.journal._keys import JournalError
from libs.journal._record import CheckpointRecord, RecordScan
from libs.journal._window import PayloadExpired, WindowKeys
from libs.journal._write import Journal
from schemas.journal import JournalCheckpoint

# How long a committed row may wait for the sealer before verify calls it stuck: the sealer
# polls every 0.5 s, so a row waits about a second; ten is a sealer stopped or refusing.
GRACE: Final = timedelta(seconds=10)


class Defect(msgspec.Struct, frozen=True, kw_only=True):
    """One finding: where (chain position and/or row id) and why."""

    seq: int | None
    entry_id: int | None
    reason: str

    def __str__(self) -> str:
        where = " ".join(
            part
            for part in (
                f"seq {self.seq}" if self.seq is not None else "",
                f"row {self.entry_id}" if self.entry_id is not None else "",
            )
            if part
        )
        return f"{where}: {self.reason}" if where else self.reason


class VerifyReport(msgspec.Struct, kw_only=True):
    """The outcome of verifying one service's journal; `problems[0]` is the first bad entry."""

    service: str
    entries: int = 0
    checkpoints: int = 0
    unsealed: int = 0
    tenant_entries: int | None = None
    # Checkpoints recorded outside the database, from seq `record_from` (None: not checked).
    recorded: int | None = None
    record_from: int | None = None
    # A recorded checkpoint not committed yet whose rows are all there (a sealer mid-round).
    pending: int | None = None
    # Each signed re-anchoring of the record, oldest first: where, by whom, what was lost.
    reanchored: list[str] = msgspec.field(default_factory=list)
    # Entries whose payload expired (its window key destroyed), by window key id: their digests
    # were checked against the chain like every other entry's; only their contents are gone.
    expired: dict[str, int] = msgspec.field(default_factory=dict)
    problems: list[Defect] = msgspec.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the chain, every checkpoint and every signature check out."""
        return not self.problems


_MAX_PROBLEMS: Final = 100


async def verify(
    conn: asyncpg.Connection,
    *,
    service: str,
    keys: Mapping[str, Mapping[str, Ed25519PublicKey]],
    schema: str | None = None,
    tenant: str | None = None,
    grace: timedelta = GRACE,
    journal: Journal | None = None,
    record: CheckpointRecord | None = None,
) -> VerifyReport:
    """Walk one service's whole chain in one snapshot and report what does not check out.

    `keys` maps services to their checkpoint keys by id; only `service`'s own keys count.
    `tenant` only adds a count of that tenant's entries: the chain is verified whole either
    way. With `journal` (which holds the data keys) every payload is also authenticated.
    With `record` the database is held against the checkpoints recorded outside it, read just
    after the database snapshot is taken (a sealer records a checkpoint before it commits it,
    so every checkpoint in the snapshot is already recorded).
    """
    s = schema or service
    own = keys.get(service, {})
    report = VerifyReport(service=service, tenant_entries=0 if tenant is not None else None)

    def bad(seq: int | None, entry_id: int | None, reason: str) -> None:
        if len(report.problems) < _MAX_PROBLEMS:
            report.problems.append(Defect(seq=seq, entry_id=entry_id, reason=reason))

    if journal is not None and isinstance(journal.keys, WindowKeys):
        await journal.keys.load(conn)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        checkpoints = {
            r["seq"]: r
            for r in await conn.fetch(
                f"SELECT seq, prev_seq, head_hash, key_id, signature "
                f"FROM {s}.journal_checkpoints ORDER BY seq"
            )
        }
        report.checkpoints = len(checkpoints)
        recorded_cps: dict[int, JournalCheckpoint] = {}
        live = False
        anchored = -1  # the seq up to which a re-anchoring acknowledged what the record lacks
        if record is not None:
            scan = await record.scan(service)
            recorded_cps, anchored = _check_record(service, own, scan, report, bad)
            live = record.live
            _check_complete(
                scan,
                recorded_cps,
                checkpoints,
                live,
                lambda seq, entry_id, reason: report.problems.insert(
                    0, Defect(seq=seq, entry_id=entry_id, reason=reason)
                ),
            )
        record_from = report.record_from if report.record_from is not None else 0
        record_to = max(recorded_cps, default=0)
        # With nothing recorded at all, the headline above says it; not every checkpoint again.
        held = record is not None and bool(recorded_cps)
        last_recorded, rewritten = 0, False
        # Each entry is checked on its own (its contents give its recorded hash from its
        # recorded predecessor) and linked to the one before it; signed checkpoints pin the
        # recorded hashes. Together that is the whole chain, and a finding names one entry.
        prev, expected, last_cp = genesis_hash(service), 1, 0
        last_key: tuple[int, int] = (0, 0)
        nonces: dict[tuple[str, bytes], int] = {}
        cursor = conn.cursor(
            f"SELECT s.seq, s.entry_id, s.xid::text AS seal_xid, s.prev_hash, s.entry_hash, "
            f"s.rejected, "
            f"j.id, j.xid::text AS xid, j.tenant, j.kind, j.subject, j.run_id, j.recorded_at, "
            f"j.key_id, j.nonce, j.ciphertext FROM {s}.journal_seals s "
            f"LEFT JOIN {s}.journal j ON j.id = s.entry_id ORDER BY s.seq",
            prefetch=1000,
        )
        async for r in cursor:
            seq, entry_id = r["seq"], r["entry_id"]
            recorded_prev, recorded = bytes(r["prev_hash"]), bytes(r["entry_hash"])
            report.entries += 1
            if seq != expected:
                bad(expected, None, f"missing from the chain (deleted): the next seal is seq {seq}")
            elif recorded_prev != prev and (
                r["id"] is None
                or entry_hash(recorded_prev, service=service, seq=seq, row=r) == recorded
            ):
                # This entry is whole (its hash covers its seq, so it was not moved here):
                # the one before it was rewritten together with its seal.
                bad(
                    seq - 1,
                    None,
                    f"its sealed hash is not the one seq {seq} was chained to "
                    "(rewritten together with its seal)",
                )
            expected = seq + 1
            prev = recorded
            outside = recorded_cps.get(seq)
            if outside is not None:
                if not rewritten and bytes.fromhex(outside.head) != recorded:
                    rewritten = True
                    bad(
                        last_recorded + 1,
                        None,
                        f"the chain up to seq {seq} does not hash to "
                        "the head recorded outside the database (an entry after seq "
                        f"{last_recorded} was rewritten, removed or replaced, with every "
                        "later seal)",
                    )
                elif not rewritten:
                    last_recorded = seq
                if seq not in checkpoints:
                    bad(
                        seq,
                        None,
                        "the checkpoint recorded outside the database at this seq "
                        "is missing from it (deleted)",
                    )
            if r["id"] is None:
                bad(seq, entry_id, "the sealed row is missing (deleted)")
                continue
            if tenant is not None and r["tenant"] == tenant:
                report.tenant_entries = (report.tenant_entries or 0) + 1
            key = (int(r["xid"]), r["id"])
            if r["xid"] != r["seal_xid"] or key <= last_key:
                bad(
                    seq,
                    entry_id,
                    "out of order (inserted or reordered): its (xid, id) does "
                    "not follow the previous entry's",
                )
            last_key = key
            if entry_hash(recorded_prev, service=service, seq=seq, row=r) != recorded:
                bad(seq, entry_id, "does not match its sealed hash (edited, swapped or inserted)")
            nonce_key = (r["key_id"], bytes(r["nonce"]))
            if r["rejected"]:
                bad(seq, entry_id, f"the sealer rejected this row ({r['rejected']})")
            if nonce_key in nonces:
                bad(seq, entry_id, f"repeats the nonce of seq {nonces[nonce_key]} (a copied row)")
            nonces[nonce_key] = seq
            if journal is not None:
                try:
                    journal.open(r)
                except PayloadExpired as exc:
                    report.expired[exc.key_id] = report.expired.get(exc.key_id, 0) + 1
                except JournalError as exc:
                    bad(seq, entry_id, str(exc).split(": ", 1)[-1])
            cp = checkpoints.get(seq)
            if cp is not None:
                _check_checkpoint(service, own, cp, prev, last_cp, bad)
                last_cp = seq
                outside = recorded_cps.get(seq)
                if (
                    held
                    and (live or seq <= record_to)
                    and (
                        outside is None
                        and seq >= record_from
                        and seq > anchored
                        or outside is not None
                        and outside.reanchor is None
                        and not _same(cp, outside)
                    )
                ):
                    bad(
                        seq,
                        None,
                        "a checkpoint the record outside the database never saw "
                        "(forged, replaced or re-signed)",
                    )
        head_seq = expected - 1
        if record_to > head_seq:
            report.pending = await _pending(
                conn, s, service, recorded_cps, head_seq, prev, last_key
            )
            if report.pending is None:
                bad(
                    head_seq + 1,
                    None,
                    f"the chain ends at seq {head_seq}, but the record "
                    f"outside the database has a checkpoint at seq "
                    f"{record_to} (the tail was cut)",
                )
        for seq in checkpoints:
            if seq > head_seq:
                bad(
                    seq,
                    None,
                    "a signed checkpoint names an entry the chain no longer has (deleted)",
                )
        if head_seq and last_cp != head_seq and report.pending is None:
            bad(
                last_cp + 1,
                None,
                f"seq {last_cp + 1}..{head_seq} not covered by a signed "
                "checkpoint (appended outside the sealer)",
            )
        now = await conn.fetchval("SELECT now()")
        for u in await conn.fetch(
            f"SELECT j.id, j.xid::text AS xid, j.recorded_at FROM {s}.journal j "
            f"WHERE NOT EXISTS (SELECT 1 FROM {s}.journal_seals s WHERE s.entry_id = j.id) "
            "ORDER BY j.xid, j.id"
        ):
            report.unsealed += 1
            if (int(u["xid"]), u["id"]) < last_key:
                before = await conn.fetchval(
                    f"SELECT min(seq) FROM {s}.journal_seals "
                    "WHERE (xid, entry_id) > ($1::text::xid8, $2)",
                    u["xid"],
                    u["id"],
                )
                bad(before, u["id"], f"not in the chain, yet sorts before seq {before} (inserted)")
            elif now - u["recorded_at"] > grace:
                bad(
                    None,
                    u["id"],
                    f"unsealed for more than {grace} (the sealer is stopped "
                    "or refuses to seal: see its log)",
                )
    return report


def _check_checkpoint(
    service: str,
    own: Mapping[str, Ed25519PublicKey],
    cp: Mapping[str, Any],
    head: bytes,
    last_cp: int,
    bad: Any,
) -> None:
    seq = cp["seq"]
    key = own.get(cp["key_id"])
    if key is None:
        bad(seq, None, f"checkpoint signed with key {cp['key_id']!r}, unknown for {service}")
        return
    try:
        key.verify(
            bytes(cp["signature"]),
            checkpoint_message(service, seq, cp["prev_seq"], bytes(cp["head_hash"]), cp["key_id"]),
        )
    except InvalidSignature:
        bad(seq, None, "checkpoint signature does not verify (checkpoint edited)")
        return
    if cp["prev_seq"] != last_cp:
        bad(
            seq,
            None,
            f"checkpoint follows seq {cp['prev_seq']}, but the previous one is "
            f"{last_cp} (a checkpoint was deleted)",
        )
    if bytes(cp["head_hash"]) != head:
        bad(
            seq,
            None,
            f"the chain up to here differs from its signed checkpoint (an entry "
            f"after seq {last_cp} was rewritten together with every later seal)",
        )


def _same(cp: Mapping[str, Any], outside: JournalCheckpoint | None) -> bool:
    return outside is not None and (
        outside.prev_seq,
        outside.head,
        outside.key_id,
        outside.signature,
    ) == (
        cp["prev_seq"],
        bytes(cp["head_hash"]).hex(),
        cp["key_id"],
        base64.b64encode(bytes(cp["signature"])).decode(),
    )


def _check_record(
    service: str,
    own: Mapping[str, Ed25519PublicKey],
    scan: RecordScan,
    report: VerifyReport,
    bad: Any,
) -> tuple[dict[int, JournalCheckpoint], int]:
    """The record's checkpoints by seq, each signed and each extending the one before, and
    the seq up to which the last re-anchoring acknowledged what the record lacks (-1: none).

    Before the last re-anchoring, the record's entries up to the anchor are kept (the database
    is held against them) and the ones past it are what the anchor says was cut; how they
    linked is not checked again. From the anchor on the record must be one line.
    """
    found = scan.checkpoints
    last = max(
        (i for i, c in enumerate(found) if c.reanchor is not None and anchor_verifies(c, own)),
        default=None,
    )
    anchored = found[last].seq if last is not None else -1
    for c in found:
        if c.reanchor is not None and anchor_verifies(c, own):
            report.reanchored.append(describe(c))
    by_seq: dict[int, JournalCheckpoint] = {}
    for c in found[:last] if last is not None else []:
        if c.reanchor is None and c.seq <= anchored and _signed(service, own, c):
            by_seq[c.seq] = c
    for at, what in scan.junk:
        if last is None or at not in found[last].reanchor.junk:  # type: ignore[union-attr]
            bad(
                None,
                None,
                f"the record's message at {scan.where} {at} is not a checkpoint of "
                f"{service}: {what}",
            )
    segment = found[last:] if last is not None else found
    report.recorded = len(segment)
    report.record_from = found[0].seq if last is None and found else min(by_seq, default=anchored)
    before: JournalCheckpoint | None = None
    for i, c in enumerate(segment):
        if not (i == 0 and last is not None) and not _signed(service, own, c):
            bad(
                c.seq,
                None,
                "a checkpoint in the record outside the database does not verify "
                f"(key {c.key_id!r})",
            )
            continue
        if before is None and c.adopted:
            bad(
                c.seq,
                None,
                f"the record starts at seq {c.seq} with an entry a sealer adopted on its own "
                "(the checkpoints before it were never recorded, or the record was lost): "
                "`writ audit re-anchor` acknowledges what was lost",
            )
        elif (
            before is not None
            and (c.prev_seq, c.prev_head) != (before.seq, before.head)
            or before is None
            and last is None
            and (c.prev_seq, c.prev_head) != (0, genesis_hash(service).hex())
        ):
            bad(
                c.seq,
                None,
                "the record outside the database does not follow on here "
                "(two sealers, or a record that was replaced)",
            )
        by_seq[c.seq] = before = c
    return by_seq, anchored


def _signed(service: str, own: Mapping[str, Ed25519PublicKey], c: JournalCheckpoint) -> bool:
    key = own.get(c.key_id)
    try:
        if key is None or c.service != service or c.reanchor is not None:
            raise InvalidSignature
        key.verify(
            base64.b64decode(c.signature),
            checkpoint_message(service, c.seq, c.prev_seq, bytes.fromhex(c.head), c.key_id),
        )
    except (InvalidSignature, ValueError):
        return False
    return True


def _check_complete(
    scan: RecordScan,
    recorded: Mapping[int, JournalCheckpoint],
    checkpoints: Mapping[int, Any],
    live: bool,
    bad: Any,
) -> None:
    """The record is there and holds up to the database's last checkpoint: named first."""
    if not checkpoints:
        return
    signed = f"{len(checkpoints)} signed checkpoint(s) up to seq {max(checkpoints)}"
    if scan.missing and not recorded:
        bad(
            None,
            None,
            f"the record outside the database is missing (deleted), and the database holds "
            f"{signed} that nothing outside it vouches for",
        )
    elif not recorded:
        bad(
            None,
            None,
            f"the record outside the database has no checkpoint of this journal, and the "
            f"database holds {signed} (the record was deleted, purged or replaced)",
        )
    elif live and max(recorded) < max(checkpoints):
        bad(
            max(recorded) + 1,
            None,
            f"the record outside the database stops at seq {max(recorded)}, but the database "
            f"holds {signed}: the record is short (replaced by one that lacks its end)",
        )


async def _pending(
    conn: asyncpg.Connection,
    s: str,
    service: str,
    recorded: Mapping[int, JournalCheckpoint],
    head_seq: int,
    head: bytes,
    last_key: tuple[int, int],
) -> int | None:
    """The recorded checkpoint just past the chain's head, if the rows after the head give
    exactly its head hash: a sealer recorded it and has not committed it yet."""
    beyond = sorted(seq for seq in recorded if seq > head_seq)
    c = recorded[beyond[-1]]
    if len(beyond) != 1 or (c.prev_seq, c.prev_head) != (head_seq, head.hex()):
        return None
    rows = await conn.fetch(
        f"SELECT id, xid::text AS xid, tenant, kind, subject, run_id, recorded_at, key_id, "
        f"nonce, ciphertext FROM {s}.journal j WHERE (j.xid, j.id) > ($1::text::xid8, $2) "
        "ORDER BY j.xid, j.id LIMIT $3",
        str(last_key[0]),
        last_key[1],
        c.seq - head_seq,
    )
    prev = head
    for seq, row in enumerate(rows, start=head_seq + 1):
        prev = entry_hash(prev, service=service, seq=seq, row=row)
    return c.seq if len(rows) == c.seq - head_seq and prev.hex() == c.head else None
