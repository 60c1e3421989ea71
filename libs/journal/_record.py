"""The record outside the database: every signed checkpoint, in an append-only stream.

The journal's database can be rewritten by whoever can write to it; the record cannot, by the
same person: it lives in a JetStream stream (`WRIT_AUDIT`) whose own configuration denies
deleting a message, purging and rollups, and the server refuses any update that lifts either
denial. The stream is in a NATS account of its own, which each sealer reaches as its own user
through an account that imports only its journal's subject and the record's reads
(libs/natsauth.py): a sealer's record is given `nc.jetstream(prefix=natsauth.SEAL_JS_API)`.
A sealer appends each checkpoint before it commits it, with
`Nats-Expected-Last-Subject-Sequence`, so a service's record is one line: a checkpoint lands
only on top of the one its sealer read last. An auditor may also keep an export of it (JSON
lines).

A message on a journal's subject that is not one of its checkpoints (garbage its sealer's
identity or the record's administrator put there) is junk: reading skips it and says where it
is (`RecordScan`), and a sealer appends after it on top of the last checkpoint below it.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, Protocol, TypeAlias

import msgspec
import nats.errors
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from libs.journal._codec import checkpoint_message, genesis_hash
from libs.journal._keys import JournalError, SigningKey
from schemas import subjects
from schemas.journal import JournalCheckpoint
from schemas.subjects import JOURNAL_RECORD_STREAM, StreamSpec

_DECODER: Final = msgspec.json.Decoder(JournalCheckpoint)
_ENCODER: Final = msgspec.json.Encoder()
# JetStream's error code for "stream not found" (a subject with no message is another 404).
_NO_STREAM: Final = 10059
# How far back a sealer looks, past junk, for its last checkpoint before it gives up.
_MAX_WALK: Final = 50_000


class RecordError(JournalError):
    """The record could not be read or appended to (retry; the sealer does not seal meanwhile)."""


class RecordScan(msgspec.Struct, kw_only=True):
    """What a record holds on one journal's subject: its checkpoints, oldest first, and where
    anything else lies (stream sequence, or line of an export; and what it is)."""

    checkpoints: list[JournalCheckpoint] = msgspec.field(default_factory=list)
    junk: list[tuple[int, str]] = msgspec.field(default_factory=list)
    # The record itself is gone (its stream does not exist), not merely empty for the journal.
    missing: bool = False
    where: str = "stream sequence"  # what a junk position counts


Decoded: TypeAlias = JournalCheckpoint | str


def decode_checkpoint(data: bytes | None, service: str) -> Decoded:
    """The checkpoint of `service` a recorded message holds, or what it is instead."""
    try:
        c = _DECODER.decode(data or b"")
    except msgspec.DecodeError:
        return f"not a checkpoint: {(data or b'')[:80]!r}"
    if c.service != service:
        return f"a checkpoint of another journal ({c.service[:40]!r})"
    return c


class CheckpointRecord(Protocol):
    """Where checkpoints are recorded outside the database."""

    # A live record has every checkpoint ever signed; an export only those up to its writing.
    live: bool

    async def read(self, service: str) -> list[JournalCheckpoint]:
        """Every recorded checkpoint of `service`, oldest first."""
        ...

    async def scan(self, service: str) -> RecordScan:
        """Every recorded checkpoint of `service`, oldest first, and any junk among them."""
        ...


def signed_checkpoint(
    signing: SigningKey,
    *,
    service: str,
    seq: int,
    prev_seq: int,
    head: bytes,
    prev_head: bytes,
    signed_at: int,
) -> JournalCheckpoint:
    """A checkpoint signed with the service's key, as recorded and as stored."""
    signature = signing.sign(checkpoint_message(service, seq, prev_seq, head, signing.key_id))
    return JournalCheckpoint(
        service=service,
        seq=seq,
        prev_seq=prev_seq,
        head=head.hex(),
        prev_head=prev_head.hex(),
        key_id=signing.key_id,
        signature=base64.b64encode(signature).decode(),
        signed_at=signed_at,
    )


def first_prev_head(service: str) -> str:
    """The `prev_head` of a chain's first checkpoint."""
    return genesis_hash(service).hex()


class JetStreamRecord:
    """The `WRIT_AUDIT` stream (or, in tests, a stream of another name and subject prefix)."""

    live = True

    def __init__(
        self,
        js: JetStreamContext,
        *,
        stream: str = JOURNAL_RECORD_STREAM,
        subject: Callable[[str], str] = subjects.journal_checkpoints,
        timeout: float = 5.0,
    ) -> None:
        self._js, self.stream, self.subject, self._timeout = js, stream, subject, timeout
        self.js = js

    def spec(self) -> StreamSpec:
        """This record's stream as Writ declares it (append-only, kept forever)."""
        prefix = self.subject("x").rsplit(".", 1)[0]
        return StreamSpec(self.stream, (f"{prefix}.>",), 0.0, append_only=True)

    async def last(self, service: str) -> tuple[int, JournalCheckpoint | None]:
        """(stream sequence of the subject's last message, newest recorded checkpoint); (0,
        None) if none. Junk on top is skipped: the sequence is the junk's (the next checkpoint
        lands after it), the checkpoint the newest one below it."""
        subject = self.subject(service)
        try:
            msg = await self._js.get_last_msg(self.stream, subject)
        except NotFoundError:
            return 0, None
        except (nats.errors.Error, OSError) as exc:
            raise RecordError(f"cannot read the record of {service}: {exc!r}") from exc
        assert msg.seq is not None
        found = decode_checkpoint(msg.data, service)
        if isinstance(found, JournalCheckpoint):
            return msg.seq, found
        # Walk back by stream sequence (the message reads a sealer may do; no consumer).
        for at in range(msg.seq - 1, max(0, msg.seq - 1 - _MAX_WALK), -1):
            try:
                older = await self._js.get_msg(self.stream, seq=at)
            except NotFoundError:
                continue
            except (nats.errors.Error, OSError) as exc:
                raise RecordError(f"cannot read the record of {service}: {exc!r}") from exc
            if older.subject == subject:
                found = decode_checkpoint(older.data, service)
                if isinstance(found, JournalCheckpoint):
                    return msg.seq, found
        if msg.seq - 1 > _MAX_WALK:
            raise RecordError(
                f"the record of {service} ends in junk and no checkpoint of it lies within "
                f"{_MAX_WALK} messages below"
            )
        return msg.seq, None

    async def append(self, checkpoint: JournalCheckpoint, *, after: int) -> int:
        """Append on top of the message at stream sequence `after` (0: the first); its stream
        sequence. Refused (RecordError) if anything else was recorded for the service since."""
        headers = {"Nats-Expected-Last-Subject-Sequence": str(after)}
        try:
            ack = await self._js.publish(
                self.subject(checkpoint.service),
                _ENCODER.encode(checkpoint),
                stream=self.stream,
                headers=headers,
                timeout=self._timeout,
            )
        except (nats.errors.Error, OSError) as exc:
            raise RecordError(
                f"cannot record checkpoint {checkpoint.seq} of {checkpoint.service}: {exc!r}"
            ) from exc
        return int(ack.seq)

    async def read(self, service: str) -> list[JournalCheckpoint]:
        """Every recorded checkpoint of `service`, oldest first (junk skipped)."""
        return (await self.scan(service)).checkpoints

    async def scan(self, service: str) -> RecordScan:
        """Every message on `service`'s subject, oldest first (an ordered consumer)."""
        try:
            newest = await self._js.get_last_msg(self.stream, self.subject(service))
        except NotFoundError as exc:
            return RecordScan(missing=exc.err_code == _NO_STREAM)
        except (nats.errors.Error, OSError) as exc:
            raise RecordError(f"cannot read the record of {service}: {exc!r}") from exc
        assert newest.seq is not None
        last = newest.seq
        found = RecordScan()
        sub = await self._js.subscribe(
            self.subject(service),
            stream=self.stream,
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        )
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=self._timeout)
                except nats.errors.TimeoutError as exc:
                    raise RecordError(
                        f"the record of {service} stopped before stream sequence {last}"
                    ) from exc
                at = msg.metadata.sequence.stream
                c = decode_checkpoint(msg.data, service)
                if isinstance(c, JournalCheckpoint):
                    found.checkpoints.append(c)
                else:
                    found.junk.append((at, c))
                if at >= last:
                    return found
        finally:
            await sub.unsubscribe()


class FileRecord:
    """An export of the record an auditor keeps: one `JournalCheckpoint` (JSON) per line."""

    live = False

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _lines(self) -> list[tuple[int, bytes]]:
        if not self.path.exists():
            return []
        return [
            (n, line)
            for n, line in enumerate(self.path.read_bytes().splitlines(), start=1)
            if line.strip()
        ]

    def _all(self) -> list[JournalCheckpoint]:
        out = []
        for _, line in self._lines():
            try:
                out.append(_DECODER.decode(line))
            except msgspec.DecodeError:
                continue
        return out

    async def read(self, service: str) -> list[JournalCheckpoint]:
        """The exported checkpoints of `service`, in the order they were recorded."""
        return [c for c in self._all() if c.service == service]

    async def scan(self, service: str) -> RecordScan:
        """The exported checkpoints of `service`; junk named by its line (any line that is
        not a checkpoint of some journal is everyone's junk)."""
        found = RecordScan(missing=not self.path.exists(), where="line")
        for n, line in self._lines():
            c = decode_checkpoint(line, service)
            if isinstance(c, JournalCheckpoint):
                found.checkpoints.append(c)
            elif c.startswith("not a checkpoint"):
                found.junk.append((n, c))
        return found

    async def export(self, source: CheckpointRecord, services: Iterable[str]) -> int:
        """Append what `source` recorded since this file was last written; how many lines."""
        known: dict[str, int] = {}
        for c in self._all():
            known[c.service] = max(known.get(c.service, 0), c.seq)
        added = []
        for service in services:
            added += [c for c in await source.read(service) if c.seq > known.get(service, 0)]
        if added:
            with self.path.open("ab") as out:
                for c in added:
                    out.write(_ENCODER.encode(c) + b"\n")
        return len(added)
