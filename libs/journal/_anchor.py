"""Re-anchoring: an operator starts a journal's record again, naming what was lost.

The sealer refuses to seal while the record outside the database lacks what the database holds
(the record was deleted, purged or replaced) or the database lacks what the record holds (the
tail was cut): adopting either would launder the loss. Starting again is an operator's act,
never the sealer's: `reanchor` signs, with the journal's own checkpoint key, an entry of the
record at the database's current head that says what was lost (`ReAnchor`: the record missing or
short, how many checkpoints it lacked, the cut tail, the junk on its subject), appends it on top
of whatever the record holds, and journals the act itself as a row the sealer then seals on top
of the anchor. `writ audit verify` reports every re-anchoring with what it lost, and still holds
the database against every checkpoint the record kept.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import UTC, datetime

import asyncpg
import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from libs.journal._codec import checkpoint_message, genesis_hash, micros, reanchor_message
from libs.journal._keys import JournalError, SigningKey
from libs.journal._record import JetStreamRecord
from libs.journal._write import Journal
from schemas.journal import JournalCheckpoint, ReAnchor

# The kind of the journal row that records a re-anchoring.
REANCHORED = "journal.re-anchored"


class ReAnchorError(JournalError):
    """A re-anchoring was refused: nothing was lost, or the database's own chain does not end
    on a signed checkpoint (nothing was recorded or journaled)."""


def anchor_verifies(c: JournalCheckpoint, keys: Mapping[str, Ed25519PublicKey]) -> bool:
    """True when `c` is a re-anchoring signed by one of the journal's own keys."""
    key = keys.get(c.key_id)
    if c.reanchor is None or key is None:
        return False
    try:
        key.verify(
            base64.b64decode(c.signature),
            reanchor_message(
                c.service,
                c.seq,
                c.prev_seq,
                bytes.fromhex(c.head),
                c.key_id,
                msgspec.to_builtins(c.reanchor),
            ),
        )
    except (InvalidSignature, ValueError):
        return False
    return True


def describe(c: JournalCheckpoint) -> str:
    """What a re-anchoring says was lost, in one line."""
    r = c.reanchor
    assert r is not None
    when = datetime.fromtimestamp(c.signed_at / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    lost = [
        "the record was missing"
        if r.record_missing
        else "the record held no checkpoint of it"
        if r.record_last == 0
        else f"the record ended at seq {r.record_last}"
    ]
    if r.unrecorded:
        lost.append(f"{r.unrecorded} checkpoint(s) up to seq {c.seq} were not in the record")
    if r.cut_to:
        lost.append(
            f"the entries after seq {c.seq} up to seq {r.cut_to} were cut from the database"
        )
    if r.junk:
        lost.append(f"junk at stream sequence(s) {', '.join(map(str, r.junk))}")
    return f"re-anchored at seq {c.seq} by {r.by} on {when} ({r.reason}): " + "; ".join(lost)


async def reanchor(
    conn: asyncpg.Connection,
    *,
    record: JetStreamRecord,
    journal: Journal,
    signing: SigningKey,
    by: str,
    reason: str,
) -> JournalCheckpoint:
    """Anchor `journal`'s record at the database's current head, naming what was lost; the
    anchor as recorded. `conn` may insert into the journal (the service's own role).

    Raises:
        ReAnchorError: nothing was lost, or the database's chain does not end on its last
            checkpoint (seals past it, or another head): then nothing is done.
        RecordError: the record could not be read or appended to.
    """
    service, s = journal.service, journal.schema
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        last_cp = await conn.fetchrow(
            f"SELECT seq, prev_seq, head_hash, key_id, signature FROM {s}.journal_checkpoints "
            "ORDER BY seq DESC LIMIT 1"
        )
        head = await conn.fetchrow(
            f"SELECT seq, entry_hash FROM {s}.journal_seals ORDER BY seq DESC LIMIT 1"
        )
        signed = {r["seq"] for r in await conn.fetch(f"SELECT seq FROM {s}.journal_checkpoints")}
    seq, head_hash = (
        (head["seq"], bytes(head["entry_hash"])) if head else (0, genesis_hash(service))
    )
    if (last_cp["seq"] if last_cp else 0) != seq or (
        last_cp is not None and bytes(last_cp["head_hash"]) != head_hash
    ):
        raise ReAnchorError(
            f"the database's chain of {service} does not end on its last signed checkpoint "
            f"(its last seal is seq {seq}): a record can only start again at a signed head"
        )
    if last_cp is not None and last_cp["key_id"] == signing.key_id:
        try:
            signing.public_key().verify(
                bytes(last_cp["signature"]),
                checkpoint_message(service, seq, last_cp["prev_seq"], head_hash, signing.key_id),
            )
        except InvalidSignature:
            raise ReAnchorError(
                f"the database's last checkpoint of {service} (seq {seq}) does not verify: "
                "it was not signed by this journal's key"
            ) from None
    if (await record.scan(service)).missing:
        from libs.bus import ensure_streams  # the operator's identity provisions it again

        await ensure_streams(record.js, [record.spec()])
    scan = await record.scan(service)
    after, newest = await record.last(service)
    kept = {c.seq for c in scan.checkpoints}
    lost = ReAnchor(
        by=by[:256],
        reason=reason[:1024],
        record_missing=scan.missing,
        record_last=newest.seq if newest else 0,
        unrecorded=len({n for n in signed if n <= seq} - kept),
        cut_to=max((c.seq for c in scan.checkpoints if c.seq > seq), default=0),
        junk=[at for at, _ in scan.junk][:100],
    )
    if (
        newest is not None
        and (newest.seq, newest.head) == (seq, head_hash.hex())
        and not (lost.unrecorded or lost.cut_to or lost.junk)
    ):
        raise ReAnchorError(
            f"nothing to re-anchor: the record of {service} ends on the database's head "
            f"(seq {seq}) and lacks none of its checkpoints"
        )
    prev_seq = last_cp["prev_seq"] if last_cp else 0
    signature = signing.sign(
        reanchor_message(
            service, seq, prev_seq, head_hash, signing.key_id, msgspec.to_builtins(lost)
        )
    )
    anchor = JournalCheckpoint(
        service=service,
        seq=seq,
        prev_seq=prev_seq,
        head=head_hash.hex(),
        prev_head="",
        key_id=signing.key_id,
        signature=base64.b64encode(signature).decode(),
        signed_at=micros(datetime.now(UTC)),
        reanchor=lost,
    )
    await record.append(anchor, after=after)
    # The act itself, in the journal: the sealer seals it first on top of the anchor.
    await journal.write(
        conn,
        tenant="",
        kind=REANCHORED,
        subject=f"seq-{seq}",
        payload={"seq": seq, "head": anchor.head, **msgspec.to_builtins(lost)},
    )
    return anchor
