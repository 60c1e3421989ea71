"""Canonical encodings: associated data, entry hashes, what a checkpoint signature covers."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import rfc8785

VERSION: Final = 1
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


_FAST = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), sort_keys=True, check_circular=False
)


_SAFE_INT = 2**53 - 1


def _flat(v: object) -> bool:
    return type(v) is str or (type(v) is int and -_SAFE_INT <= v <= _SAFE_INT)


def canonical(value: list[Any] | dict[str, Any]) -> bytes:
    """RFC 8785 (JCS) bytes of a flat list, or a flat dict with ASCII keys, of strings and
    safe integers (the journal's only shapes), as `rfc8785.dumps` writes them, at the C speed
    of the stdlib's encoder: the pure-Python canonicaliser was most of every sealer's CPU.

    For these shapes the two agree byte for byte: JCS escapes exactly `"`, `\\` and U+0000 to
    U+001F (the short forms for \\b \\f \\n \\r \\t, else \\u00xx in lower case), writes every
    other character as UTF-8, an integer below 2**53 in plain decimal, and sorts keys by UTF-16
    code units, which for ASCII keys is the order `sort_keys` gives; `json` with
    `ensure_ascii=False` writes the same. Anything else (another shape, a key outside ASCII, a
    lone surrogate) is `rfc8785.dumps`'s, errors included. `tests/unit/test_journal_codec.py`
    pins the equality.
    """
    if isinstance(value, dict):
        simple = all(type(k) is str and k.isascii() and _flat(v) for k, v in value.items())
    else:
        simple = all(_flat(v) for v in value)
    if simple:
        try:
            return _FAST.encode(value).encode("utf-8")
        except UnicodeEncodeError:
            pass
    return rfc8785.dumps(value)


# The associated data's own version: 2 added `recorded_at`, so a row's time cannot be moved
# without its payload failing to open (a row re-inserted later keeps its old time).
AAD_VERSION: Final = 2


def micros(at: datetime) -> int:
    """Microseconds since the Unix epoch (Postgres' own resolution)."""
    return (at - _EPOCH) // timedelta(microseconds=1)


def _aad(
    service: str,
    tenant: str,
    kind: str,
    subject: str,
    run_id: str,
    key_id: str,
    recorded_at: datetime,
) -> bytes:
    return canonical(
        [
            f"writ-journal/{AAD_VERSION}",
            service,
            tenant,
            kind,
            subject,
            run_id,
            key_id,
            str(micros(recorded_at)),
        ]
    )


def genesis_hash(service: str) -> bytes:
    """The `prev_hash` of a service's first entry: chains of two services never splice."""
    return hashlib.sha256(f"writ-journal/{VERSION}:{service}".encode()).digest()


def entry_hash(prev: bytes, *, service: str, seq: int, row: Mapping[str, Any]) -> bytes:
    """sha256(prev || RFC 8785 encoding of the entry: its place and every stored column).

    A row the sealer rejected (`row["rejected"]`, the reason) has it in the hash too: the
    rejection is part of the signed chain, so it cannot be quietly undone.
    """
    doc = {
        "v": VERSION,
        "service": service,
        "seq": str(seq),
        "id": str(row["id"]),
        "xid": str(row["xid"]),
        "tenant": row["tenant"],
        "kind": row["kind"],
        "subject": row["subject"],
        "run_id": row["run_id"],
        "recorded_at": str(micros(row["recorded_at"])),
        "key_id": row["key_id"],
        "nonce": base64.b64encode(row["nonce"]).decode(),
        "ciphertext": base64.b64encode(row["ciphertext"]).decode(),
    }
    rejected = row.get("rejected")
    if rejected:
        doc["rejected"] = rejected
    return hashlib.sha256(prev + canonical(doc)).digest()


def checkpoint_message(service: str, seq: int, prev_seq: int, head: bytes, key_id: str) -> bytes:
    """What a checkpoint's Ed25519 signature covers (RFC 8785 JSON)."""
    return canonical(
        {
            "v": VERSION,
            "service": service,
            "seq": str(seq),
            "prev_seq": str(prev_seq),
            "head": head.hex(),
            "key_id": key_id,
        }
    )


def reanchor_message(
    service: str, seq: int, prev_seq: int, head: bytes, key_id: str, lost: Mapping[str, Any]
) -> bytes:
    """What a re-anchoring's Ed25519 signature covers: the anchor and what was lost with it
    (`lost`: a `ReAnchor` as builtins), RFC 8785 JSON. Never the bytes of a checkpoint."""
    return canonical(
        {
            "v": VERSION,
            "kind": "re-anchor",
            "service": service,
            "seq": str(seq),
            "prev_seq": str(prev_seq),
            "head": head.hex(),
            "key_id": key_id,
            "lost": rfc8785.dumps(dict(lost)).decode(),
        }
    )
