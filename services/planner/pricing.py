"""What a capability call's price is read from, where the tenant has spend caps: its action
contract (or read tool) and the amount its frozen arguments carry. Governance prices it
(services/governance/spend.py); the planner only says what the call is."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from schemas.admission import ProposalRefused
from schemas.dispatcher import CommandOutcome

__all__ = ["Priced", "not_carried_out", "priced_call"]

_NAME = re.compile(r"^[^\s]{1,128}$")
_CURRENCY = re.compile(r"^[A-Z]{3}$")
# A proposal refused so is definitely not carried out: nothing was admitted for it. `ask` waits
# for a person (its answer decides); `conflict` names an operation that may have run.
_REFUSED_UNDONE = frozenset({"deny", "invalid", "rejected", "revise"})
# A command ending so definitely did not act; `succeeded` did, and `unknown` may have.
_ENDED_UNDONE = frozenset({"denied", "expired", "revision_required", "failed"})
# `amount_cents` as the money actions freeze it (actions/payment_*.py), at most 100,000,000.
_MAX_CENTS = 10**12


class Priced(msgspec.Struct, frozen=True, kw_only=True):
    """A capability call as governance prices it: `ReserveBudget`'s action, amount and
    currency. Governance grants a run its tenant's caps cover no lease beyond the step that
    asks it, so no priced call ever draws on another step's reservation: each is held and
    charged once, at its own price."""

    action: str
    amount: str | None = None
    currency: str | None = None

    def asks(self) -> dict[str, Any]:
        return {"action": self.action, "amount": self.amount, "currency": self.currency}


def priced_call(action: str, arguments: dict[str, Any]) -> Priced | None:
    """The call of `action` on `arguments` as governance prices it; None for a name no price
    table can list. An amount is read from `amount_cents` (minor units, two decimals) and
    `currency`, when both are well formed; otherwise the call carries none (and a table
    that reads its amount refuses it)."""
    if not _NAME.match(action):
        return None
    cents, currency = arguments.get("amount_cents"), arguments.get("currency")
    if (
        isinstance(cents, int)
        and not isinstance(cents, bool)
        and 0 <= cents < _MAX_CENTS
        and isinstance(currency, str)
        and _CURRENCY.match(currency)
    ):
        return Priced(action=action, amount=f"{cents // 100}.{cents % 100:02d}", currency=currency)
    return Priced(action=action)


def not_carried_out(event: CommandOutcome | ProposalRefused) -> bool:
    """Whether the capability call this outcome or refusal ends was definitely not carried
    out: then what spend caps charged for it is given back (`RunBudgets.credit`). Where
    nobody knows (`unknown`), it stays charged: the cautious side."""
    if isinstance(event, ProposalRefused):
        return event.verdict in _REFUSED_UNDONE
    return event.state in _ENDED_UNDONE
