"""The audit journal's record outside the database: one message per signed checkpoint.

Every sealer appends each checkpoint it signs to `subjects.journal_checkpoints(<service>)` in the
`WRIT_AUDIT` stream, which is append-only by its own configuration (no delete, no purge, no
rollup). `writ audit verify` holds the database's journal against it. When the record was lost
(deleted, replaced) or the database's tail was cut, the sealers refuse to seal until an operator
re-anchors the journal (`writ audit re-anchor`): a signed entry of the record naming what was
lost, from which the record goes on.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from schemas.base import Event

__all__ = ["JournalCheckpoint", "ReAnchor"]


class ReAnchor(msgspec.Struct, frozen=True, kw_only=True):
    """What an operator acknowledged as lost when re-anchoring a journal's record.

    `record_last` is the last checkpoint seq the record still held (0: none; `record_missing`:
    the record's stream itself was gone); `unrecorded` counts the database's checkpoints up to
    the anchor that the record lacked; `cut_to` is the record's last checkpoint past the
    database's head (0: none): the entries after the anchor up to it are gone from the database;
    `junk` lists the stream sequences of messages on the record's subject that were not
    checkpoints (at most 100).
    """

    by: Annotated[str, msgspec.Meta(max_length=256)]
    reason: Annotated[str, msgspec.Meta(max_length=1024)]
    record_missing: bool = False
    record_last: int = 0
    unrecorded: int = 0
    cut_to: int = 0
    junk: list[int] = []


class JournalCheckpoint(Event, frozen=True):
    """A signed checkpoint: the head of `service`'s chain at `seq`, and the one it follows.

    `signature` (base64) is the Ed25519 signature of `libs.journal.checkpoint_message(service,
    seq, prev_seq, head, key_id)`; `prev_head` is the head at `prev_seq`, so the record alone
    says what chain each checkpoint extends. `signed_at` is the sealer's clock (µs since the
    epoch). `adopted` marks an entry a sealer once recorded on its own for a journal older
    than its record (sealers no longer do: `writ audit verify` names such an entry).
    `reanchor` marks an operator's re-anchoring at `seq`: its signature then covers
    `libs.journal.reanchor_message(...)`, what was lost included.
    """

    service: str
    seq: int
    prev_seq: int
    head: str  # hex
    prev_head: str  # hex; the service's genesis hash when prev_seq is 0
    key_id: str
    signature: str  # base64
    signed_at: int = 0
    adopted: bool = False
    reanchor: ReAnchor | None = None
    v: int = 1
