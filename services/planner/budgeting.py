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
in its last transaction (`settle_deferred`), before it commits and before its messages are
published. The settlement is recorded `due` in the step's
transaction as before, so a crash in between leaves it to `settle_due`, and nothing waits
longer than the delivery that spent it. Outside a delivery's scope (an answered review, a chat
turn's endpoint) a step is settled as soon as it is spent.

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
from schemas.governance import Settlement
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
    """Reserve and settle the run's budgets in governance around the planner's steps."""

    def __init__(self, *, nc: Client, store: PlannerStore, timeout: float = 2.0) -> None:
        self._nc, self._store, self._timeout = nc, store, timeout

    async def reserve(self, conn: Any, run: RunRow, key: str, *, provider_calls: int = 0,
                      tokens: int = 0, capability_calls: int = 0) -> tuple[str, bool]:
        """The step's reservation id, and whether the planner recorded it just now: the
        recorded one, else a new (or governance's existing) reservation for this key, recorded
        open in the caller's transaction.

        Raises:
            BudgetExhausted: a budget of the run ran out (`.kind`); nothing was reserved.
            NoBudget: governance has no budget for the run.
            BudgetUnavailable: governance did not answer (retry the delivery).
        """
        delivery = _DELIVERY.get()
        known = None if delivery is None else delivery.held.get(run.run_id)
        held = (known.get(key) if known is not None
                else await self._store.reservation(conn, run.run_id, key))
        if held is not None:
            return held.reservation_id, False
        funds = budget_run_id(run)
        deferred = None if delivery is None else delivery.deferred
        carried = [d for d in deferred or () if budget_run_id(d.run) == funds]
        try:
            reserved = await budget.reserve(
                self._nc, tenant=run.tenant, run_id=funds, step_key=key,
                provider_calls=provider_calls, tokens=tokens, capability_calls=capability_calls,
                limit=manifest_limit(run.manifest), timeout=self._timeout,
                settle=[Settlement(reservation_id=d.reservation.reservation_id,
                                   provider_calls=d.reservation.provider_calls,
                                   tokens=d.reservation.tokens,
                                   capability_calls=d.reservation.capability_calls)
                        for d in carried])
        except budget.NoBudget as exc:
            await self._carried(conn, deferred, carried, exc.settled)
            raise
        closing = self._carried_keys(deferred, carried, reserved.settled)
        new = await self._store.hold(conn, run.run_id, key, reserved.reservation_id,
                                     closing=closing)
        if known is not None:
            known[key] = Reservation(step_key=key, reservation_id=reserved.reservation_id,
                                     state="open")
        return reserved.reservation_id, new

    def known(self, run: RunRow, reservations: list[Reservation]) -> None:
        """The locked run's reservations as just read (with its steps), so that this
        delivery's reservations of it need no query of their own (in a `deferring` scope)."""
        delivery = _DELIVERY.get()
        if delivery is not None:
            delivery.held[run.run_id] = {r.step_key: r for r in reservations}

    @staticmethod
    def _carried_keys(deferred: list[_Due] | None, carried: list[_Due],
                      settled: list[str]) -> dict[str, list[str]]:
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

    async def _carried(self, conn: Any, deferred: list[_Due] | None, carried: list[_Due],
                       settled: list[str]) -> None:
        for run_id, keys in self._carried_keys(deferred, carried, settled).items():
            await self._store.closed(conn, run_id, *keys)

    @contextlib.asynccontextmanager
    async def deferring(self, conn: Any) -> AsyncIterator[None]:
        """Within this scope (one delivery's work), settlements wait for the next reservation
        of their run and travel with it; what is left is settled on leaving it, on `conn`
        (outside any transaction). If the work fails, nothing is sent: what it recorded due
        and committed is `settle_due`'s on the next delivery."""
        token = _DELIVERY.set(_Delivery())
        try:
            yield
            await self.settle_deferred(conn)
        finally:
            _DELIVERY.reset(token)

    async def settle_deferred(self, conn: Any) -> None:
        """Settle what the delivery deferred, now (its last transaction calls this before it
        commits, so a run's end is committed with its steps settled, as without deferral)."""
        delivery = _DELIVERY.get()
        deferred = [] if delivery is None else delivery.deferred
        while deferred:
            d = deferred.pop(0)
            try:
                await self._settle(conn, d.run, d.reservation.step_key,
                                   d.reservation.reservation_id,
                                   provider_calls=d.reservation.provider_calls,
                                   tokens=d.reservation.tokens,
                                   capability_calls=d.reservation.capability_calls)
            except budget.BudgetUnavailable as exc:
                log.warning("run %s: settling %s later: %s", d.run.run_id,
                            d.reservation.step_key, exc)

    async def spent(self, conn: Any, run: RunRow, key: str, *, provider_calls: int = 0,
                    tokens: int = 0, capability_calls: int = 0) -> None:
        """The step is over: record what it used and settle it now if governance answers
        (otherwise `settle_due` does, before the run's next step)."""
        due = await self._store.spent(conn, run.run_id, key, provider_calls=provider_calls,
                                      tokens=tokens, capability_calls=capability_calls)
        if due is None:
            return  # settled already (a redelivery), or never reserved
        if self._defer(run, due):
            return
        try:
            await self._settle(conn, run, due.step_key, due.reservation_id,
                               provider_calls=provider_calls, tokens=tokens,
                               capability_calls=capability_calls)
        except budget.BudgetUnavailable as exc:
            log.warning("run %s: settling %s later: %s", run.run_id, key, exc)

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
        dues = (sorted((r for r in known.values() if r.state == "due"), key=lambda r: r.step_key)
                if known is not None else await self._store.due(conn, run.run_id))
        for due in dues:
            if self._defer(run, due):
                continue
            await self._settle(conn, run, due.step_key, due.reservation_id,
                               provider_calls=due.provider_calls, tokens=due.tokens,
                               capability_calls=due.capability_calls)

    @staticmethod
    def _defer(run: RunRow, due: Reservation) -> bool:
        """Keep `due` for the next reservation of its run, if in a `deferring` scope."""
        delivery = _DELIVERY.get()
        if delivery is None:
            return False
        deferred = delivery.deferred
        if all(d.reservation.step_key != due.step_key or d.run.run_id != run.run_id
               for d in deferred):
            deferred.append(_Due(run=run, reservation=due))
        return True

    async def _settle(self, conn: Any, run: RunRow, key: str, reservation_id: str, *,
                      provider_calls: int, tokens: int, capability_calls: int) -> None:
        try:
            await budget.settle(self._nc, tenant=run.tenant, run_id=budget_run_id(run),
                                reservation_id=reservation_id, provider_calls=provider_calls,
                                tokens=tokens, capability_calls=capability_calls,
                                timeout=self._timeout)
        except budget.NoSuchReservation:
            log.warning("run %s: governance knows no reservation %s (%s)", run.run_id,
                        reservation_id, key)
        await self._store.closed(conn, run.run_id, key)
