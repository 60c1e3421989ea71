"""The audit journal's record outside the database: one message per signed checkpoint.

Every sealer appends each checkpoint it signs to `subjects.journal_checkpoints(<service>)` in the
`WRIT_AUDIT` stream, which is append-only by its own configuration (no delete, no purge, no
rollup). `writ audit verify` holds the database's journal against it.
"""

from __future__ import annotations

from schemas.base import Event

__all__ = ["JournalCheckpoint"]


class JournalCheckpoint(Event, frozen=True):
    """A signed checkpoint: the head of `service`'s chain at `seq`, and the one it follows.

    `signature` (base64) is the Ed25519 signature of `libs.journal.checkpoint_message(service,
    seq, prev_seq, head, key_id)`; `prev_head` is the head at `prev_seq`, so the record alone
    says what chain each checkpoint extends. `signed_at` is the sealer's clock (µs since the
    epoch); `adopted` marks the first record entry of a journal older than its record.
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
    v: int = 1
