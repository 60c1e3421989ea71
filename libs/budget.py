"""Run budgets from the caller's side: reserve before a step starts, settle when it ends.

Governance keeps the budgets (docs/design.md §1, §3 invariant 9); this is the request/reply client a
planner calls around every provider call and capability call:

    held = await reserve(nc, tenant=t, run_id=r, step_key=f"{r}:{step}:model",
                         provider_calls=1, tokens=max_tokens)   # BudgetExhausted: stop here
    reply = await provider.complete(...)  # failed before any call: release(...) instead
    await settle(nc, tenant=t, run_id=r, reservation_id=held.reservation_id,
                 provider_calls=1, tokens=reply.usage.total_tokens)

A step key names the step, not the attempt: a step redelivered after a crash asks again with
the same key and gets the same reservation back (its `status` says whether it was closed).
"""

from __future__ import annotations

from typing import Final

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from libs.deadline import timed_request
from libs.errors import PermanentError, RetryableError
from schemas import subjects
from schemas.governance import (
    BudgetRefused,
    BudgetReserved,
    BudgetSettled,
    LeaseAmounts,
    ReserveBudget,
    RunBudget,
    SettleBudget,
    Settlement,
)

__all__ = [
    "BudgetExhausted",
    "BudgetUnavailable",
    "NoBudget",
    "NoSuchReservation",
    "credit",
    "release",
    "reserve",
    "settle",
]

DEFAULT_TIMEOUT_S: Final = 2.0
_ENCODER: Final = msgspec.json.Encoder()
_RESERVE_REPLY: Final = msgspec.json.Decoder(BudgetReserved | BudgetRefused)
_SETTLE_REPLY: Final = msgspec.json.Decoder(BudgetSettled)


class NoBudget(PermanentError):
    """Governance refused the reservation: the step must not start.

    `budget` is the BudgetKind that ran out, or `unknown_run` (no budget recorded for the run).
    """

    def __init__(
        self, msg: str, *, budget: str, run_id: str, step_key: str, settled: list[str] | None = None
    ) -> None:
        super().__init__(msg)
        self.budget, self.run_id, self.step_key = budget, run_id, step_key
        # The settlements the refused reserve carried, closed all the same.
        self.settled = settled or []


class BudgetExhausted(NoBudget):
    """A budget of the run ran out (`kind`): schedule no new step; don't ask the model.

    `concurrent_steps` is the exception that frees itself: the step may be scheduled again
    once a step in flight settles.
    """

    @property
    def kind(self) -> str:
        """The budget that ran out: provider_calls, tokens, capability_calls, wall_time or
        concurrent_steps."""
        return self.budget


class BudgetUnavailable(RetryableError):
    """Governance did not answer, or cannot read its store: nothing was reserved (or settled)
    yet. Try again later; never start the step meanwhile."""


class NoSuchReservation(PermanentError, LookupError):
    """Governance knows no such reservation for this run."""


async def reserve(
    nc: Client,
    *,
    tenant: str,
    run_id: str,
    step_key: str,
    provider_calls: int = 0,
    tokens: int = 0,
    capability_calls: int = 0,
    limit: RunBudget | None = None,
    settle: list[Settlement] | None = None,
    up_to: LeaseAmounts | None = None,
    model: str | None = None,
    action: str | None = None,
    amount: str | None = None,
    currency: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> BudgetReserved:
    """Reserve what one step may spend, all kinds at once (both or neither); `limit`, the
    caller's own limits for the run, lowers the run's limits first (never raises them).
    `settle`: earlier reservations of the run closed first, in the same transaction (one
    round trip for both); they are closed even when the reservation is refused
    (`NoBudget.settled` lists them then). `up_to`: a lease, reserved up to these amounts
    where the run has them (`BudgetReserved` says what it got). `model` ("provider/model"),
    `action`, `amount` and its `currency`: what the step's cost is read from where the tenant
    has spend caps.

    Raises:
        BudgetExhausted: a budget ran out (`.kind` says which).
        NoBudget: governance has no budget for this run.
        BudgetUnavailable: no answer, or governance cannot read its store (fail closed):
            nothing was reserved or settled.
    """
    ask = ReserveBudget(
        tenant=tenant,
        run_id=run_id,
        step_key=step_key,
        provider_calls=provider_calls,
        tokens=tokens,
        capability_calls=capability_calls,
        limit=limit,
        settle=settle or [],
        up_to=up_to,
        model=model,
        action=action,
        amount=amount,
        currency=currency,
    )
    answer = _RESERVE_REPLY.decode(await _request(nc, subjects.RESERVE, ask, timeout))
    if isinstance(answer, BudgetReserved):
        return answer
    if answer.budget == "unavailable":
        raise BudgetUnavailable(answer.reason)
    error = NoBudget if answer.budget == "unknown_run" else BudgetExhausted
    raise error(
        answer.reason,
        budget=answer.budget,
        run_id=run_id,
        step_key=step_key,
        settled=answer.settled,
    )


async def settle(
    nc: Client,
    *,
    tenant: str,
    run_id: str,
    reservation_id: str,
    provider_calls: int = 0,
    tokens: int = 0,
    capability_calls: int = 0,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> BudgetSettled:
    """Close a reservation with what the step really used (more than reserved is recorded).

    Settling again returns what was recorded the first time.

    Raises:
        NoSuchReservation: governance knows no such reservation for this run.
        BudgetUnavailable: no answer, or governance failed to record it: settle again.
    """
    return await _close(
        nc,
        SettleBudget(
            tenant=tenant,
            run_id=run_id,
            reservation_id=reservation_id,
            provider_calls=provider_calls,
            tokens=tokens,
            capability_calls=capability_calls,
        ),
        timeout,
    )


async def release(
    nc: Client,
    *,
    tenant: str,
    run_id: str,
    reservation_id: str,
    provider_calls: int = 0,
    tokens: int = 0,
    capability_calls: int = 0,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> BudgetSettled:
    """Close the reservation of an abandoned step, recording what it did use (usually 0)."""
    return await _close(
        nc,
        SettleBudget(
            tenant=tenant,
            run_id=run_id,
            reservation_id=reservation_id,
            provider_calls=provider_calls,
            tokens=tokens,
            capability_calls=capability_calls,
            release=True,
        ),
        timeout,
    )


async def credit(
    nc: Client, *, tenant: str, run_id: str, reservation_id: str, timeout: float = DEFAULT_TIMEOUT_S
) -> BudgetSettled:
    """Give back what a reservation's spend charge holds or took from its caps: its
    capability call was definitely not carried out. Once, however often it is asked; the
    reservation is still closed by its own settlement.

    Raises:
        NoSuchReservation: governance knows no such reservation for this run.
        BudgetUnavailable: no answer, or governance failed to record it: ask again.
    """
    return await _close(
        nc,
        SettleBudget(tenant=tenant, run_id=run_id, reservation_id=reservation_id, credit=True),
        timeout,
    )


async def _close(nc: Client, ask: SettleBudget, timeout: float) -> BudgetSettled:
    return _SETTLE_REPLY.decode(await _request(nc, subjects.SETTLE, ask, timeout))


async def _request(nc: Client, subject: str, ask: msgspec.Struct, timeout: float) -> bytes:
    try:
        reply = await timed_request(nc, subject, _ENCODER.encode(ask), timeout=timeout)
    except (NatsTimeoutError, NoRespondersError) as exc:
        raise BudgetUnavailable(f"governance did not answer: {exc!r}") from exc
    headers = reply.headers or {}
    code = headers.get("Nats-Service-Error-Code")
    if code == "400":
        raise PermanentError(
            f"governance refused the request: {headers.get('Nats-Service-Error', '')}"
        )
    if code == "404":
        raise NoSuchReservation(headers.get("Nats-Service-Error", "no such reservation"))
    if code:
        raise BudgetUnavailable(f"governance error {code}: {headers.get('Nats-Service-Error', '')}")
    return reply.data
