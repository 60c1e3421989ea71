"""Service-table payloads sealed under the journal's window keys, so expiry reaches them too.

A service column that holds a payload (a run's input, the evidence it was given, a proposal's
arguments and preview) is written as one `bytea` blob encrypted under the key of the row's
tenant, UTC day and run, the very key its journal rows use (`WindowKeys`): destroying that key
erases the journal's copy and the table's together. The blob names its key id, so a row is read
with the key it was written under whatever day it is read on; its associated data names the
table, column and row, so a blob copied onto another row does not open.

A blob whose key was destroyed reads as `Expired` (a typed state, never an error and never a
stand-in value): readers show it as "payload expired".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import asyncpg
import msgspec

from libs.journal._keys import JournalError
from libs.journal._window import PREFIX, PayloadExpired, WindowKeys

# version byte, key id length byte, key id, 12-byte nonce, ciphertext (with its 16-byte tag)
_VERSION: Final = 1
_NONCE: Final = 12
EXPIRED_TEXT: Final = "payload expired"


class Expired(msgspec.Struct, frozen=True, kw_only=True):
    """A sealed payload whose window key was destroyed (retention or erasure)."""

    key_id: str

    def __str__(self) -> str:
        return f"{EXPIRED_TEXT} (window {self.key_id})"


def column_aad(table: str, column: str, row: str) -> bytes:
    """The associated data of `table`.`column` of the row keyed `row`."""
    return f"writ-sealed/1:{table}.{column}:{row}".encode()


def seal(keys: WindowKeys, key_id: str, plaintext: bytes, aad: bytes) -> bytes:
    """`plaintext` encrypted under the window key `key_id` (made already: `Journal.prepare`)."""
    if not key_id.startswith(PREFIX) or len(key_id.encode()) > 255:
        raise JournalError(f"not a window key id: {key_id!r}")
    kid, nonce, ciphertext = keys.encrypt(plaintext, aad, key_id)
    raw = kid.encode()
    return bytes((_VERSION, len(raw))) + raw + nonce + ciphertext


def sealed_key(blob: bytes) -> str:
    """The window key id a sealed blob is encrypted under."""
    if len(blob) < 2 or blob[0] != _VERSION:
        raise JournalError("not a sealed payload")
    return blob[2 : 2 + blob[1]].decode()


def unseal(keys: WindowKeys, blob: bytes, aad: bytes) -> bytes | Expired:
    """The plaintext, or `Expired` if its key was destroyed (load the key first: `refresh`)."""
    key_id = sealed_key(blob)
    start = 2 + blob[1]
    try:
        return keys.decrypt(
            key_id, bytes(blob[start : start + _NONCE]), bytes(blob[start + _NONCE :]), aad
        )
    except PayloadExpired:
        return Expired(key_id=key_id)


async def refresh(
    conn: asyncpg.Connection,
    keys: WindowKeys,
    blobs: Iterable[bytes | None],
    *,
    again: bool = False,
) -> None:
    """Load the keys of `blobs` a process does not hold (every one if `again`: what a person
    or an auditor reads must say expired once its key is gone, never answer from memory)."""
    wanted = {sealed_key(b) for b in blobs if b is not None}
    if not again:
        wanted = {k for k in wanted if keys.unknown(k)}
    if wanted:
        await keys.load(conn, sorted(wanted))
