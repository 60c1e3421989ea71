"""The retention policy of stored payloads, and applying it: expiry destroys window keys.

A policy says, per tenant (or by default), for how many days each kind of payload is kept after
the UTC day it was recorded in. Applying it destroys, in each journal that keys its payloads by
tenant and day (`libs.journal.WindowKeys`), every window key of a tenant whose days are past;
the rows stay in the signed chain with their ids, hashes and signatures, unreadable.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Final

import asyncpg
import msgspec

from libs.journal import destroy_windows, expiry_cutoff

__all__ = [
    "KINDS",
    "Expiry",
    "Kept",
    "RetentionPolicy",
    "Window",
    "apply_policy",
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
    """One tenant's day in one journal: live, due (past its retention) or expired."""

    service: str
    tenant: str
    day: date
    state: str
    destroyed_at: datetime | None = None
    destroyed_by: str | None = None


class Expiry(msgspec.Struct, frozen=True, kw_only=True):
    """The windows one application of the policy erased in one journal."""

    service: str
    tenant: str
    key_ids: list[str]


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
            f"SELECT tenant, day, destroyed_at, destroyed_by FROM {schema}.journal_window_keys "
            "ORDER BY tenant, day"
        ):
            days = policy.days(r["tenant"])
            due = days is not None and r["day"] < expiry_cutoff(today, timedelta(days=days))
            state = "expired" if r["destroyed_at"] is not None else "due" if due else "live"
            out.append(
                Window(
                    service=schema,
                    tenant=r["tenant"],
                    day=r["day"],
                    state=state,
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
    now: datetime | None = None,
) -> list[Expiry]:
    """Destroy every window key the policy says is past; what was erased, per journal and
    tenant. Idempotent: a window already erased is not erased again."""
    today = (now or datetime.now(UTC)).astimezone(UTC).date()
    out: list[Expiry] = []
    for schema in await journals_with_windows(conn):
        tenants = [
            r["tenant"]
            for r in await conn.fetch(
                f"SELECT DISTINCT tenant FROM {schema}.journal_window_keys "
                "WHERE wrapped IS NOT NULL ORDER BY tenant"
            )
        ]
        for tenant in tenants:
            days = policy.days(tenant)
            if days is None:
                continue
            erased = await destroy_windows(
                conn,
                schema=schema,
                tenant=tenant,
                before=expiry_cutoff(today, timedelta(days=days)),
                by=by,
                reason=f"retention: journal payloads kept {days} day(s)",
            )
            if erased:
                out.append(Expiry(service=schema, tenant=tenant, key_ids=erased))
    return out
