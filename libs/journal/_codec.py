"""Canonical encodings: associated data, entry hashes, what a checkpoint signature covers."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import rfc8785

VERSION: Final = 1
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


# The associated data's own version: 2 added `recorded_at`, so a row's time cannot be moved
# without its payload failing to open (a row re-inserted later keeps its old time).
AAD_VERSION: Final = 2


def micros(at: datetime) -> int:
    """Microseconds since the Unix epoch (Postgres' own resolution)."""
    return (at - _EPOCH) // timedelta(microseconds=1)


def _aad(service: str, tenant: str, kind: str, subject: str, run_id: str, key_id: str,
         recorded_at: datetime) -> bytes:
    return rfc8785.dumps([f"writ-journal/{AAD_VERSION}", service, tenant, kind, subject, run_id,
                          key_id, str(micros(recorded_at))])


def genesis_hash(service: str) -> bytes:
    """The `prev_hash` of a service's first entry: chains of two services never splice."""
    return hashlib.sha256(f"writ-journal/{VERSION}:{service}".encode()).digest()


def entry_hash(prev: bytes, *, service: str, seq: int, row: Mapping[str, Any]) -> bytes:
    """sha256(prev || RFC 8785 encoding of the entry: its place and every stored column).

    A row the sealer rejected (`row["rejected"]`, the reason) has it in the hash too: the
    rejection is part of the signed chain, so it cannot be quietly undone.
    """
    doc = {"v": VERSION, "service": service, "seq": str(seq), "id": str(row["id"]),
           "xid": str(row["xid"]), "tenant": row["tenant"], "kind": row["kind"],
           "subject": row["subject"], "run_id": row["run_id"],
           "recorded_at": str(micros(row["recorded_at"])),
           "key_id": row["key_id"], "nonce": base64.b64encode(row["nonce"]).decode(),
           "ciphertext": base64.b64encode(row["ciphertext"]).decode()}
    rejected = row.get("rejected")
    if rejected:
        doc["rejected"] = rejected
    return hashlib.sha256(prev + rfc8785.dumps(doc)).digest()


def checkpoint_message(service: str, seq: int, prev_seq: int, head: bytes, key_id: str) -> bytes:
    """What a checkpoint's Ed25519 signature covers (RFC 8785 JSON)."""
    return rfc8785.dumps({"v": VERSION, "service": service, "seq": str(seq),
                          "prev_seq": str(prev_seq), "head": head.hex(), "key_id": key_id})

