"""Writing rows (the hot path) and reading sealed entries back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import asyncpg
import msgspec

from libs.db import connect_pool
from libs.errors import ConfigError
from libs.journal._codec import _aad
from libs.journal._keys import DataKeys, JournalError, SigningKey
from libs.journal._window import PREFIX, PayloadExpired, WindowKeys, window_of
from libs.settings import read_secret

_MIDNIGHT_MARGIN: Final = timedelta(seconds=60)


class Entry(msgspec.Struct, frozen=True, array_like=True):
    """One journal row's values, in the column order of `Journal.COLUMNS`."""

    tenant: str
    kind: str
    subject: str
    run_id: str
    key_id: str
    nonce: bytes
    ciphertext: bytes
    recorded_at: datetime


class Journal:
    """Makes one service's journal rows; the caller writes them in its own transaction."""

    COLUMNS: Final = "tenant, kind, subject, run_id, key_id, nonce, ciphertext, recorded_at"

    def __init__(self, *, service: str, keys: DataKeys, schema: str | None = None) -> None:
        self.service, self.keys = service, keys
        self.schema = schema or service
        self._encoder = msgspec.json.Encoder()

    @property
    def insert_sql(self) -> str:
        """`INSERT` of one row; parameters $1..$8 are `Entry`'s fields in order."""
        return (
            f"INSERT INTO {self.schema}.journal ({self.COLUMNS}) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        )

    def cte(self, first: int, name: str = "journal_row") -> str:
        """A data-modifying CTE writing one row from parameters $first..$first+7.

        `WITH <this> INSERT INTO ... VALUES ($1...)` records the state change and its journal
        row in one statement, hence one transaction, without BEGIN and COMMIT round trips.
        """
        params = ", ".join(f"${first + i}" for i in range(8))
        return f"{name} AS (INSERT INTO {self.schema}.journal ({self.COLUMNS}) VALUES ({params}))"

    def cte_if(self, first: int, exists: str, name: str = "journal_row") -> str:
        """Like `cte`, but the row is written only if the CTE named `exists` returned a row:
        a redelivered statement that changed nothing journals nothing."""
        params = ", ".join(f"${first + i}" for i in range(8))
        return (
            f"{name} AS (INSERT INTO {self.schema}.journal ({self.COLUMNS}) "
            f"SELECT {params} WHERE EXISTS (SELECT 1 FROM {exists}))"
        )

    def entry(
        self,
        *,
        tenant: str,
        kind: str,
        subject: str,
        payload: object,
        run_id: str = "",
        at: datetime | None = None,
    ) -> Entry:
        """Encrypt `payload` (anything msgspec encodes) into a row bound to its identifiers and
        to the time it is recorded (`at`, default now: the sealer rejects a row recorded well
        before the head it would follow)."""
        plaintext = self._encoder.encode(payload)
        at = at or datetime.now(UTC)
        key_id = self.keys.key_for(tenant, at, run_id)
        aad = _aad(self.service, tenant, kind, subject, run_id, key_id, at)
        key_id, nonce, ciphertext = self.keys.encrypt(plaintext, aad, key_id)
        return Entry(tenant, kind, subject, run_id, key_id, nonce, ciphertext, at)

    async def prepare(
        self,
        tenant: str,
        run_id: str = "",
        *,
        at: datetime | None = None,
        conn: asyncpg.Connection | None = None,
    ) -> None:
        """Make the key a row of `tenant` and `run_id` recorded at `at` (default now) is
        encrypted under, if the journal keys windows (`WindowKeys`): on `conn` outside a
        transaction, else on the pool the keys are bound to. Near midnight the next day's key
        is made too, so a row written a moment after this call still finds its key."""
        if not isinstance(self.keys, WindowKeys):
            return
        at = at or datetime.now(UTC)
        await self.keys.ensure(conn, tenant, at, run_id)
        soon = at + _MIDNIGHT_MARGIN
        if window_of(soon) != window_of(at):
            await self.keys.ensure(conn, tenant, soon, run_id)

    async def write(
        self,
        conn: asyncpg.Connection,
        *,
        tenant: str,
        kind: str,
        subject: str,
        payload: object,
        run_id: str = "",
    ) -> None:
        """Insert one row on `conn` (inside the caller's transaction); its window key is made
        first on the keys' own pool if it is new."""
        await self.prepare(tenant, run_id)
        e = self.entry(tenant=tenant, kind=kind, subject=subject, payload=payload, run_id=run_id)
        await conn.execute(self.insert_sql, *msgspec.structs.astuple(e))

    def open(self, row: Mapping[str, Any]) -> bytes:
        """The plaintext payload of a stored row (JournalError if it is not authentic)."""
        aad = _aad(
            self.service,
            row["tenant"],
            row["kind"],
            row["subject"],
            row["run_id"],
            row["key_id"],
            row["recorded_at"],
        )
        try:
            return self.keys.decrypt(row["key_id"], row["nonce"], row["ciphertext"], aad)
        except PayloadExpired as exc:
            raise PayloadExpired(
                f"journal row {row['id']}: {exc}", key_id=exc.key_id, entry_id=row["id"]
            ) from None
        except JournalError as exc:
            raise JournalError(f"journal row {row['id']}: {exc}", entry_id=row["id"]) from None


@asynccontextmanager
async def window_key_pool(
    journal: Journal, dsn: str, *, password: str | None, service: str
) -> AsyncIterator[None]:
    """While open, `journal`'s window keys are made on a small pool of their own (a writer
    holding its own pool's connection in a transaction never waits on that pool for a key)."""
    if not isinstance(journal.keys, WindowKeys):
        yield
        return
    async with await connect_pool(
        dsn, password=password, min_size=1, max_size=2, application_name=f"writ-{service}-keys"
    ) as pool:
        journal.keys.bind(pool)
        yield


def open_journal(
    service: str, *, signing_key_file: str, data_keys_file: str
) -> tuple[Journal, SigningKey]:
    """A service's journal and its signing key, from its two secret files; refuses to start
    without them, because a governed change with no journal row is a change nobody can prove.

    Payloads are keyed per tenant, day and run (`WindowKeys`, wrapped under the data key file):
    bind the keys to a pool of their own (`journal.keys.bind`) before the first write."""
    if not (signing_key_file and data_keys_file):
        raise ConfigError(
            f"{service} records what it does in its audit journal: set "
            "WRIT_JOURNAL_SIGNING_KEY_FILE and WRIT_JOURNAL_DATA_KEYS_FILE"
        )
    keys = WindowKeys(DataKeys.from_json(read_secret(data_keys_file)), schema=service)
    journal = Journal(service=service, keys=keys)
    return journal, SigningKey.from_json(read_secret(signing_key_file))


_ROW = "id, xid::text AS xid, tenant, kind, subject, run_id, recorded_at, key_id, nonce, ciphertext"


async def read_entries(
    conn: asyncpg.Connection,
    journal: Journal,
    *,
    tenant: str,
    run_id: str | None = None,
    subject: str | None = None,
    expired: list[Mapping[str, Any]] | None = None,
) -> list[tuple[int, Mapping[str, Any], bytes]]:
    """(seq, row, plaintext) of a tenant's sealed entries in chain order, for replay and audit.

    A row whose window has expired raises `PayloadExpired`; given an `expired` list, it is
    appended there instead (its ids, kind and subject still read) and the rest is returned.
    Only sealed entries are returned: what is not in the verified chain is not evidence, and
    neither is a row the sealer rejected (it is in the chain as a rejection, not as an entry).
    """
    s = journal.schema
    rows = await conn.fetch(
        f"SELECT s.seq, {', '.join('j.' + c.strip() for c in _ROW.split(','))} "
        f"FROM {s}.journal_seals s JOIN {s}.journal j ON j.id = s.entry_id "
        "WHERE s.rejected IS NULL AND j.tenant = $1 AND ($2::text IS NULL OR j.run_id = $2) "
        "AND ($3::text IS NULL OR j.subject = $3) ORDER BY s.seq",
        tenant,
        run_id,
        subject,
    )
    keys = journal.keys
    if not isinstance(keys, WindowKeys) and any(r["key_id"].startswith(PREFIX) for r in rows):
        # Opened with the data key file alone: its window keys are wrapped under it.
        keys = WindowKeys(keys, schema=s)
        journal = Journal(service=journal.service, keys=keys, schema=s)
    if isinstance(keys, WindowKeys):
        # Every window key read again, not only unknown ones: one destroyed since this process
        # made it (an expiry, an erasure) must read as expired, never from memory.
        await keys.load(conn, sorted({r["key_id"] for r in rows if r["key_id"].startswith(PREFIX)}))
    if expired is None:
        return [(r["seq"], r, journal.open(r)) for r in rows]
    out: list[tuple[int, Mapping[str, Any], bytes]] = []
    for r in rows:
        try:
            out.append((r["seq"], r, journal.open(r)))
        except PayloadExpired:
            expired.append(r)
    return out
