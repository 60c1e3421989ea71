"""Keys per tenant and window: destroying one key erases exactly one tenant's day of payloads.

A journal whose data keys are `WindowKeys` encrypts each row under the key of its tenant, of the
UTC day it is recorded in and of its run (key id `win:<tenant>:<YYYY-MM-DD>:<run id>`; a row of
no run: `win:<tenant>:<YYYY-MM-DD>`). Destroying every key of a tenant's day erases that window;
destroying the keys of one principal's runs erases that person's payloads and no one else's.
Each window key is 32 random
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
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import asyncpg
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from libs.journal._keys import DataKeys, JournalError

PREFIX: Final = "win:"
# Window keys one writing process keeps in memory (least recently made or used go first; a
# key evicted is read again from its row when a row needs it).
CACHED: Final = 4096

# The table, as each journaling service's migration makes it (its grant aside); also made by
# `WindowKeys.install` where no migration did.
TABLE_SQL: Final = (
    (Path(__file__).resolve().parent.parent / "journal_window_keys.sql")
    .read_text()
    .split("GRANT ", 1)[0]
)


class PayloadExpired(JournalError):
    """The row's window key was destroyed by the retention policy or an erasure: its payload is
    gone for good; its ids, hash and place in the chain are not."""

    def __init__(self, msg: str, *, key_id: str, entry_id: int | None = None) -> None:
        super().__init__(msg, entry_id=entry_id)
        self.key_id = key_id


def window_of(at: datetime) -> date:
    """The UTC day a row recorded at `at` belongs to."""
    return at.astimezone(UTC).date()


def window_key_id(tenant: str, day: date, run_id: str = "") -> str:
    """The key id of a tenant's window (of one run's rows in it, if `run_id`)."""
    own = f"{PREFIX}{tenant}:{day.isoformat()}"
    return f"{own}:{run_id}" if run_id else own


def parse_key_id(key_id: str) -> tuple[str, date] | None:
    """(tenant, day) of a window key id, None for any other key id."""
    if not key_id.startswith(PREFIX):
        return None
    tenant, _, rest = key_id.removeprefix(PREFIX).partition(":")
    try:
        return tenant, date.fromisoformat(rest.partition(":")[0])
    except ValueError:
        return None


def _wrap_aad(key_id: str) -> bytes:
    return f"writ-window-key/1:{key_id}".encode()


class WindowKeys(DataKeys):
    """A journal's data keys, one per tenant, UTC day and run, wrapped under `wrapping`'s
    active key.

    Rows written under the file's own keys (before windows were used) still open with them.
    `ensure` makes a window's key, stored and committed, before a row is encrypted under it: on
    the pool `bind` gave (its own, never the writer's, so a key is never part of a transaction
    that may roll back, and a writer holding a connection never waits on its own pool); `load`
    reads window keys before rows are opened.
    """

    def __init__(self, wrapping: DataKeys, *, schema: str) -> None:
        self._wrapping, self.schema = wrapping, schema
        self.active = wrapping.active
        self._aead = dict(wrapping._aead)
        self._made: OrderedDict[str, None] = OrderedDict()
        self._expired: set[str] = set()
        self._pool: asyncpg.Pool | None = None

    def bind(self, pool: asyncpg.Pool) -> None:
        """The pool `ensure` makes keys on when it is given no connection."""
        self._pool = pool

    async def install(self, conn: asyncpg.Connection) -> None:
        """Create the window keys' table if it is not there."""
        await conn.execute(TABLE_SQL.format(schema=self.schema))

    def unknown(self, key_id: str) -> bool:
        """Whether `key_id` is neither loaded nor known to be destroyed."""
        return key_id not in self._aead and key_id not in self._expired

    def key_for(self, tenant: str, at: datetime, run_id: str = "") -> str:
        """The key id a row of `tenant` (and `run_id`) recorded at `at` is encrypted under."""
        key_id = window_key_id(tenant, window_of(at), run_id)
        if key_id in self._expired:
            raise PayloadExpired(f"window {key_id} has expired", key_id=key_id)
        if key_id not in self._aead:
            raise JournalError(f"window key {key_id} not ready: ensure it first")
        if key_id in self._made:
            self._made.move_to_end(key_id)
        return key_id

    async def ensure(
        self,
        conn: asyncpg.Connection | None,
        tenant: str,
        at: datetime,
        run_id: str = "",
    ) -> str:
        """The window's key id, its key made and stored (committed) first if it is new.

        Runs on its own (on `conn` outside any transaction, else on the bound pool): a key made
        inside a caller's transaction that then rolled back would leave rows encrypted under a
        key nobody stored.
        """
        key_id = window_key_id(tenant, window_of(at), run_id)
        if key_id in self._aead or key_id in self._expired:
            return self.key_for(tenant, at, run_id)
        if conn is None:
            if self._pool is None:
                raise JournalError("WindowKeys has no pool to make keys on: bind one")
            async with self._pool.acquire() as own:
                return await self.ensure(own, tenant, at, run_id)
        if conn.is_in_transaction():
            raise JournalError("WindowKeys.ensure must run outside a transaction")
        wrap_id, nonce, wrapped = self._wrapping.encrypt(secrets.token_bytes(32), _wrap_aad(key_id))
        row = await conn.fetchrow(
            f"WITH made AS (INSERT INTO {self.schema}.journal_window_keys "
            "(key_id, tenant, day, run_id, wrap_key_id, nonce, wrapped) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (key_id) DO NOTHING "
            "RETURNING key_id, wrap_key_id, nonce, wrapped) "
            "SELECT * FROM made",
            key_id,
            tenant,
            window_of(at),
            run_id,
            wrap_id,
            nonce,
            wrapped,
        )
        if row is None:  # another replica made it first: take theirs
            row = await conn.fetchrow(
                f"SELECT key_id, wrap_key_id, nonce, wrapped "
                f"FROM {self.schema}.journal_window_keys WHERE key_id = $1",
                key_id,
            )
        self._take(row)
        self._made[key_id] = None
        while len(self._made) > CACHED:
            old, _ = self._made.popitem(last=False)
            self._aead.pop(old, None)
        return self.key_for(tenant, at, run_id)

    async def load(self, conn: asyncpg.Connection, key_ids: Sequence[str] | None = None) -> None:
        """Read window keys (and which ones were destroyed): `key_ids`', or every one."""
        sql = f"SELECT key_id, wrap_key_id, nonce, wrapped FROM {self.schema}.journal_window_keys"
        rows = (
            await conn.fetch(sql)
            if key_ids is None
            else await conn.fetch(f"{sql} WHERE key_id = ANY($1::text[])", list(key_ids))
        )
        for row in rows:
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
    before: date | None = None,
    runs: Sequence[str] | None = None,
    by: str,
    reason: str,
) -> list[str]:
    """Destroy the live window keys of `tenant` for days before `before`, or of its `runs`
    (one of the two); the key ids erased.

    The key row stays (tenant, day, run, when, by whom, why) without its wrapped bytes.
    """
    if (before is None) == (runs is None):
        raise ValueError("destroy_windows takes `before` or `runs`")
    which = "day < $2::date" if before is not None else "run_id = ANY($2::text[])"
    rows = await conn.fetch(
        f"UPDATE {schema}.journal_window_keys SET wrapped = NULL, nonce = NULL, "
        "destroyed_at = now(), destroyed_by = $3, reason = $4 "
        f"WHERE tenant = $1 AND {which} AND wrapped IS NOT NULL RETURNING key_id",
        tenant,
        before if before is not None else [r for r in (runs or ()) if r],
        by[:200],
        reason[:500],
    )
    return sorted(r["key_id"] for r in rows)


def expiry_cutoff(today: date, keep: timedelta) -> date:
    """The first day kept when payloads are kept for `keep` (whole days, at least one)."""
    return today - timedelta(days=max(1, keep.days))
