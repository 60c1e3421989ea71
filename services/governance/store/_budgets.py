"""Run budgets in governance's store: set at registration, reserved before each step, settled
after it, paused while the run waits for a person.

Every change to a run's reservations first locks its budget row, so parallel steps queue there
and each sees what the previous one took. Each reserve and settle is one short transaction of
two statements: the lock, read together with the reservation it concerns, then one statement
that writes the reservation, the running totals and the journal row (a data-modifying CTE). A
settle of a reservation this process made is one statement, with no transaction around it: its
step key and amounts are known, so it locks, closes and journals at once, and only if the
reservation is still open as it was made. A reserve may carry settlements of the same run's
earlier steps (`ReserveBudget.settle`): they are closed first, in the same transaction, under
the same lock.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Literal

import asyncpg
import msgspec

from libs.journal import Journal
from schemas.governance import (
    BudgetRefused,
    BudgetReserved,
    BudgetSettled,
    LeaseAmounts,
    RunBudget,
    Settlement,
)
from schemas.planner import root_run_id
from services.governance.budgets import BudgetState, leased, refusal
from services.governance.spend import PriceTable
from services.governance.store._budget_sql import (
    _BUDGET,
    _CLOSE,
    _FAST_CLOSE,
    _FAST_LOCK,
    _FAST_SETTLED,
    _KNOWN,
    _LOCK_FOR_RESERVE,
    _LOCK_FOR_SETTLE,
    _LOWER,
    _MADE_KEPT,
    _PAUSE,
    _RESERVATION,
    _RESERVED,
    _RESUME,
    _SETTLED,
    _settled_entry,
    _state,
)
from services.governance.store._caps import CapMoves, CapRaced
from services.governance.store._records import is_uuid
from services.governance.store._spend import CapExceeded, SpendStore

__all__ = ["BudgetStore"]

# Times a reservation is tried when a concurrent one took its caps' room meanwhile (`_caps.py`):
# the next try reads the caps again and refuses it, unless a settlement freed the room.
_RACES = 3


class BudgetStore(SpendStore):
    """The budget half of `GovernanceStore` (its pool and journal are the store's)."""

    _pool: asyncpg.Pool
    _journal: Journal | None

    def __init__(self) -> None:
        self._with_journal: dict[str, str] = {}
        # reservation id -> (step key, provider calls, tokens, capability calls) of the open
        # reservations this process made: their settlement needs no read first (`settle`).
        self._made: dict[str, tuple[str, int, int, int]] = {}
        self._prices: dict[str, tuple[PriceTable, str]] = {}

    def _remember(
        self,
        reservation_id: str,
        step_key: str,
        provider_calls: int,
        tokens: int,
        capability_calls: int,
    ) -> None:
        if len(self._made) >= _MADE_KEPT:  # the oldest first: dicts keep insertion order
            del self._made[next(iter(self._made))]
        self._made[reservation_id] = (step_key, provider_calls, tokens, capability_calls)

    async def _journaled(
        self,
        conn: asyncpg.Connection,
        cte: str,
        statement: str,
        args: Sequence[object],
        *,
        tenant: str,
        kind: str,
        subject: str,
        run_id: str,
        payload: dict[str, object],
        only_if: str = "",
    ) -> Any:
        """`statement` and its journal row in one statement (`cte`, if any, before the
        journal's CTE), its value; the journal row's parameters follow `args`. `only_if`:
        the CTE that must return a row for the journal row to be written."""
        if self._journal is None:
            return await conn.fetchval(f"WITH {cte} {statement}" if cte else statement, *args)
        key = f"{cte}\0{statement}\0{only_if}"
        sql = self._with_journal.get(key)
        if sql is None:
            first = len(args) + 1
            journal_cte = (
                self._journal.cte_if(first, only_if) if only_if else self._journal.cte(first)
            )
            sql = f"WITH {cte + ', ' if cte else ''}{journal_cte} {statement}"
            self._with_journal[key] = sql
        await self._journal.prepare(tenant, run_id)
        entry = self._journal.entry(
            tenant=tenant, kind=kind, subject=subject, payload=payload, run_id=run_id
        )
        return await conn.fetchval(sql, *args, *msgspec.structs.astuple(entry))

    async def budget(self, tenant: str, run_id: str) -> BudgetState | None:
        """A run's budget as it stands (None: no budget recorded)."""
        row = await self._pool.fetchrow(_BUDGET, tenant, run_id)
        return _state(row) if row is not None else None

    async def reserve(
        self,
        *,
        tenant: str,
        run_id: str,
        step_key: str,
        provider_calls: int = 0,
        tokens: int = 0,
        capability_calls: int = 0,
        limit: RunBudget | None = None,
        settle: Sequence[Settlement] = (),
        up_to: LeaseAmounts | None = None,
        model: str | None = None,
        action: str | None = None,
        amount: str | None = None,
        currency: str | None = None,
    ) -> BudgetReserved | BudgetRefused:
        """Reserve a step's amounts if they fit what is left, or refuse naming the budget.

        One short transaction that first locks the run's budget row: parallel steps of a run
        queue there, and each sees the reservations the previous ones took, so no two can
        spend the same remainder. The same step key gets the same reservation back. `limit`
        (the caller's own limits for the run) first lowers the run's limits where it asks less.
        `settle`: earlier reservations of this run, closed first in the same transaction.
        `up_to`: a lease; once the asked amounts fit, each is raised to what is left, up to
        these (`leased`). `model`, `action`, `amount` (in `currency`): what the step's cost is
        read from, where the tenant has spend caps; its worst case is held against every cap
        that covers it, under the same lock, or the step is refused naming the cap.
        """
        async with self._pool.acquire() as conn:
            for attempt in range(_RACES):
                moves = CapMoves(tenant)
                try:
                    async with conn.transaction():
                        answer = await self._reserve_in(
                            conn,
                            moves,
                            tenant=tenant,
                            run_id=run_id,
                            step_key=step_key,
                            provider_calls=provider_calls,
                            tokens=tokens,
                            capability_calls=capability_calls,
                            limit=limit,
                            settle=settle,
                            up_to=up_to,
                            model=model,
                            action=action,
                            amount=amount,
                            currency=currency,
                        )
                        await moves.apply(conn)  # the transaction's last statement
                except CapRaced:
                    if attempt + 1 == _RACES:
                        raise
                    continue
                if isinstance(answer, tuple):  # committed: a reservation with no spend hold
                    self._remember(*answer[1])
                    return answer[0]
                return answer
        raise AssertionError("unreachable")

    async def _reserve_in(
        self,
        conn: asyncpg.Connection,
        moves: CapMoves,
        *,
        tenant: str,
        run_id: str,
        step_key: str,
        provider_calls: int = 0,
        tokens: int = 0,
        capability_calls: int = 0,
        limit: RunBudget | None = None,
        settle: Sequence[Settlement] = (),
        up_to: LeaseAmounts | None = None,
        model: str | None = None,
        action: str | None = None,
        amount: str | None = None,
        currency: str | None = None,
    ) -> BudgetReserved | BudgetRefused | tuple[BudgetReserved, tuple[str, str, int, int, int]]:
        """`reserve` in its transaction; a reservation without a spend hold comes with what
        `_remember` keeps of it once committed."""
        settled = []
        for done in settle:  # closed, found closed, or unknown here: the caller is done
            await self._settle(
                conn,
                tenant,
                run_id,
                done.reservation_id,
                used=(done.provider_calls, done.tokens, done.capability_calls),
                split=(done.input_tokens, done.output_tokens),
                moves=moves,
            )
            settled.append(done.reservation_id)
        row = await conn.fetchrow(_LOCK_FOR_RESERVE, tenant, run_id, step_key)
        if row is None:
            return BudgetRefused(
                run_id=run_id,
                step_key=step_key,
                budget="unknown_run",
                reason="no budget recorded for this run",
                settled=settled,
            )
        state = _state(row)
        if limit is not None and (lowered := state.limits.lowered(limit)) != state.limits:
            await self._journaled(
                conn,
                "",
                _LOWER,
                (
                    tenant,
                    run_id,
                    lowered.provider_calls,
                    lowered.tokens,
                    lowered.capability_calls,
                    lowered.wall_time_s,
                    lowered.max_concurrent_steps,
                ),
                tenant=tenant,
                kind="budget.lowered",
                subject=run_id,
                run_id=run_id,
                payload={
                    "step_key": step_key,
                    "asked": msgspec.to_builtins(limit),
                    **msgspec.to_builtins(lowered),
                },
            )
            state = msgspec.structs.replace(state, limits=lowered)
        if row["known_id"] is not None:  # a redelivery: the reservation this step has
            return self._known(row, state, settled, run_id=run_id, step_key=step_key)
        asked = {
            "provider_calls": provider_calls,
            "tokens": tokens,
            "capability_calls": capability_calls,
        }
        refused = refusal(state, **asked)
        if (
            refused is not None
            and (known := await conn.fetchrow(_KNOWN, tenant, run_id, step_key)) is not None
        ):
            # A concurrent reserve of this step key committed while this one waited for
            # the lock: its reservation (which the totals count) is this step's.
            return self._known(known, state, settled, run_id=run_id, step_key=step_key)
        if refused is not None:
            kind, reason = refused
            # Not a state change, but why a run stopped belongs in its record.
            await self._write(
                conn,
                tenant=tenant,
                kind="budget.exhausted",
                subject=step_key,
                run_id=run_id,
                payload={
                    "step_key": step_key,
                    "budget": kind,
                    "reason": reason,
                    "asked": asked,
                    "elapsed_s": state.elapsed_s,
                },
            )
            return BudgetRefused(
                run_id=run_id, step_key=step_key, budget=kind, reason=reason, settled=settled
            )
        spend = await self._spend_check(
            conn, tenant, row["agent"], asked, model, action, (amount, currency), moves
        )
        if isinstance(spend, CapExceeded):
            await self._write(
                conn,
                tenant=tenant,
                kind="budget.exhausted",
                subject=step_key,
                run_id=run_id,
                payload={"step_key": step_key, **spend.payload, "asked": asked},
            )
            return BudgetRefused(
                run_id=run_id,
                step_key=step_key,
                budget="spend",
                reason=spend.reason,
                cap=spend.cap,
                settled=settled,
            )
        # A run its tenant's caps cover gets no lease beyond the step: each step is priced.
        if up_to is not None and not self._capped(tenant, row["agent"]):
            asked = leased(state, asked, msgspec.structs.asdict(up_to))
            provider_calls, tokens, capability_calls = (
                asked["provider_calls"],
                asked["tokens"],
                asked["capability_calls"],
            )
        reservation_id = str(uuid.uuid4())
        if not await self._journaled(
            conn,
            _RESERVATION,
            _RESERVED,
            (
                tenant,
                run_id,
                reservation_id,
                step_key,
                provider_calls,
                tokens,
                capability_calls,
            ),
            tenant=tenant,
            kind="budget.reserved",
            subject=reservation_id,
            run_id=run_id,
            only_if="reservation",
            payload={
                "reservation_id": reservation_id,
                "step_key": step_key,
                **asked,
                "elapsed_s": state.elapsed_s,
            },
        ):
            # Inserted nothing: a concurrent reserve of this step key committed first.
            known = await conn.fetchrow(_KNOWN, tenant, run_id, step_key)
            return self._known(known, state, settled, run_id=run_id, step_key=step_key)
        if spend is not None:
            await self._spend_hold(conn, spend, reservation_id, tenant, run_id, moves)
        reserved = BudgetReserved(
            reservation_id=reservation_id,
            run_id=run_id,
            step_key=step_key,
            status="open",
            wall_time_left_s=state.wall_time_left_s,
            settled=settled,
            **asked,
        )
        if spend is not None:  # a held one settles under the lock (`_settle`)
            return reserved
        return reserved, (reservation_id, step_key, provider_calls, tokens, capability_calls)

    @staticmethod
    def _known(
        row: Any, state: BudgetState, settled: list[str], *, run_id: str, step_key: str
    ) -> BudgetReserved:
        """The reservation a step key already has, as `reserve` answers it."""
        return BudgetReserved(
            run_id=run_id,
            step_key=step_key,
            wall_time_left_s=state.wall_time_left_s,
            reservation_id=row["known_id"],
            status=row["known_status"],
            provider_calls=row["known_provider_calls"],
            tokens=row["known_tokens"],
            capability_calls=row["known_capability_calls"],
            settled=settled,
        )

    async def settle(
        self,
        *,
        tenant: str,
        run_id: str,
        reservation_id: str,
        provider_calls: int = 0,
        tokens: int = 0,
        capability_calls: int = 0,
        release: bool = False,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> BudgetSettled | None:
        """Close a reservation with what the step used (recorded as reported, even above what
        was reserved): its reserved amounts return, its use counts. None: no such reservation.

        Closing it again returns what was recorded the first time and changes nothing.
        """
        if not is_uuid(reservation_id):
            return None
        used = (provider_calls, tokens, capability_calls)
        async with self._pool.acquire() as conn:
            made = self._made.pop(reservation_id, None)
            if made is not None and (
                settled := await self._settle_made(
                    conn, tenant, run_id, reservation_id, made, used=used, release=release
                )
            ):
                return settled
            async with conn.transaction():
                moves = CapMoves(tenant)
                settled = await self._settle(
                    conn,
                    tenant,
                    run_id,
                    reservation_id,
                    used=used,
                    release=release,
                    split=(input_tokens, output_tokens),
                    moves=moves,
                )
                await moves.apply(conn)  # the transaction's last statement
                return settled

    async def _settle_made(
        self,
        conn: asyncpg.Connection,
        tenant: str,
        run_id: str,
        reservation_id: str,
        made: tuple[str, int, int, int],
        *,
        used: tuple[int, int, int],
        release: bool,
    ) -> BudgetSettled | None:
        """Close a reservation this process made as `_settle` does, in one statement: its
        step key and reserved amounts are known, so nothing is read first. None if it
        changed nothing (no longer open, or not as made): `_settle` then answers."""
        step_key, *reserved = made
        status: Literal["released", "settled"] = "released" if release else "settled"
        if not await self._journaled(
            conn,
            f"{_FAST_LOCK}, {_FAST_CLOSE}",
            _FAST_SETTLED,
            (tenant, run_id, reservation_id, status, *used, *reserved, step_key),
            tenant=tenant,
            kind=f"budget.{status}",
            subject=reservation_id,
            run_id=run_id,
            only_if="reservation",
            payload=_settled_entry(reservation_id, step_key, reserved, used),
        ):
            return None
        provider_calls, tokens, capability_calls = used
        return BudgetSettled(
            reservation_id=reservation_id,
            run_id=run_id,
            status=status,
            provider_calls=provider_calls,
            tokens=tokens,
            capability_calls=capability_calls,
        )

    async def _settle(
        self,
        conn: asyncpg.Connection,
        tenant: str,
        run_id: str,
        reservation_id: str,
        *,
        used: tuple[int, int, int],
        release: bool = False,
        split: tuple[int | None, int | None],
        moves: CapMoves,
    ) -> BudgetSettled | None:
        if not is_uuid(reservation_id):
            return None
        self._made.pop(reservation_id, None)
        # The budget row first, as `reserve` does: the totals move under one lock.
        r: Any = await conn.fetchrow(_LOCK_FOR_SETTLE, tenant, run_id, reservation_id)
        if r is None:
            return None
        if r["status"] != "open":
            return BudgetSettled(
                reservation_id=reservation_id,
                run_id=run_id,
                status=r["status"],
                provider_calls=r["used_provider_calls"],
                tokens=r["used_tokens"],
                capability_calls=r["used_capability_calls"],
            )
        status: Literal["released", "settled"] = "released" if release else "settled"
        provider_calls, tokens, capability_calls = used
        await self._journaled(
            conn,
            _CLOSE,
            _SETTLED,
            (
                tenant,
                run_id,
                reservation_id,
                status,
                provider_calls,
                tokens,
                capability_calls,
                r["provider_calls"],
                r["tokens"],
                r["capability_calls"],
            ),
            tenant=tenant,
            kind=f"budget.{status}",
            subject=reservation_id,
            run_id=run_id,
            payload=_settled_entry(
                reservation_id,
                r["step_key"],
                (r["provider_calls"], r["tokens"], r["capability_calls"]),
                used,
            ),
        )
        await self._spend_settle(
            conn,
            reservation_id,
            tenant,
            run_id,
            calls=provider_calls + capability_calls,
            tokens=tokens,
            split=split,
            moves=moves,
        )
        return BudgetSettled(
            reservation_id=reservation_id,
            run_id=run_id,
            status=status,
            provider_calls=provider_calls,
            tokens=tokens,
            capability_calls=capability_calls,
        )

    async def _pause(
        self, conn: asyncpg.Connection, tenant: str, run_id: str, wait_key: str
    ) -> None:
        """Stop the run's clock for this wait (idempotent; runs without a budget: nothing). A
        branch's wait stops its root's clock: the budget is the root's."""
        if await conn.fetchval(_PAUSE, tenant, root_run_id(run_id), wait_key):
            await self._write(
                conn,
                tenant=tenant,
                kind="budget.paused",
                subject=wait_key,
                run_id=run_id,
                payload={"wait_key": wait_key},
            )

    async def _resume(
        self, conn: asyncpg.Connection, tenant: str, run_id: str, wait_key: str
    ) -> None:
        """End this wait; the clock runs again once no other wait of the run is open."""
        if await conn.fetchval(_RESUME, tenant, root_run_id(run_id), wait_key):
            await self._write(
                conn,
                tenant=tenant,
                kind="budget.resumed",
                subject=wait_key,
                run_id=run_id,
                payload={"wait_key": wait_key},
            )
