"""`payment.refund`: refund the discount a payment line should have had (the approval-contracts
note's
`order.refund_missing_discount`).

External and NOT idempotent. The model names the payment and the line, nothing more: the amount
is computed by code from the line's discount, and the destination is resolved by code to the
payment's own method. A request naming an amount or a destination account is refused. A lost
response ends in `needs_reconciliation`, never in a second refund.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec

from actions.base import (
    ActionContract,
    FactsRef,
    Frozen,
    Invalid,
    ProviderCall,
    ProviderLookup,
    Stale,
    money,
)

__all__ = ["PaymentFacts", "PaymentRefund", "RefundArguments", "RefundPreview", "RefundRequest"]

ProviderId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}(?!\n)$")]


class RefundRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """All the model may say: which payment, which line, and that the money goes back to where
    it came from (the only destination this contract knows)."""

    payment_id: ProviderId
    line_id: ProviderId
    destination: Literal["original_method"] = "original_method"


class Destination(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A concrete destination, resolved by code before anyone approves anything."""

    kind: Literal["original_method"]
    last4: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{4}(?!\n)$")]


class RefundArguments(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What execution needs, frozen at proposal time."""

    payment_id: ProviderId
    line_id: ProviderId
    discount_id: ProviderId
    amount_cents: Annotated[int, msgspec.Meta(ge=1, le=100_000_000)]
    currency: Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{3}(?!\n)$")]
    destination: Destination


class RefundPreview(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an approver reads: every effect of the refund."""

    participant: str
    product: str
    discount: str
    payment_method: str
    amount_cents: int
    currency: str
    current_total_cents: int
    resulting_total_cents: int
    destination: str
    # The provider's payment id (previews frozen before it was shown have none).
    payment: str = ""


# The provider's view of a payment (GET /v1/payments/{id}); fields it adds later are ignored.
class _Discount(msgspec.Struct, frozen=True, kw_only=True):
    discount_id: str
    name: str
    amount_cents: int


class _Line(msgspec.Struct, frozen=True, kw_only=True):
    line_id: str
    product: str
    participant: str
    amount_cents: int
    discount: _Discount | None = None


class _Method(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    last4: str
    usable: bool


class _Refund(msgspec.Struct, frozen=True, kw_only=True):
    refund_id: str
    line_id: str
    amount_cents: int
    reference: str | None = None


class PaymentFacts(msgspec.Struct, frozen=True, kw_only=True):
    """The state a refund's preview stands on."""

    payment_id: str
    currency: str
    status: str
    method: _Method
    lines: list[_Line]
    amount_cents: int
    refunded_cents: int
    refunds: list[_Refund] = []


class PaymentRefund(ActionContract[RefundRequest, RefundArguments, RefundPreview, PaymentFacts]):
    name: ClassVar[str] = "payment.refund"
    version: ClassVar[int] = 1
    family = "write_delete"
    effects = frozenset({"money"})  # never covered by a standing grant: asked every time
    connector: ClassVar[str] = "payments"
    description: ClassVar[str] = (
        "Refund the discount missing from one line of a payment, to the payment's own method. "
        "Name the payment and the line; the amount and destination are computed."
    )
    request = RefundRequest
    arguments = RefundArguments
    preview = RefundPreview
    reach = frozenset({"amount_cents"})
    two_approvers_from_cents = 50_000  # 500.00 in the currency: four eyes
    facts = PaymentFacts

    def facts_ref(self, request: RefundRequest) -> FactsRef:
        return FactsRef(kind="payment", id=request.payment_id)

    def facts_ref_of(self, arguments: RefundArguments) -> FactsRef:
        return FactsRef(kind="payment", id=arguments.payment_id)

    def resolve(
        self, request: RefundRequest, facts: PaymentFacts | None, *, key: str | None = None
    ) -> Frozen[RefundArguments, RefundPreview]:
        if facts is None:
            raise Invalid(f"payment {request.payment_id} was not found")
        if facts.status != "captured":
            raise Invalid(f"payment {facts.payment_id} is {facts.status}, not refundable")
        line = next((ln for ln in facts.lines if ln.line_id == request.line_id), None)
        if line is None:
            raise Invalid(f"payment {facts.payment_id} has no line {request.line_id}")
        if line.discount is None:
            raise Invalid(f"line {line.line_id} has no discount to refund")
        # Refunds made under this very operation's key are this operation, not another one.
        others = [r for r in facts.refunds if key is None or r.reference != key]
        if any(r.line_id == line.line_id for r in others):
            raise Invalid(f"line {line.line_id} was already refunded")
        amount = line.discount.amount_cents
        refunded = sum(r.amount_cents for r in others)
        if facts.amount_cents - refunded < amount:
            raise Invalid(f"payment {facts.payment_id} has less than the amount left to refund")
        if not facts.method.usable:
            raise Invalid("the payment's own method can no longer receive refunds")
        destination = Destination(kind="original_method", last4=facts.method.last4)
        method = f"{facts.method.kind} ending {facts.method.last4}"
        current = facts.amount_cents - refunded
        return self.checked(
            Frozen(
                arguments=RefundArguments(
                    payment_id=facts.payment_id,
                    line_id=line.line_id,
                    discount_id=line.discount.discount_id,
                    amount_cents=amount,
                    currency=facts.currency,
                    destination=destination,
                ),
                preview=RefundPreview(
                    participant=line.participant,
                    product=line.product,
                    discount=line.discount.name,
                    payment_method=method,
                    amount_cents=amount,
                    currency=facts.currency,
                    current_total_cents=current,
                    resulting_total_cents=current - amount,
                    destination=method,
                    payment=facts.payment_id,
                ),
            )
        )

    def revalidate(
        self,
        arguments: RefundArguments,
        preview: RefundPreview,
        facts: PaymentFacts | None,
        *,
        key: str,
    ) -> None:
        request = RefundRequest(payment_id=arguments.payment_id, line_id=arguments.line_id)
        try:
            now = self.resolve(request, facts, key=key)
        except Invalid as exc:
            raise Stale(f"{exc}; a new proposal is needed") from None
        if now.arguments.discount_id != arguments.discount_id:
            raise Stale("the line's discount changed since it was proposed")
        if now.arguments.amount_cents != arguments.amount_cents:
            raise Stale(
                f"the refund would now be {now.arguments.amount_cents} cents, not the "
                f"{arguments.amount_cents} approved; a new proposal is needed"
            )
        if now.arguments.destination != arguments.destination:
            raise Stale("the payment's method changed since it was proposed")
        totals = ("current_total_cents", "resulting_total_cents")
        if any(getattr(now.preview, f) != getattr(preview, f) for f in totals):
            raise Stale("the order changed since it was proposed (its totals differ)")
        if not preview.payment:  # frozen before the preview named its payment
            preview = msgspec.structs.replace(preview, payment=now.preview.payment)
        if now.preview != preview:
            raise Stale(
                "the payment's method, line, discount or currency shown changed since "
                "it was proposed; a new proposal is needed"
            )

    def describe(self, preview: RefundPreview) -> list[tuple[str, str]]:
        """Every effect of the refund, as the approval-contracts note's refund check shows it."""
        c = preview.currency
        return [
            ("Participant", preview.participant),
            ("Product", preview.product),
            ("Discount", preview.discount),
            ("Payment", preview.payment or "(not recorded)"),
            ("Payment method", preview.payment_method),
            ("Amount to refund", money(preview.amount_cents, c)),
            ("Destination", preview.destination),
            ("Current order total", money(preview.current_total_cents, c)),
            ("Resulting order total", money(preview.resulting_total_cents, c)),
            ("Currency", c),
        ]

    def provider_call(self, arguments: RefundArguments) -> ProviderCall:
        return ProviderCall(
            path="/v1/refunds",
            receipt="refund_id",
            body={
                "payment_id": arguments.payment_id,
                "line_id": arguments.line_id,
                "amount_cents": arguments.amount_cents,
                "destination": msgspec.to_builtins(arguments.destination),
            },
        )

    def provider_lookup(self, key: str) -> ProviderLookup:
        return ProviderLookup(
            path="/v1/refunds", params={"reference": key}, listed_as="refunds", receipt="refund_id"
        )

    def render(self, receipt: str | None) -> str:
        return f"Refund issued ({receipt or 'no receipt'})."
