"""Spend caps in governance's store: checked and held in a reservation's transaction, charged
what the step used in its settlement's (services/governance/spend.py prices them).

Both run after the run's budget row is locked; the caps' rows are read without a lock, and
what the transaction moves on them is applied by its last statement, which locks them in name
order (`_caps.py`), so a tenant's steps queue on its caps only for that statement and the
commit. One tenant's caps are its own rows: its spend never refuses another tenant's steps.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg
import msgspec

from libs.journal import Journal
from schemas.governance import BudgetSettled
from services.governance.spend import (
    MICROS,
    Cap,
    Charge,
    PriceTable,
    Unpriced,
    charge_for,
    covering,
    covering_all,
    money,
)
from services.governance.store._caps import CapMoves, read_caps
from services.governance.store._records import is_uuid

__all__ = ["CapExceeded", "SpendHeld", "SpendStore"]

_HOLD = """
INSERT INTO governance.spend_charges (reservation_id, tenant, caps, windows, worst_micros,
    input_rate, output_rate, per_call, fixed, prices_version)
VALUES ($1::uuid, $2, $3, $4, $5, $6, $7, $8, $9, $10)
"""
# The charge of a reservation, locked, if it is still open.
_OPEN_CHARGE = """
SELECT caps, windows, worst_micros, input_rate, output_rate, per_call, fixed
FROM governance.spend_charges WHERE reservation_id = $1::uuid AND used_micros IS NULL
FOR UPDATE
"""
_CHARGED = "UPDATE governance.spend_charges SET used_micros = $2 WHERE reservation_id = $1::uuid"
# The charge of a reservation, locked, if it was not yet credited back (open: only held).
_CREDITABLE = """
SELECT caps, windows, worst_micros, used_micros FROM governance.spend_charges
WHERE reservation_id = $1::uuid AND credited_micros IS NULL FOR UPDATE
"""
_CREDITED = (
    "UPDATE governance.spend_charges SET used_micros = $2, credited_micros = $3 "
    "WHERE reservation_id = $1::uuid"
)
# The run's budget row and the reservation, locked in the order every settlement locks them.
_LOCK_RESERVATION = """
SELECT r.status, r.used_provider_calls, r.used_tokens, r.used_capability_calls
FROM governance.budgets b
JOIN governance.reservations r
  ON r.reservation_id = $3::uuid AND r.tenant = b.tenant AND r.run_id = b.run_id
WHERE b.tenant = $1 AND b.run_id = $2 FOR UPDATE OF b, r
"""
# $1 tenants, $2 caps, $3 windows: those rows, where they exist.
_CURRENT = """
SELECT s.tenant, s.cap, s.window_key, s.reserved_micros, s.used_micros
FROM governance.spend s JOIN unnest($1::text[], $2::text[], $3::text[]) AS t(tn, c, w)
  ON s.tenant = t.tn AND s.cap = t.c AND s.window_key = t.w
"""
_ROWS = """
SELECT cap, window_key, reserved_micros, used_micros FROM governance.spend
WHERE tenant = $1 AND ($2::text IS NULL OR cap = $2) ORDER BY cap, window_key DESC
LIMIT $3
"""


class SpendHeld(msgspec.Struct, frozen=True, kw_only=True):
    """What a reservation holds against its caps (its journal row says the same)."""

    caps: list[str]
    windows: list[str]
    worst_micros: int
    prices_version: str


def _names(caps: list[tuple[Cap, str]]) -> tuple[list[str], list[str]]:
    return [c.name for c, _ in caps], [w for _, w in caps]


async def cap_refusal(
    conn: asyncpg.Connection,
    tenant: str,
    caps: list[tuple[Cap, str]],
    worst: int,
    moves: CapMoves,
) -> tuple[Cap, str, str] | set[tuple[str, str]]:
    """The first cap `worst` more would exceed, its window and why; or, if it fits them all,
    the windows that have no row yet. Read without a lock (with what this transaction's
    settlements move): `CapMoves.apply` checks the hold again under the lock."""
    names, windows = _names(caps)
    spent, new = await read_caps(conn, tenant, names, windows)
    for cap, window in caps:
        limit = money(cap.limit)
        now = spent[(cap.name, window)] + moves.pending(cap.name, window)
        if now + worst > limit:
            return (
                cap,
                window,
                f"spend cap {cap.name!r} ({cap.window} {window}) exhausted: this step may "
                f"cost {_show(worst)}, {_show(max(limit - now, 0))} left of {cap.limit}",
            )
    return new


async def hold(
    conn: asyncpg.Connection,
    reservation_id: str,
    tenant: str,
    caps: list[tuple[Cap, str]],
    charge: Charge,
    worst: int,
    version: str,
    moves: CapMoves,
    new: set[tuple[str, str]],
) -> SpendHeld:
    """Hold `worst` against every cap for this reservation (moved by `moves`, which checks it
    fits under the lock)."""
    names, windows = _names(caps)
    await conn.execute(
        _HOLD,
        reservation_id,
        tenant,
        names,
        windows,
        worst,
        charge.input_rate,
        charge.output_rate,
        charge.per_call,
        charge.fixed,
        version,
    )
    moves.hold(names, windows, [money(c.limit) for c, _ in caps], worst, new)
    return SpendHeld(caps=names, windows=windows, worst_micros=worst, prices_version=version)


async def charge_settled(
    conn: asyncpg.Connection,
    reservation_id: str,
    tenant: str,
    *,
    calls: int,
    tokens: int,
    input_tokens: int | None,
    output_tokens: int | None,
    moves: CapMoves,
) -> dict[str, object] | None:
    """Charge a settled reservation what its step used, at the prices it was reserved at,
    to the windows it was reserved in; its hold returns (both moved by `moves`). None: it
    held nothing (or was charged already). The caller holds the run's budget row lock."""
    row = await conn.fetchrow(_OPEN_CHARGE, reservation_id)
    if row is None:
        return None
    charge = Charge(
        input_rate=row["input_rate"],
        output_rate=row["output_rate"],
        per_call=row["per_call"],
        fixed=row["fixed"],
    )
    used = charge.cost(
        calls=calls, tokens=tokens, input_tokens=input_tokens, output_tokens=output_tokens
    )
    caps, windows = list(row["caps"]), list(row["windows"])
    moves.move(caps, windows, reserved=-row["worst_micros"], used=used)
    await conn.execute(_CHARGED, reservation_id, used)
    return {
        "caps": caps,
        "windows": windows,
        "reserved_micros": row["worst_micros"],
        "used_micros": used,
    }


async def credit_charged(
    conn: asyncpg.Connection, reservation_id: str, moves: CapMoves
) -> dict[str, object] | None:
    """Give back to its caps what a reservation's charge took: its call was definitely not
    carried out. A charged one gives back what it was charged; one still only held returns
    its hold and is charged nothing when it is settled. Once: None if it held nothing or was
    credited already. The caller holds the run's budget row lock."""
    row = await conn.fetchrow(_CREDITABLE, reservation_id)
    if row is None:
        return None
    caps, windows = list(row["caps"]), list(row["windows"])
    held = row["worst_micros"] if row["used_micros"] is None else 0
    used = row["used_micros"] or 0
    moves.move(caps, windows, reserved=-held, used=-used)
    await conn.execute(_CREDITED, reservation_id, used, used)
    return {"caps": caps, "windows": windows, "released_micros": held, "credited_micros": used}


def _show(micros: int) -> str:
    whole, frac = divmod(micros, MICROS)
    return f"{whole}.{frac:06d}".rstrip("0").rstrip(".") if frac else str(whole)


class CapExceeded(msgspec.Struct, frozen=True, kw_only=True):
    """A step refused by a spend cap: which (None: the step could not be priced), why, and
    what its journal row records."""

    cap: str | None
    reason: str
    payload: dict[str, object]


class _Pending(msgspec.Struct, frozen=True, kw_only=True):
    """A step that fits its caps, whose rows are locked: held once its reservation exists."""

    table: PriceTable
    charge: Charge
    caps: list[tuple[Cap, str]]
    worst: int
    new: set[tuple[str, str]]


class SpendStore:
    """The spend-cap half of `BudgetStore`: the tenants' price tables, and the steps' holds
    and charges, in the transactions `BudgetStore` opens."""

    _pool: asyncpg.Pool
    _journal: Journal | None
    # tenant -> its signed price table and caps (`set_prices`), and the table's digest.
    _prices: dict[str, tuple[PriceTable, str]]

    async def _write(
        self,
        conn: asyncpg.Connection,
        *,
        tenant: str,
        kind: str,
        subject: str,
        payload: dict[str, object],
        run_id: str = "",
    ) -> None:
        if self._journal is not None:
            await self._journal.write(
                conn, tenant=tenant, kind=kind, subject=subject, payload=payload, run_id=run_id
            )

    def set_prices(self, tenant: str, table: PriceTable | None, digest: str = "") -> None:
        """The tenant's price table and spend caps from now on (None: no caps)."""
        if table is None:
            self._prices.pop(tenant, None)
        else:
            self._prices[tenant] = (table, digest)

    def _capped(self, tenant: str, agent: str) -> bool:
        """Whether a cap covers the agent's runs (then each step reserves only what it
        asks)."""
        priced = self._prices.get(tenant)
        return priced is not None and any(c.agent in (None, agent) for c in priced[0].caps)

    async def spend(self, tenant: str, cap: str | None = None) -> list[dict[str, object]]:
        """A tenant's spend per cap and window (by cap, newest window first), with each cap's
        limit; each cap of its table also in its current window, at 0 if nothing was spent
        there yet (an approver sees every cap, not only those spent on)."""
        priced = self._prices.get(tenant)
        caps = {c.name: c for c in priced[0].caps} if priced is not None else {}
        rows = [
            (r["cap"], r["window_key"], r["reserved_micros"], r["used_micros"])
            for r in await self._pool.fetch(_ROWS, tenant, cap, 500)
        ]
        if priced is not None:
            seen = {(c, w) for c, w, _, _ in rows}
            rows += [
                (c.name, w, 0, 0)
                for c, w in covering_all(priced[0], datetime.now(UTC))
                if (cap is None or c.name == cap) and (c.name, w) not in seen
            ]
        rows.sort(key=lambda r: r[1], reverse=True)
        rows.sort(key=lambda r: r[0])
        return [
            {
                "cap": name,
                "window": window,
                "reserved_micros": reserved,
                "used_micros": used,
                "limit": caps[name].limit if name in caps else None,
                "agent": caps[name].agent if name in caps else None,
                "currency": priced[0].currency if priced is not None else None,
            }
            for name, window, reserved, used in rows[:500]
        ]

    async def current(self) -> list[dict[str, Any]]:
        """Every priced tenant's caps in their current window: what is settled and held (0
        where nothing was yet) and the limit, in micros, with the table's currency."""
        now = datetime.now(UTC)
        wanted = {
            (tenant, cap.name, window): (cap, table.currency)
            for tenant, (table, _) in self._prices.items()
            for cap, window in covering_all(table, now)
        }
        if not wanted:
            return []
        tenants, caps, windows = (list(x) for x in zip(*wanted, strict=True))
        rows = {
            (r["tenant"], r["cap"], r["window_key"]): r
            for r in await self._pool.fetch(_CURRENT, tenants, caps, windows)
        }
        return [
            {
                "tenant": tenant,
                "cap": name,
                "window": window,
                "currency": currency,
                "used_micros": row["used_micros"] if (row := rows.get(key)) else 0,
                "reserved_micros": row["reserved_micros"] if row else 0,
                "limit_micros": money(cap.limit),
            }
            for key, (cap, currency) in wanted.items()
            for tenant, name, window in [key]
        ]

    async def _spend_check(
        self,
        conn: asyncpg.Connection,
        tenant: str,
        agent: str,
        asked: dict[str, int],
        model: str | None,
        action: str | None,
        amount: tuple[str | None, str | None],
        moves: CapMoves,
    ) -> CapExceeded | _Pending | None:
        """Whether a step's worst case fits every cap that covers it, as read now (`moves`
        holds it, checked again under the lock, as the transaction's last statement). None:
        no cap prices this step. `amount`: the
        amount the step's arguments carry, and its currency. A step the table cannot price
        is refused, naming no cap."""
        priced = self._prices.get(tenant)
        if priced is None or not priced[0].caps:
            return None
        table = priced[0]
        caps = covering(table, agent, datetime.now(UTC))
        if not caps:
            return None  # no cap covers this agent's runs: nothing to price
        try:
            charge = charge_for(
                table, model=model, action=action, amount=amount[0], currency=amount[1]
            )
        except Unpriced as exc:
            reason = f"spend cannot be priced: {exc}"[:500]
            return CapExceeded(
                cap=None,
                reason=reason,
                payload={"budget": "spend", "reason": reason, "prices_version": table.version},
            )
        if charge is None:
            return None
        worst = charge.worst(
            tokens=asked["tokens"], calls=asked["provider_calls"] + asked["capability_calls"]
        )
        over = await cap_refusal(conn, tenant, caps, worst, moves)
        if isinstance(over, set):
            return _Pending(table=table, charge=charge, caps=caps, worst=worst, new=over)
        cap, window, reason = over
        return CapExceeded(
            cap=cap.name,
            reason=reason,
            payload={
                "budget": "spend",
                "cap": cap.name,
                "window": window,
                "reason": reason,
                "worst_micros": worst,
                "prices_version": table.version,
            },
        )

    async def _spend_hold(
        self,
        conn: asyncpg.Connection,
        pending: _Pending,
        reservation_id: str,
        tenant: str,
        run_id: str,
        moves: CapMoves,
    ) -> None:
        held = await hold(
            conn,
            reservation_id,
            tenant,
            pending.caps,
            pending.charge,
            pending.worst,
            pending.table.version,
            moves,
            pending.new,
        )
        await self._write(
            conn,
            tenant=tenant,
            kind="spend.held",
            subject=reservation_id,
            run_id=run_id,
            payload={"reservation_id": reservation_id, **msgspec.to_builtins(held)},
        )

    async def _spend_settle(
        self,
        conn: asyncpg.Connection,
        reservation_id: str,
        tenant: str,
        run_id: str,
        *,
        calls: int,
        tokens: int,
        split: tuple[int | None, int | None],
        moves: CapMoves,
    ) -> None:
        charged = await charge_settled(
            conn,
            reservation_id,
            tenant,
            calls=calls,
            tokens=tokens,
            input_tokens=split[0],
            output_tokens=split[1],
            moves=moves,
        )
        if charged is not None:
            await self._write(
                conn,
                tenant=tenant,
                kind="spend.charged",
                subject=reservation_id,
                run_id=run_id,
                payload={"reservation_id": reservation_id, **charged},
            )

    async def credit(self, tenant: str, run_id: str, reservation_id: str) -> BudgetSettled | None:
        """Give back what a reservation's spend charge took from its caps, once, its call
        definitely not carried out (`credit_charged`), journaled `spend.credited`. The
        reservation itself is closed by its own settlement, as any other. None: no such
        reservation of this run."""
        if not is_uuid(reservation_id):
            return None
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(_LOCK_RESERVATION, tenant, run_id, reservation_id)
            if row is None:
                return None
            moves = CapMoves(tenant)
            credited = await credit_charged(conn, reservation_id, moves)
            if credited is not None:
                await self._write(
                    conn,
                    tenant=tenant,
                    kind="spend.credited",
                    subject=reservation_id,
                    run_id=run_id,
                    payload={"reservation_id": reservation_id, **credited},
                )
            await moves.apply(conn)
        return BudgetSettled(
            reservation_id=reservation_id,
            run_id=run_id,
            status=row["status"],
            provider_calls=row["used_provider_calls"] or 0,
            tokens=row["used_tokens"] or 0,
            capability_calls=row["used_capability_calls"] or 0,
        )
