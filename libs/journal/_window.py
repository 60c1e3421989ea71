"""Keys per tenant and window: destroying one key erases exactly one tenant's day of payloads.

A journal whose data keys are `WindowKeys` encrypts each row under the key of its tenant and of
the UTC day it is recorded in (key id `win:<tenant>:<YYYY-MM-DD>`). Each window key is 32 random
bytes, stored in `<schema>.journal_window_keys` wrapped (AES-GCM) under the service's own data
key from its key file. Nothing derives a window key: once its row's wrapped bytes are gone, no
one holding the key file, the database or both can open that window's payloads again.

Expiry (`destroy`) clears the wrapped bytes and records when, by whom and why; the row itself
stays, so an expired payload is told apart from a forged one. The journal row keeps its ids,
kind, times, nonce and ciphertext, hence its place and hash in the signed chain: verifying still
checks every digest, and reports the payloads it can no longer open as expired, by window.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final

import asyncpg
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from libs.journal._keys import DataKeys, JournalError

PREFIX: Final = "win:"

# Created by `WindowKeys.install` (a service's migration, or `writ retention` on first use).
TABLE_SQL: Final = """
CREATE TABLE IF NOT EXISTS {schema}.journal_window_keys (
    key_id       text PRIMARY KEY,
    tenant       text NOT NULL,
    day          date NOT NULL,
    wrap_key_id  text NOT NULL,
    nonce        bytea,
    wrapped      bytea,
    created_at   timestamptz NOT NULL DEFAULT now(),
    destroyed_at timestamptz,
    destroyed_by text,
    reason       text,
    CHECK ((wrapped IS NULL) = (destroyed_at IS NOT NULL))
)"""


class PayloadExpired(JournalError):
    """The row's window key was destroyed by the retention policy or an erasure: its payload is
    gone for good; its ids, hash and place in the chain are not."""

    def __init__(self, msg: str, *, key_id: str, entry_id: int | None = None) -> None:
        super().__init__(msg, entry_id=entry_id)
        self.key_id = key_id


def window_of(at: datetime) -> date:
    """The UTC day a row recorded at `at` belongs to."""
    return at.astimezone(UTC).date()


def window_key_id(tenant: str, day: date) -> str:
    """The key id of a tenant's window."""
    return f"{PREFIX}{tenant}:{day.isoformat()}"


def parse_key_id(key_id: str) -> tuple[str, date] | None:
    """(tenant, day) of a window key id, None for any other key id."""
    if not key_id.startswith(PREFIX):
        return None
    tenant, _, day = key_id.removeprefix(PREFIX).rpartition(":")
    try:
        return tenant, date.fromisoformat(day)
    except ValueError:
        return None


def _wrap_aad(key_id: str) -> bytes:
    return f"writ-window-key/1:{key_id}".encode()


class WindowKeys(DataKeys):
    """A journal's data keys, one per tenant and UTC day, wrapped under `wrapping`'s active key.

    Rows written under the file's own keys (before windows were used) still open with them.
    `ensure` (outside any transaction) makes a window's key before a row is encrypted under it;
    `load` reads every window key before rows are opened.
    """

    def __init__(self, wrapping: DataKeys, *, schema: str) -> None:
        self._wrapping, self.schema = wrapping, schema
        self.active = wrapping.active
        self._aead = dict(wrapping._aead)
        self._window: dict[str, bytes] = {}
        self._expired: set[str] = set()

    async def install(self, conn: asyncpg.Connection) -> None:
        """Create the window keys' table if it is not there."""
        await conn.execute(TABLE_SQL.format(schema=self.schema))

    def unknown(self, key_id: str) -> bool:
        """Whether `key_id` is neither loaded nor known to be destroyed."""
        return key_id not in self._aead and key_id not in self._expired

    def key_for(self, tenant: str, at: datetime) -> str:
        """The key id a row of `tenant` recorded at `at` is encrypted under."""
        key_id = window_key_id(tenant, window_of(at))
        if key_id in self._expired:
            raise PayloadExpired(f"window {key_id} has expired", key_id=key_id)
        if key_id not in self._aead:
            raise JournalError(f"window key {key_id} not ready: ensure it first")
        return key_id

    async def ensure(self, conn: asyncpg.Connection, tenant: str, at: datetime) -> str:
        """The window's key id, its key made and stored (committed) first if it is new.

        Runs on its own: a key made inside a caller's transaction that then rolled back would
        leave rows encrypted under a key nobody stored.
        """
        key_id = window_key_id(tenant, window_of(at))
        if key_id in self._aead:
            return key_id
        if conn.is_in_transaction():
            raise JournalError("WindowKeys.ensure must run outside a transaction")
        wrap_id, nonce, wrapped = self._wrapping.encrypt(secrets.token_bytes(32), _wrap_aad(key_id))
        await conn.execute(
            f"INSERT INTO {self.schema}.journal_window_keys "
            "(key_id, tenant, day, wrap_key_id, nonce, wrapped) VALUES ($1, $2, $3, $4, $5, $6) "
            "ON CONFLICT (key_id) DO NOTHING",
            key_id,
            tenant,
            window_of(at),
            wrap_id,
            nonce,
            wrapped,
        )
        row = await conn.fetchrow(
            f"SELECT key_id, wrap_key_id, nonce, wrapped FROM {self.schema}.journal_window_keys "
            "WHERE key_id = $1",
            key_id,
        )
        self._take(row)
        return self.key_for(tenant, at)

    async def load(self, conn: asyncpg.Connection) -> None:
        """Read every window key (and which ones were destroyed)."""
        for row in await conn.fetch(
            f"SELECT key_id, wrap_key_id, nonce, wrapped FROM {self.schema}.journal_window_keys"
        ):
            self._take(row)

    def _take(self, row: Mapping[str, Any]) -> None:
        key_id = row["key_id"]
        if row["wrapped"] is None:
            self._expired.add(key_id)
            self._aead.pop(key_id, None)
            return
        key = self._wrapping.decrypt(
            row["wrap_key_id"], bytes(row["nonce"]), bytes(row["wrapped"]), _wrap_aad(key_id)
        )
        self._aead[key_id] = AESGCM(key)

    def encrypt(
        self, plaintext: bytes, aad: bytes, key_id: str | None = None
    ) -> tuple[str, bytes, bytes]:
        """(key id, nonce, ciphertext) under `key_id` (a window's key)."""
        if key_id in self._expired:
            raise PayloadExpired(f"window {key_id} has expired", key_id=key_id or "")
        return super().encrypt(plaintext, aad, key_id)

    def decrypt(self, key_id: str, nonce: bytes, ciphertext: bytes, aad: bytes) -> bytes:
        """The plaintext; PayloadExpired if its window's key was destroyed."""
        if key_id in self._expired:
            raise PayloadExpired(f"payload expired (window {key_id} erased)", key_id=key_id)
        return super().decrypt(key_id, nonce, ciphertext, aad)


async def keys_for(conn: asyncpg.Connection, keys: DataKeys, *, schema: str) -> DataKeys:
    """`keys` as a journal reads them: by window if `schema` keeps window keys, else as is."""
    if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{schema}.journal_window_keys"):
        return WindowKeys(keys, schema=schema)
    return keys


async def destroy_windows(
    conn: asyncpg.Connection,
    *,
    schema: str,
    tenant: str,
    before: date,
    by: str,
    reason: str,
) -> list[str]:
    """Destroy every live window key of `tenant` for days before `before`; the key ids erased.

    The key row stays (tenant, day, when, by whom, why) without its wrapped bytes.
    """
    rows = await conn.fetch(
        f"UPDATE {schema}.journal_window_keys SET wrapped = NULL, nonce = NULL, "
        "destroyed_at = now(), destroyed_by = $3, reason = $4 "
        "WHERE tenant = $1 AND day < $2 AND wrapped IS NOT NULL RETURNING key_id",
        tenant,
        before,
        by[:200],
        reason[:500],
    )
    return sorted(r["key_id"] for r in rows)


def expiry_cutoff(today: date, keep: timedelta) -> date:
    """The first day kept when payloads are kept for `keep` (whole days, at least one)."""
    return today - timedelta(days=max(1, keep.days))
