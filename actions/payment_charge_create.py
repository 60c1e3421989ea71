"""`payment.charge.create`: charge a customer through the payment provider.

External and NOT idempotent: a lost response ends `unknown` (needs reconciliation) unless the
provider can be queried by the operation's key.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from actions.base import ActionContract, ProviderCall, ProviderLookup, money

__all__ = ["ChargeArguments", "PaymentChargeCreate"]


class ChargeArguments(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The request, which is also the frozen arguments and the preview."""

    customer_id: Annotated[str, msgspec.Meta(pattern=r"^[A-Z0-9][A-Z0-9-]{0,63}(?!\n)$")]
    amount_cents: Annotated[int, msgspec.Meta(ge=1, le=100_000_000)]
    currency: Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{3}(?!\n)$")]
    description: Annotated[str, msgspec.Meta(min_length=1, max_length=500)]


class PaymentChargeCreate(
    ActionContract[ChargeArguments, ChargeArguments, ChargeArguments, msgspec.Struct]
):
    name: ClassVar[str] = "payment.charge.create"
    version: ClassVar[int] = 1
    family = "write_delete"
    effects = frozenset({"money"})  # never covered by a standing grant: asked every time
    connector: ClassVar[str] = "payments"
    description: ClassVar[str] = "Charge a customer."
    request = ChargeArguments
    arguments = ChargeArguments
    preview = ChargeArguments
    reach = frozenset({"amount_cents"})
    two_approvers_from_cents = 50_000  # 500.00 in the currency: four eyes
    free_text = frozenset({"description"})
    matches = {"currency": "casefold"}

    def describe(self, preview: ChargeArguments) -> list[tuple[str, str]]:
        """The amount as a person reads it, with its currency: never a count of cents."""
        return [
            ("Customer", preview.customer_id),
            ("Amount to charge", money(preview.amount_cents, preview.currency)),
            ("Description", preview.description),
        ]

    def provider_call(self, arguments: ChargeArguments) -> ProviderCall:
        return ProviderCall(
            path="/v1/charges", body=msgspec.to_builtins(arguments), receipt="charge_id"
        )

    def provider_lookup(self, key: str) -> ProviderLookup:
        return ProviderLookup(
            path="/v1/charges", params={"reference": key}, listed_as="charges", receipt="charge_id"
        )
