"""The retention policy of stored payloads, and applying it: expiry destroys window keys.

A policy says, per tenant (or by default), for how many days each kind of payload is kept after
the UTC day it was recorded in. Applying it destroys, in each journal that keys its payloads by
tenant, day and run (`libs.journal.WindowKeys`), every window key of a tenant whose days are
past; the rows stay in the signed chain with their ids, hashes and signatures, unreadable.
Erasing a principal destroys the keys of the runs and chat sessions that principal started.

Each application and each erasure is itself journaled, in the same transaction as the keys it
destroys: a planner journal row (`retention.expired`, `retention.erased`) encrypted under the
planner's data key file, never under a window key, so what was erased outlives what it erased.
The planner's sealer signs it into the chain.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Final

import asyncpg
import msgspec

from libs.journal import DataKeys, Journal, WindowKeys, destroy_windows, expiry_cutoff

__all__ = [
    "KINDS",
    "Erasure",
    "Expiry",
    "Kept",
    "RetentionPolicy",
    "Window",
    "apply_policy",
    "erase_principal",
    "principal_digest",
    "recorder",
    "journals_with_windows",
    "show_windows",
]

# The kinds of payload a policy can name; each one that Writ keys by window is applied.
KINDS: Final = ("journal",)

_Days = Annotated[int, msgspec.Meta(ge=1, le=36_500)]
_Tenant = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")]


class Kept(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How many days each kind of payload is kept (absent: kept until a policy says)."""

    journal: _Days | None = None


class RetentionPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`{"default": {"journal": 90}, "tenants": {"acme": {"journal": 1}}}` (days)."""

    default: Kept = Kept()
    tenants: Annotated[dict[_Tenant, Kept], msgspec.Meta(max_length=100_000)] = {}

    @classmethod
    def from_json(cls, text: str | bytes) -> RetentionPolicy:
        """Parse a policy file (unknown fields and kinds are refused)."""
        return msgspec.json.decode(text, type=cls)

    def days(self, tenant: str, kind: str = "journal") -> int | None:
        """Days `tenant`'s payloads of `kind` are kept (None: no expiry)."""
        own = self.tenants.get(tenant)
        value: int | None = getattr(own, kind, None) if own is not None else None
        return value if value is not None else getattr(self.default, kind)


class Window(msgspec.Struct, frozen=True, kw_only=True):
    """One tenant's day in one journal: live, due (past its retention) or expired; `erased`
    of its `keys` (one per run, and one for rows of no run) are destroyed."""

    service: str
    tenant: str
    day: date
    state: str
    keys: int = 0
    erased: int = 0
    destroyed_at: datetime | None = None
    destroyed_by: str | None = None


class Expiry(msgspec.Struct, frozen=True, kw_only=True):
    """The windows one application of the policy erased in one journal."""

    service: str
    tenant: str
    key_ids: list[str]


class Erasure(msgspec.Struct, frozen=True, kw_only=True):
    """What erasing one principal destroyed: their runs' keys, per journal; the journal row
    saying so."""

    tenant: str
    runs: list[str]
    key_ids: dict[str, list[str]]
    journal_id: int
    # Reasons the principal gave answering asks on others' runs, cleared (who answered stays).
    reasons_erased: int = 0


_PLANNER: Final = "planner"


def recorder(data_keys: str | bytes) -> Journal:
    """The planner's journal as retention records in it: under the data key file's active key,
    which no expiry destroys."""
    return Journal(service=_PLANNER, keys=DataKeys.from_json(data_keys))


async def _record(
    conn: asyncpg.Connection,
    journal: Journal,
    *,
    tenant: str,
    kind: str,
    subject: str,
    payload: dict[str, object],
) -> int:
    if isinstance(journal.keys, WindowKeys) or journal.service != _PLANNER:
        raise ValueError("retention records in the planner's journal under its data key file")
    e = journal.entry(tenant=tenant, kind=kind, subject=subject, payload=payload)
    row_id: int = await conn.fetchval(
        journal.insert_sql + " RETURNING id", *msgspec.structs.astuple(e)
    )
    return row_id


async def journals_with_windows(conn: asyncpg.Connection) -> list[str]:
    """The schemas whose journal keys payloads by tenant and day."""
    return [
        r["table_schema"]
        for r in await conn.fetch(
            "SELECT table_schema FROM information_schema.tables "
            "WHERE table_name = 'journal_window_keys' ORDER BY table_schema"
        )
    ]


async def show_windows(
    conn: asyncpg.Connection, policy: RetentionPolicy, *, now: datetime | None = None
) -> list[Window]:
    """Every window of every journal, with what the policy makes of it at `now`."""
    today = (now or datetime.now(UTC)).astimezone(UTC).date()
    out: list[Window] = []
    for schema in await journals_with_windows(conn):
        for r in await conn.fetch(
            "SELECT tenant, day, count(*) AS keys, count(destroyed_at) AS erased, "
            "max(destroyed_at) AS destroyed_at, "
            "(array_agg(destroyed_by ORDER BY destroyed_at DESC NULLS LAST))[1] AS destroyed_by "
            f"FROM {schema}.journal_window_keys GROUP BY tenant, day ORDER BY tenant, day"
        ):
            days = policy.days(r["tenant"])
            due = days is not None and r["day"] < expiry_cutoff(today, timedelta(days=days))
            expired = r["erased"] == r["keys"]
            state = "expired" if expired else "due" if due else "live"
            out.append(
                Window(
                    service=schema,
                    tenant=r["tenant"],
                    day=r["day"],
                    state=state,
                    keys=r["keys"],
                    erased=r["erased"],
                    destroyed_at=r["destroyed_at"],
                    destroyed_by=r["destroyed_by"],
                )
            )
    return out


async def apply_policy(
    conn: asyncpg.Connection,
    policy: RetentionPolicy,
    *,
    by: str,
    record_in: Journal,
    now: datetime | None = None,
) -> list[Expiry]:
    """Destroy every window key the policy says is past; what was erased, per journal and
    tenant. Idempotent: a window already erased is not erased again.

    Each tenant's expiry is one transaction: its keys destroyed in every journal and one
    `retention.expired` row in `record_in` (`recorder`) naming them, or neither.
    """
    today = (now or datetime.now(UTC)).astimezone(UTC).date()
    schemas = await journals_with_windows(conn)
    tenants = sorted(
        {
            r["tenant"]
            for schema in schemas
            for r in await conn.fetch(
                f"SELECT DISTINCT tenant FROM {schema}.journal_window_keys "
                "WHERE wrapped IS NOT NULL"
            )
        }
    )
    out: list[Expiry] = []
    for tenant in tenants:
        days = policy.days(tenant)
        if days is None:
            continue
        cutoff = expiry_cutoff(today, timedelta(days=days))
        async with conn.transaction():
            done: list[Expiry] = []
            for schema in schemas:
                erased = await destroy_windows(
                    conn,
                    schema=schema,
                    tenant=tenant,
                    before=cutoff,
                    by=by,
                    reason=f"retention: journal payloads kept {days} day(s)",
                )
                if erased:
                    done.append(Expiry(service=schema, tenant=tenant, key_ids=erased))
            if done:
                await _record(
                    conn,
                    record_in,
                    tenant=tenant,
                    kind="retention.expired",
                    subject=f"retention/{tenant}/{cutoff.isoformat()}",
                    payload={
                        "by": by,
                        "kind": "journal",
                        "kept_days": days,
                        "before": cutoff.isoformat(),
                        "windows": {e.service: e.key_ids for e in done},
                    },
                )
        out.extend(done)
    return out


def principal_digest(tenant: str, principal: str) -> str:
    """What the journal keeps of an erased principal: sha256 of `tenant/principal`, so an
    auditor told who it was can check, and the journal does not name them."""
    return hashlib.sha256(f"{tenant}/{principal}".encode()).hexdigest()


async def erase_principal(
    conn: asyncpg.Connection,
    *,
    tenant: str,
    principal: str,
    by: str,
    reason: str,
    record_in: Journal,
) -> Erasure:
    """Erase the journal payloads of every run and chat session `principal` started in
    `tenant`, in every journal, by destroying their keys; journaled as `retention.erased`
    (who asked, why, which runs and keys, the principal as `principal_digest`) in the same
    transaction. Others' runs, and the rows of no run, keep their keys."""
    if not principal or not by or not reason:
        raise ValueError("an erasure names its principal, who asked and why")
    async with conn.transaction():
        runs = [
            r["id"]
            for r in await conn.fetch(
                "SELECT run_id AS id FROM planner.runs WHERE tenant = $1 AND principal = $2 "
                "UNION SELECT session_id FROM planner.sessions "
                "WHERE tenant = $1 AND principal = $2 ORDER BY 1",
                tenant,
                principal,
            )
        ]
        key_ids: dict[str, list[str]] = {}
        for schema in await journals_with_windows(conn):
            erased = await destroy_windows(
                conn,
                schema=schema,
                tenant=tenant,
                runs=runs,
                by=by,
                reason=f"erasure: {reason}",
            )
            if erased:
                key_ids[schema] = erased
        # What the principal wrote on rows of other people's runs: the reasons they gave
        # answering an ask. Who answered stays (it is who authorised an effect); the words go.
        reasons = await _erase_reasons(conn, tenant, principal)
        digest = principal_digest(tenant, principal)
        row_id = await _record(
            conn,
            record_in,
            tenant=tenant,
            kind="retention.erased",
            subject=f"erasure/{digest}",
            payload={
                "asked_by": by,
                "reason": reason,
                "principal_sha256": digest,
                "runs": runs,
                "windows": key_ids,
                "reasons_erased": reasons,
            },
        )
    return Erasure(
        tenant=tenant, runs=runs, key_ids=key_ids, journal_id=row_id, reasons_erased=reasons
    )


# Free text a person writes on rows of other people's runs, with the column naming them:
# (table, text column, who-column). Each is cleared by an erasure of that person.
_WRITTEN_BY: Final = (("governance.pending", "answer_reason", "answered_by"),)


async def _erase_reasons(conn: asyncpg.Connection, tenant: str, principal: str) -> int:
    erased = 0
    for table, column, who in _WRITTEN_BY:
        if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table):
            continue
        done = await conn.fetch(
            f"UPDATE {table} SET {column} = NULL WHERE tenant = $1 AND {who} = $2 "
            f"AND {column} IS NOT NULL RETURNING 1",
            tenant,
            principal,
        )
        erased += len(done)
    return erased
