"""The run's budgets from the planner's side: reserve before a step's work, settle after it.

Governance keeps the budgets (`libs/budget.py` is its client); the planner records each
reservation with the step it pays for (`planner.reservations`, in the step's transaction), so:

- a step key names the step, not the attempt (`<run>:<seq>:model`, `<run>:<seq>:critic`,
  `<run>:<seq>:capability`): a redelivered step asks again with the same key and gets the same
  reservation back, never a second one;
- what a step used is recorded (`due`) in the transaction that records the step, then settled;
  a settlement governance did not take is settled again before the run's next step, so a crash
  or a governance blip after a model call never calls the model again and never leaks a
  reservation (settling is idempotent in governance).

A branch (another agent a run called, `branches.py`) spends its root run's budgets: its
reservations are made in governance under the root's run id, with step keys that start with the
branch's own run id (`<root>.b<step>:<seq>:model`), so a branch and its caller draw on one
remainder and a tiny budget stops both.

A root run's every reservation carries its manifest's budgets (`snapshot.manifest_limit`):
governance lowers the run's limits to them before it reserves — never raises one — so the
tightest of governance's limits for the agent, the host's request and the manifest holds from
the run's first step.

Within one delivery (`RunBudgets.deferring`), a step's settlement waits for the next
reservation of the same run and travels with it (`ReserveBudget.settle`: one round trip and one
governance transaction for both); what is still due when the delivery's work is done is settled
in its last transaction (`settle_deferred`), before it commits and its messages are published.
It is recorded `due` in the step's transaction, so a crash in between leaves it to
`settle_due`. Outside a delivery (an answered review, a chat turn's endpoint) a step is settled
as soon as it is spent.

Spend caps (governance's) price each reservation from the model and, for a capability call, its
action and amount (`pricing.py`); a run a cap covers gets no lease beyond the asking step.

Errors: `BudgetExhausted` and `NoBudget` (libs/budget.py) reach the caller, which stops the run;
`BudgetUnavailable` is a `RetryableError`: the delivery is retried, the step never starts
meanwhile (fail closed).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any

import msgspec
from nats.aio.client import Client

from libs import budget
from libs.errors import PermanentError
from schemas.governance import LeaseAmounts, Settlement
from services.planner.leases import draw, drawn
from services.planner.pricing import Priced
from services.planner.snapshot import branch_of, manifest_limit
from services.planner.store import PlannerStore, Reservation, RunRow

__all__ = ["RunBudgets", "budget_run_id", "step_key"]

log = logging.getLogger("writ.planner.budget")


class _Due(msgspec.Struct, frozen=True, kw_only=True):
    """A settlement recorded `due` and not yet sent to governance (see `deferring`)."""

    run: RunRow
    reservation: Reservation


class _Delivery:
    """What one delivery's budget work keeps between its transactions."""

    def __init__(self) -> None:
        # Settlements recorded due and not yet sent to governance.
        self.deferred: list[_Due] = []
        # The reservations of each run locked now, as read with its steps (`known`) and
        # recorded since: a step's held reservation is found here, not by another query.
        self.held: dict[str, dict[str, Reservation]] = {}
        # Each of those runs, and the database's clock when it was read.
        self.runs: dict[str, tuple[RunRow, float]] = {}
        # Leases recorded due in the delivery's last transaction: settled once it committed.
        self.leases: list[_Due] = []


# The current delivery's; None outside `RunBudgets.deferring`.
_DELIVERY: ContextVar[_Delivery | None] = ContextVar("writ_planner_delivery", default=None)


def step_key(run_id: str, seq: int, what: str) -> str:
    """The reservation key of one step: the same on every attempt of that step."""
    return f"{run_id}:{seq}:{what}"


def budget_run_id(run: RunRow) -> str:
    """The run whose budgets `run` spends: its own, or for a branch its root run's."""
    branch = branch_of(run.manifest)
    return run.run_id if branch is None else str(branch["root_run_id"])


class RunBudgets:
    """Reserve and settle the run's budgets in governance around the planner's steps.

    `lease`: what a root run's lease asks of governance at most (None: every step reserves
    on its own, as branches and steps outside a delivery always do).
    """

    def __init__(
        self,
        *,
        nc: Client,
        store: PlannerStore,
        timeout: float = 2.0,
        lease: LeaseAmounts | None = None,
        model: str | None = None,
    ) -> None:
        self._nc, self._store, self._timeout, self._lease = nc, store, timeout, lease
        # The model every reservation's tokens are priced as, where the tenant has spend
        # caps ("provider/model"): a lease's tokens are only ever the model's.
        self._model = model

    async def reserve(
        self,
        conn: Any,
        run: RunRow,
        key: str,
        *,
        provider_calls: int = 0,
        tokens: int = 0,
        capability_calls: int = 0,
        priced: Priced | None = None,
    ) -> tuple[str, bool]:
        """The step's reservation id, and whether the planner recorded it just now: the
        recorded one, else a draw on the run's lease, else a new (or governance's existing)
        reservation for this key (or a new lease and its first draw), recorded open in the
        caller's transaction. `priced`: the capability call as its price is read.

        Raises:
            BudgetExhausted: a budget of the run ran out (`.kind`); nothing was reserved.
            NoBudget: governance has no budget for the run.
            BudgetUnavailable: governance did not answer (retry the delivery).
        """
        delivery = _DELIVERY.get()
        known = None if delivery is None else delivery.held.get(run.run_id)
        held = (
            known.get(key)
            if known is not None
            else await self._store.reservation(conn, run.run_id, key)
        )
        if held is not None:
            return held.reservation_id, False
        need = (provider_calls, tokens, capability_calls)
        lease = None
        if known is not None and self._lease is not None and budget_run_id(run) == run.run_id:
            assert delivery is not None
            lease, fits = await self._lease_for(conn, run, known, need, delivery)
            if fits and lease is not None:  # drawn on: no round trip to governance
                drawing = draw(key, lease, need)
                await self._hold(conn, run.run_id, drawing)
                known[key] = drawing
                return lease.reservation_id, True
        funds = budget_run_id(run)
        deferred = None if delivery is None else delivery.deferred
        carried = [d for d in deferred or () if budget_run_id(d.run) == funds]
        # A new lease (`lease` is the step key it takes), or the step's own reservation.
        asked = key if lease is None else lease.step_key
        try:
            reserved = await budget.reserve(
                self._nc,
                tenant=run.tenant,
                run_id=funds,
                step_key=asked,
                provider_calls=provider_calls,
                tokens=tokens,
                capability_calls=capability_calls,
                limit=manifest_limit(run.manifest),
                timeout=self._timeout,
                up_to=None if lease is None else self._lease,
                model=self._model,
                **(priced.asks() if priced is not None else {}),
                settle=[
                    Settlement(
                        reservation_id=d.reservation.reservation_id,
                        provider_calls=d.reservation.provider_calls,
                        tokens=d.reservation.tokens,
                        capability_calls=d.reservation.capability_calls,
                    )
                    for d in carried
                ],
            )
        except budget.NoBudget as exc:
            for run_id, keys in self._carried_keys(deferred, carried, exc.settled).items():
                await self._close(conn, run_id, *keys)
            raise
        closing = self._carried_keys(deferred, carried, reserved.settled)
        mine = Reservation(step_key=key, reservation_id=reserved.reservation_id, state="open")
        if lease is None:
            new = await self._hold(conn, run.run_id, mine, closing=closing)
        else:
            assert delivery is not None
            now = delivery.runs[run.run_id][1]
            lease = msgspec.structs.replace(
                lease,
                reservation_id=reserved.reservation_id,
                reserved_provider_calls=reserved.provider_calls,
                reserved_tokens=reserved.tokens,
                reserved_capability_calls=reserved.capability_calls,
                expires_at=now + reserved.wall_time_left_s,
            )
            mine = draw(key, lease, need)
            new = await self._hold(conn, run.run_id, lease, mine, closing=closing)
            if known is not None:
                known[lease.step_key] = lease
        if known is not None:
            known[key] = mine
        return reserved.reservation_id, new

    async def _hold(
        self,
        conn: Any,
        run_id: str,
        *rows: Reservation,
        closing: dict[str, list[str]] | None = None,
    ) -> bool:
        """Record open reservations of the run (`store.hold`), and the step keys governance
        closed with them; a run locked now (`_locked`) has them written with the transaction's
        next statement instead. False if the first one's step key has one already."""
        known = self._locked(conn, run_id)
        if known is None:
            return await self._store.hold(conn, run_id, *rows, closing=closing)
        closing = dict(closing or {})
        for other, keys in closing.items():
            await self._close(conn, other, *keys)
        fresh = [r for r in rows if r.step_key not in known]
        self._store.write_behind(run_id, *fresh)
        return bool(rows) and rows[0].step_key not in known

    def _locked(self, conn: Any, run_id: str) -> dict[str, Reservation] | None:
        """The run's reservations, if it is locked in this delivery's current transaction
        and its rows can be written behind (see `PlannerStore.writing_behind`)."""
        delivery = _DELIVERY.get()
        if delivery is None or not conn.is_in_transaction():
            return None
        known = delivery.held.get(run_id)
        return known if known is not None and self._store.writes_behind() else None

    async def _spend(
        self,
        conn: Any,
        run_id: str,
        key: str,
        *,
        provider_calls: int,
        tokens: int,
        capability_calls: int,
    ) -> Reservation | None:
        """`store.spent`: the step is over, its use recorded once (a draw closed, anything
        else due); None if it is not open. A locked run's row is changed in memory and written
        behind."""
        known = self._locked(conn, run_id)
        if known is None:
            return await self._store.spent(
                conn,
                run_id,
                key,
                provider_calls=provider_calls,
                tokens=tokens,
                capability_calls=capability_calls,
            )
        row = known.get(key)
        if row is None or row.state != "open":
            return None
        due = msgspec.structs.replace(
            row,
            provider_calls=provider_calls,
            tokens=tokens,
            capability_calls=capability_calls,
            state="due" if row.lease is None else "closed",
        )
        self._store.write_behind(run_id, due)
        known[key] = due
        return due

    async def _close(self, conn: Any, run_id: str, *keys: str) -> None:
        """Governance has settled these reservations of the run: recorded closed (written
        behind for a run locked in this transaction)."""
        known = self._locked(conn, run_id)
        if known is None:
            await self._store.closed(conn, run_id, *keys)
            return
        for key in keys:
            if (row := known.get(key)) is not None and row.state != "closed":
                known[key] = msgspec.structs.replace(row, state="closed")
                self._store.write_behind(run_id, known[key])

    async def flush(self, conn: Any) -> None:
        """Write what this transaction kept to write behind; await it before each commit."""
        await self._store.flush(conn)

    async def _lease_for(
        self,
        conn: Any,
        run: RunRow,
        known: dict[str, Reservation],
        need: tuple[int, int, int],
        delivery: _Delivery,
    ) -> tuple[Reservation | None, bool]:
        """The run's lease for a step needing `need`, and whether the step can draw on it.

        A lease is drawn on by one step at a time: with a draw open (a command in flight),
        the step reserves on its own (None), as governance counts each open reservation a
        step in flight. Otherwise the open lease is drawn on if what is left of it covers the
        step and it has not expired (the run's clock as governance gave it); if not, it is
        recorded due, to be settled with the next lease (returned, not yet reserved: its
        step key is the next one)."""
        leases = [r for r in known.values() if r.step_key.startswith(_lease_prefix(run))]
        current = next((r for r in leases if r.state == "open"), None)
        if current is not None:
            used = drawn(known, current)
            if used is None:
                return None, False
            left = (
                current.reserved_provider_calls - used[0],
                current.reserved_tokens - used[1],
                current.reserved_capability_calls - used[2],
            )
            now = delivery.runs[run.run_id][1]
            if (
                all(n <= free for n, free in zip(need, left, strict=True))
                and current.expires_at is not None
                and now < current.expires_at
            ):
                return current, True
            await self._close_lease(conn, run, current, used, known)
        return Reservation(
            step_key=f"{_lease_prefix(run)}{len(leases) + 1}", reservation_id="", state="open"
        ), False

    async def _close_lease(
        self,
        conn: Any,
        run: RunRow,
        lease: Reservation,
        used: tuple[int, int, int],
        known: dict[str, Reservation],
    ) -> None:
        """Record the lease due with what its draws used, and defer its settlement."""
        due = await self._spend(
            conn,
            run.run_id,
            lease.step_key,
            provider_calls=used[0],
            tokens=used[1],
            capability_calls=used[2],
        )
        if due is not None:
            known[lease.step_key] = due
            self._defer(run, due)

    async def _end_leases(self, conn: Any, delivery: _Delivery) -> None:
        """In the delivery's last transaction: each locked run's open lease with no draw open
        is recorded due, and settled once that transaction committed (`deferring`), never
        before: a lease governance closed is never drawn on again."""
        for run_id, known in delivery.held.items():
            run = delivery.runs[run_id][0]
            for lease in [
                r
                for r in known.values()
                if r.state == "open" and r.step_key.startswith(_lease_prefix(run))
            ]:
                used = drawn(known, lease)
                if used is None:
                    continue  # a command in flight draws on it: its outcome's delivery ends it
                due = await self._spend(
                    conn,
                    run_id,
                    lease.step_key,
                    provider_calls=used[0],
                    tokens=used[1],
                    capability_calls=used[2],
                )
                if due is not None:
                    known[lease.step_key] = due
                    delivery.leases.append(_Due(run=run, reservation=due))

    def known(self, run: RunRow, reservations: list[Reservation], now: float) -> None:
        """The locked run's reservations as just read (with its steps, at the database's
        clock `now`), so that this delivery's reservations of it need no query of their own
        (in a `deferring` scope)."""
        delivery = _DELIVERY.get()
        if self._store.unwritten():
            raise RuntimeError(
                "reservation rows kept to write behind were never written: "
                "a transaction committed without `flush`"
            )
        if delivery is not None:
            delivery.held[run.run_id] = {r.step_key: r for r in reservations}
            delivery.runs[run.run_id] = (run, now)

    @staticmethod
    def _carried_keys(
        deferred: list[_Due] | None, carried: list[_Due], settled: list[str]
    ) -> dict[str, list[str]]:
        """Drop what governance closed from the delivery's deferred settlements; the step
        keys to record closed, by (planner) run id."""
        done = set(settled)
        closing: dict[str, list[str]] = {}
        for d in carried:
            if d.reservation.reservation_id in done:
                assert deferred is not None
                deferred.remove(d)
                closing.setdefault(d.run.run_id, []).append(d.reservation.step_key)
        return closing

    @contextlib.asynccontextmanager
    async def deferring(self, conn: Any) -> AsyncIterator[None]:
        """Within this scope (one delivery's work), settlements wait for the next reservation
        of their run and travel with it; what is left is settled on leaving it, on `conn`
        (outside any transaction). If the work fails, nothing is sent: what it recorded due
        and committed is `settle_due`'s on the next delivery."""
        delivery = _Delivery()
        token = _DELIVERY.set(delivery)
        try:
            with self._store.writing_behind():
                yield
                if self._store.unwritten():
                    raise RuntimeError(
                        "reservation rows kept to write behind were never "
                        "written: a transaction committed without `flush`"
                    )
            await self.settle_deferred(conn)
            for d in delivery.leases:  # committed due: settled now, or by `settle_due` later
                await self._settle_logged(conn, d)
        finally:
            _DELIVERY.reset(token)

    async def settle_deferred(self, conn: Any) -> None:
        """Settle what the delivery deferred, now (its last transaction calls this before it
        commits, so a run's end is committed with its steps settled, as without deferral)."""
        delivery = _DELIVERY.get()
        deferred = [] if delivery is None else delivery.deferred
        while deferred:
            await self._settle_logged(conn, deferred.pop(0))
        if delivery is not None and conn.is_in_transaction():
            await self._end_leases(conn, delivery)

    async def _settle_logged(self, conn: Any, d: _Due) -> None:
        try:
            await self._settle(
                conn,
                d.run,
                d.reservation.step_key,
                d.reservation.reservation_id,
                provider_calls=d.reservation.provider_calls,
                tokens=d.reservation.tokens,
                capability_calls=d.reservation.capability_calls,
            )
        except budget.BudgetUnavailable as exc:
            log.warning("run %s: settling %s later: %s", d.run.run_id, d.reservation.step_key, exc)

    async def spent(
        self,
        conn: Any,
        run: RunRow,
        key: str,
        *,
        provider_calls: int = 0,
        tokens: int = 0,
        capability_calls: int = 0,
    ) -> None:
        """The step is over: record what it used and settle it now if governance answers
        (otherwise `settle_due` does, before the run's next step)."""
        due = await self._spend(
            conn,
            run.run_id,
            key,
            provider_calls=provider_calls,
            tokens=tokens,
            capability_calls=capability_calls,
        )
        if due is None:
            return  # settled already (a redelivery), or never reserved
        delivery = _DELIVERY.get()
        if due.lease is not None:  # a draw: closed here, its lease settles for it
            known = None if delivery is None else delivery.held.get(run.run_id)
            if known is not None:
                known[key] = due
            return
        if self._defer(run, due):
            return
        try:
            await self._settle(
                conn,
                run,
                due.step_key,
                due.reservation_id,
                provider_calls=provider_calls,
                tokens=tokens,
                capability_calls=capability_calls,
            )
        except budget.BudgetUnavailable as exc:
            log.warning("run %s: settling %s later: %s", run.run_id, key, exc)

    async def credit(self, conn: Any, run: RunRow, key: str) -> None:
        """The capability call reserved under `key` was definitely not carried out: have
        governance give back what its spend charge holds or took, now, before the delivery
        commits. Governance credits a charge once, so a redelivered outcome asks again
        harmlessly; the reservation is settled as any other. (A priced call's reservation
        is its own, even as a draw: a run a cap covers gets no lease beyond the asking step.)

        Raises:
            BudgetUnavailable: governance did not answer (retry the delivery): a charge is
                never left counted for a call that did not happen.
        """
        delivery = _DELIVERY.get()
        known = None if delivery is None else delivery.held.get(run.run_id)
        held = (
            known.get(key)
            if known is not None
            else await self._store.reservation(conn, run.run_id, key)
        )
        if held is None or not held.reservation_id:
            return
        try:
            await budget.credit(
                self._nc,
                tenant=run.tenant,
                run_id=budget_run_id(run),
                reservation_id=held.reservation_id,
                timeout=self._timeout,
            )
        except budget.NoSuchReservation:
            log.warning("run %s: governance knows no reservation %s", run.run_id, key)

    async def provider_call(self, conn: Any, run: RunRow, key: str, call: Any) -> Any:
        """Await a provider call reserved under `key`; one that fails for good settles what it
        used (the step is abandoned), one that may succeed later keeps its reservation for the
        retry."""
        try:
            return await call
        except PermanentError as exc:
            used = getattr(getattr(exc, "call", None), "total_tokens", 0) or 0
            await self.spent(conn, run, key, provider_calls=1, tokens=used)
            raise

    async def settle_due(self, conn: Any, run: RunRow) -> None:
        """Settle what earlier steps used and governance has not acknowledged yet.

        Raises:
            BudgetUnavailable: governance did not answer (retry the delivery).
        """
        delivery = _DELIVERY.get()
        known = None if delivery is None else delivery.held.get(run.run_id)
        dues = (
            sorted((r for r in known.values() if r.state == "due"), key=lambda r: r.step_key)
            if known is not None
            else await self._store.due(conn, run.run_id)
        )
        for due in dues:
            if self._defer(run, due):
                continue
            await self._settle(
                conn,
                run,
                due.step_key,
                due.reservation_id,
                provider_calls=due.provider_calls,
                tokens=due.tokens,
                capability_calls=due.capability_calls,
            )

    @staticmethod
    def _defer(run: RunRow, due: Reservation) -> bool:
        """Keep `due` for the next reservation of its run, if in a `deferring` scope."""
        delivery = _DELIVERY.get()
        if delivery is None:
            return False
        deferred = delivery.deferred
        if all(
            d.reservation.step_key != due.step_key or d.run.run_id != run.run_id for d in deferred
        ):
            deferred.append(_Due(run=run, reservation=due))
        return True

    async def _settle(
        self,
        conn: Any,
        run: RunRow,
        key: str,
        reservation_id: str,
        *,
        provider_calls: int,
        tokens: int,
        capability_calls: int,
    ) -> None:
        try:
            await budget.settle(
                self._nc,
                tenant=run.tenant,
                run_id=budget_run_id(run),
                reservation_id=reservation_id,
                provider_calls=provider_calls,
                tokens=tokens,
                capability_calls=capability_calls,
                timeout=self._timeout,
            )
        except budget.NoSuchReservation:
            log.warning(
                "run %s: governance knows no reservation %s (%s)", run.run_id, reservation_id, key
            )
        await self._close(conn, run.run_id, key)


def _lease_prefix(run: RunRow) -> str:
    return f"{run.run_id}:lease:"
