"""The audit journal: encrypted rows written with the state change, sealed into a signed chain.

One journal per service, in the service's own schema (`<schema>.journal`, `.journal_seals`,
`.journal_checkpoints`; see `services/governance/migrations/005_journal.sql`).

Writing (the hot path) is one more INSERT in the caller's transaction, or a CTE in the caller's
statement: the payload is encrypted with AES-GCM under the service's active data key, with
the row's service, tenant, kind, subject, run, key id and recording time as associated data.
No lock, no sequence the writers wait on: a row only gets its place in the chain later.

Sealing (a background task of the same process) chains committed rows into a hash chain and
signs a checkpoint per batch with the service's Ed25519 key. The chain order is (xid, id), not id
alone: a row is sealed only once its transaction id is below the xmin of the sealer's snapshot.
Every transaction that can still commit a row has an xid >= that xmin (it is in flight, or has no
xid yet and will get one >= xmax), so nothing can ever commit before the head of the chain and
the chain has no gaps. Ordering by id with the same xmin test would not be safe: an identity
value is drawn at insert time, not when the xid is assigned, so a transaction still in flight
can hold a lower id than a row that is already sealable.

Every checkpoint is also recorded outside the database, in an append-only JetStream stream
(`_record.py`), and the sealer refuses to extend a chain whose head is not the one it signed
last (`_seal.py`), nor on a record that lacks what the database holds: only an operator starts a
lost record again, signed and journaled (`_anchor.py`). Verifying needs only the public keys and
that record (`_verify.py`).
"""

from typing import Final

from libs.journal._anchor import REANCHORED, ReAnchorError, anchor_verifies, describe, reanchor
from libs.journal._codec import checkpoint_message, entry_hash, genesis_hash, reanchor_message
from libs.journal._keys import DataKeys, JournalError, SigningKey, load_verify_keys
from libs.journal._record import (
    CheckpointRecord,
    FileRecord,
    JetStreamRecord,
    RecordError,
    RecordScan,
    decode_checkpoint,
)
from libs.journal._seal import REFUSALS, Sealer
from libs.journal._sealed import (
    EXPIRED_TEXT,
    Expired,
    column_aad,
    refresh,
    seal,
    sealed_key,
    unseal,
)
from libs.journal._verify import GRACE, Defect, VerifyReport, verify
from libs.journal._window import (
    PayloadExpired,
    WindowKeys,
    destroy_windows,
    expiry_cutoff,
    keys_for,
    parse_key_id,
    window_key_id,
)
from libs.journal._write import Entry, Journal, open_journal, read_entries, window_key_pool

__all__ = [
    "AUDITOR_TABLES",
    "EXPIRED_TEXT",
    "GRACE",
    "REANCHORED",
    "REFUSALS",
    "CheckpointRecord",
    "DataKeys",
    "Entry",
    "Expired",
    "FileRecord",
    "JetStreamRecord",
    "Journal",
    "JournalError",
    "Defect",
    "PayloadExpired",
    "ReAnchorError",
    "RecordError",
    "RecordScan",
    "Sealer",
    "SigningKey",
    "VerifyReport",
    "WindowKeys",
    "anchor_verifies",
    "checkpoint_message",
    "column_aad",
    "decode_checkpoint",
    "describe",
    "destroy_windows",
    "expiry_cutoff",
    "keys_for",
    "entry_hash",
    "genesis_hash",
    "load_verify_keys",
    "open_journal",
    "parse_key_id",
    "read_entries",
    "reanchor",
    "reanchor_message",
    "refresh",
    "seal",
    "sealed_key",
    "unseal",
    "verify",
    "window_key_id",
    "window_key_pool",
]


# What an auditor's read-only role may read ({schema: tables}): the four journals (their window
# keys too: wrapped, so without the data key file the auditor sees which windows expired), the
# planner's record of runs that `writ audit replay` compares them with, and the facts each
# proposal was resolved against (`writ eval build` resolves recorded decisions against them).
# Nothing else.
_JOURNAL_TABLES: Final = ("journal", "journal_seals", "journal_checkpoints", "journal_window_keys")
AUDITOR_TABLES: Final = {
    "governance": _JOURNAL_TABLES,
    "admission": (*_JOURNAL_TABLES, "resolved_facts"),
    "dispatcher": _JOURNAL_TABLES,
    # (plans: a plan-mode chat turn's replay compares them too)
    "planner": (*_JOURNAL_TABLES, "runs", "steps", "plans"),
}
