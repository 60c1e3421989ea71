"""Action contracts (the approval-contracts note): strict requests, arguments and previews computed
by code from facts, revalidation that blocks a stale approval, and the outcome vocabulary."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import msgspec
import pytest

from actions import ACTIONS
from actions.base import FactsRef, Frozen, Invalid, Outcome, Stale, outcome_of
from actions.crm_note_create import CrmNoteCreate
from actions.email_draft_apply import DraftArguments, DraftFacts, DraftPreview
from actions.payment_charge_create import PaymentChargeCreate
from actions.payment_refund import (
    Destination,
    PaymentFacts,
    PaymentRefund,
    RefundArguments,
    RefundPreview,
    RefundRequest,
)
from schemas.planner import ProposeCommand
from services.admission.logic import canonical_hash, resolve, validate

_REFUND = ACTIONS["payment.refund"]
assert isinstance(_REFUND, PaymentRefund)
REFUND = _REFUND
DRAFT = ACTIONS["email.draft.apply"]
KEY = "acme:op-1"

# -- facts --------------------------------------------------------------------------------

# A payment as the provider's GET /v1/payments/{id} shows it, with the fields the contract does
# not read (customer_id, per-line refunded_cents, a refund's destination and created_at).
PAYMENT: dict[str, Any] = {
    "payment_id": "pay_1",
    "customer_id": "ACME-42",
    "currency": "EUR",
    "status": "captured",
    "method": {"kind": "card", "last4": "4242", "usable": True},
    "lines": [
        {
            "line_id": "L1",
            "product": "Winter league",
            "participant": "Ada Lovelace",
            "amount_cents": 12000,
            "refunded_cents": 0,
            "discount": {"discount_id": "D1", "name": "Junior", "amount_cents": 1500},
        },
        {
            "line_id": "L2",
            "product": "Skate rental",
            "participant": "Ada Lovelace",
            "amount_cents": 3000,
            "refunded_cents": 0,
            "discount": None,
        },
        {
            "line_id": "L3",
            "product": "Winter league",
            "participant": "Grace Hopper",
            "amount_cents": 5000,
            "refunded_cents": 0,
            "discount": {"discount_id": "D3", "name": "Sibling", "amount_cents": 500},
        },
    ],
    "amount_cents": 20000,
    "refunded_cents": 0,
    "refunds": [],
}

DRAFT_FACTS: dict[str, Any] = {
    "draft_id": "spring-news",
    "subject": "Spring league opens",
    "body": "Sign up by May 1.",
    "segment": "members",
    "state": "draft",
    "recipients": 42,
}


def payment(**changes: Any) -> dict[str, Any]:
    """The provider's view of PAYMENT with top-level fields changed."""
    return {**copy.deepcopy(PAYMENT), **changes}


def line(raw: dict[str, Any], line_id: str) -> dict[str, Any]:
    return next(ln for ln in raw["lines"] if ln["line_id"] == line_id)


def refunded(
    raw: dict[str, Any], line_id: str, amount: int, reference: str | None
) -> dict[str, Any]:
    """`raw` after the provider made a refund, as its view then shows it."""
    out = copy.deepcopy(raw)
    out["refunds"].append(
        {
            "refund_id": f"re_{len(out['refunds']) + 1}",
            "reference": reference,
            "payment_id": out["payment_id"],
            "line_id": line_id,
            "amount_cents": amount,
            "currency": out["currency"],
            "destination": {"kind": "original_method", "last4": out["method"]["last4"]},
            "created_at": "2025-01-01T00:00:00.000+00:00",
        }
    )
    line(out, line_id)["refunded_cents"] += amount
    out["refunded_cents"] += amount
    return out


def facts(raw: dict[str, Any] | None = None) -> PaymentFacts:
    return REFUND.decode_facts(payment() if raw is None else raw)


def ask(line_id: str = "L1", payment_id: str = "pay_1") -> RefundRequest:
    return REFUND.decode_request({"payment_id": payment_id, "line_id": line_id})


def proposed() -> Frozen[RefundArguments, RefundPreview]:
    return REFUND.resolve(ask(), facts())


def draft_facts(**changes: Any) -> DraftFacts:
    return DRAFT.decode_facts({**DRAFT_FACTS, **changes})


def draft_proposed() -> Frozen[DraftArguments, DraftPreview]:
    return DRAFT.resolve(DRAFT.decode_request({"draft_id": "spring-news"}), draft_facts())


def assert_safe_sentence(message: str) -> None:
    """Shown to a person: a plain sentence, not a dump."""
    assert len(message) > 15 and " " in message
    assert "\n" not in message and "Traceback" not in message
    assert "Error" not in message and "<" not in message


# -- every contract: its request, arguments and preview ----------------------------------

# A valid request per action, what each request field may not be (with the field the error
# must name), and facts to resolve against.
VALID: dict[str, dict[str, Any]] = {
    "crm.note.create": {"customer_id": "ACME-42", "body": "Called back about the invoice."},
    "payment.charge.create": {
        "customer_id": "ACME-42",
        "amount_cents": 1250,
        "currency": "EUR",
        "description": "Invoice 7",
    },
    "payment.refund": {"payment_id": "pay_1", "line_id": "L1"},
    "email.draft.apply": {"draft_id": "spring-news"},
    "writ.noop": {"marker": "canary"},
    "host.ticket.comment.create": {"ticket_id": "T-1001", "body": "We refunded the shipping."},
    "host.ticket.update": {"ticket_id": "T-1001", "status": "solved"},
}
# The ticket as the host's `ticket.get` MCP tool returns it (read by retrieval).
TICKET: dict[str, Any] = {
    "ticket_id": "T-1001",
    "customer_id": "CUST-42",
    "subject": "Order 7781 shipped late",
    "status": "open",
    "priority": "high",
    "revision": "r3",
    "comments": 2,
}
FACTS: dict[str, Any] = {
    "payment.refund": PAYMENT,
    "email.draft.apply": DRAFT_FACTS,
    "host.ticket.comment.create": TICKET,
    "host.ticket.update": TICKET,
}

_ID64 = "A" + "b" * 63
_CUSTOMER_BAD = [
    ("", "customer_id"),
    ("acme-42", "customer_id"),
    ("ACME-42\n", "customer_id"),
    ("A" * 65, "customer_id"),
    ("-ACME", "customer_id"),
    ("ACME/42", "customer_id"),
    (42, "customer_id"),
]
_PROVIDER_ID_BAD = ["", "a" * 65, "x\n", "-x", "_x", "a/b", "a b", "a.b", 7, None]

BAD: dict[str, list[tuple[dict[str, Any], str]]] = {
    "crm.note.create": [
        *[({"customer_id": v}, f) for v, f in _CUSTOMER_BAD],
        ({"body": ""}, "body"),
        ({"body": "x" * 2001}, "body"),
        ({"body": None}, "body"),
        ({"priority": "high"}, "priority"),
    ],
    "payment.charge.create": [
        *[({"customer_id": v}, f) for v, f in _CUSTOMER_BAD],
        ({"amount_cents": 0}, "amount_cents"),
        ({"amount_cents": -5}, "amount_cents"),
        ({"amount_cents": 100_000_001}, "amount_cents"),
        ({"amount_cents": True}, "amount_cents"),
        ({"amount_cents": "1250"}, "amount_cents"),
        ({"amount_cents": 12.5}, "amount_cents"),
        ({"currency": "eur"}, "currency"),
        ({"currency": "EURO"}, "currency"),
        ({"currency": "EUR\n"}, "currency"),
        ({"currency": "EU"}, "currency"),
        ({"description": ""}, "description"),
        ({"description": "x" * 501}, "description"),
        ({"destination": "acct_9"}, "destination"),
    ],
    "payment.refund": [
        *[({"payment_id": v}, "payment_id") for v in _PROVIDER_ID_BAD],
        *[({"line_id": v}, "line_id") for v in _PROVIDER_ID_BAD],
        # What the model may not choose: the amount, any other destination, the discount.
        ({"amount_cents": 100}, "amount_cents"),
        ({"destination": "account:123"}, "destination"),
        ({"destination": {"kind": "original_method", "last4": "4242"}}, "destination"),
        ({"destination": "original_method\n"}, "destination"),
        ({"discount_id": "D1"}, "discount_id"),
        ({"currency": "EUR"}, "currency"),
    ],
    "email.draft.apply": [
        *[({"draft_id": v}, "draft_id") for v in _PROVIDER_ID_BAD],
        # Everything but the draft's name is read from the draft, never taken from the model.
        ({"subject": "Free money"}, "subject"),
        ({"recipients": 1}, "recipients"),
        ({"segment": "everyone"}, "segment"),
        ({"body": "hi"}, "body"),
    ],
    "writ.noop": [
        ({"marker": "x" * 129}, "marker"),
        ({"marker": 5}, "marker"),
        ({"marker": None}, "marker"),
        ({"extra": 1}, "extra"),
    ],
    "host.ticket.comment.create": [
        ({"ticket_id": "t-1"}, "ticket_id"),
        ({"ticket_id": "T-1\n"}, "ticket_id"),
        ({"ticket_id": "T-123456789"}, "ticket_id"),
        ({"body": ""}, "body"),
        ({"body": "x" * 2001}, "body"),
        # The revision is the host's, read at proposal time, never the model's.
        ({"revision": "r9"}, "revision"),
        ({"visibility": "public"}, "visibility"),
    ],
    "host.ticket.update": [
        ({"ticket_id": "T1001"}, "ticket_id"),
        ({"status": "closed"}, "status"),
        ({"priority": "urgent"}, "priority"),
        ({"revision": "r9"}, "revision"),
        ({"subject": "x"}, "subject"),
    ],
}

# Values exactly at a bound are accepted.
EDGE: dict[str, list[dict[str, Any]]] = {
    "crm.note.create": [
        {"customer_id": "A"},
        {"customer_id": "A" + "1" * 63},
        {"body": "x"},
        {"body": "é" * 2000},
    ],
    "payment.charge.create": [
        {"amount_cents": 1},
        {"amount_cents": 100_000_000},
        {"description": "x" * 500},
        {"customer_id": "A" * 64},
    ],
    "payment.refund": [{"payment_id": _ID64}, {"line_id": "9"}, {"destination": "original_method"}],
    "email.draft.apply": [{"draft_id": _ID64}, {"draft_id": "a_b-c"}],
    "writ.noop": [{"marker": "x" * 128}, {"marker": ""}],
    "host.ticket.comment.create": [{"body": "x" * 2000}, {"ticket_id": "T-12345678"}],
    "host.ticket.update": [{"priority": "low"}, {"status": "open", "priority": "high"}],
}


def frozen_of(name: str) -> Frozen[Any, Any]:
    contract = ACTIONS[name]
    raw = FACTS.get(name)
    return contract.resolve(
        contract.decode_request(VALID[name]), None if raw is None else contract.decode_facts(raw)
    )


def test_every_registered_contract_is_covered_here() -> None:
    assert set(ACTIONS) == set(VALID) == set(BAD) == set(EDGE)
    for name, contract in ACTIONS.items():
        assert contract.name == name and contract.version >= 1 and contract.description


@pytest.mark.parametrize(
    ("name", "fields", "named"), [(n, f, x) for n, cases in BAD.items() for f, x in cases]
)
def test_request_out_of_contract_is_invalid_and_names_the_field(
    name: str, fields: dict[str, Any], named: str
) -> None:
    contract = ACTIONS[name]
    with pytest.raises(Invalid) as caught:
        contract.decode_request({**VALID[name], **fields})
    message = str(caught.value)
    assert message.startswith(f"{name} v{contract.version}: ")
    assert named in message
    assert "\n" not in message


@pytest.mark.parametrize(("name", "fields"), [(n, f) for n, cases in EDGE.items() for f in cases])
def test_request_at_a_bound_is_accepted(name: str, fields: dict[str, Any]) -> None:
    request = ACTIONS[name].decode_request({**VALID[name], **fields})
    assert msgspec.to_builtins(request) == {
        **msgspec.to_builtins(ACTIONS[name].decode_request(VALID[name])),
        **fields,
    }


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_request_that_is_not_an_object_is_invalid(name: str) -> None:
    for raw in ([VALID[name]], "x", None):
        with pytest.raises(Invalid):
            ACTIONS[name].decode_request(raw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_missing_required_field_is_invalid(name: str) -> None:
    contract = ACTIONS[name]
    required = [f.name for f in msgspec.structs.fields(contract.request) if f.required]
    assert required or name == "writ.noop"
    for field in required:
        with pytest.raises(Invalid, match=field):
            contract.decode_request({k: v for k, v in VALID[name].items() if k != field})


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_arguments_and_preview_round_trip_through_storage(name: str) -> None:
    contract = ACTIONS[name]
    frozen = frozen_of(name)
    assert type(frozen.arguments) is contract.arguments
    assert type(frozen.preview) is contract.preview
    # As admission stores them (plain data) and as Postgres hands back jsonb (JSON text).
    for stored_args, stored_preview in (
        (msgspec.to_builtins(frozen.arguments), msgspec.to_builtins(frozen.preview)),
        (
            msgspec.json.decode(msgspec.json.encode(frozen.arguments)),
            msgspec.json.decode(msgspec.json.encode(frozen.preview)),
        ),
    ):
        assert contract.decode_arguments(stored_args) == frozen.arguments
        assert contract.decode_preview(stored_preview) == frozen.preview


@pytest.mark.parametrize(("mine", "other"), [p for p in itertools.permutations(sorted(ACTIONS), 2)])
def test_arguments_only_decode_with_their_own_contract(mine: str, other: str) -> None:
    stored = msgspec.to_builtins(frozen_of(other).arguments)
    with pytest.raises(msgspec.ValidationError):
        ACTIONS[mine].decode_arguments(stored)


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_stored_arguments_with_an_extra_field_do_not_decode(name: str) -> None:
    stored = {**msgspec.to_builtins(frozen_of(name).arguments), "smuggled": 1}
    with pytest.raises(msgspec.ValidationError, match="smuggled"):
        ACTIONS[name].decode_arguments(stored)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"amount_cents": 0}, "amount_cents"),
        ({"amount_cents": 100_000_001}, "amount_cents"),
        ({"currency": "eur"}, "currency"),
        ({"discount_id": "D1\n"}, "discount_id"),
        ({"destination": {"kind": "original_method", "last4": "42424"}}, "last4"),
        ({"destination": {"kind": "original_method", "last4": "4242\n"}}, "last4"),
        ({"destination": {"kind": "account", "last4": "4242"}}, "kind"),
        ({"destination": {"kind": "original_method", "last4": "4242", "account": "x"}}, "account"),
    ],
)
def test_stored_refund_arguments_are_bounded(changes: dict[str, Any], field: str) -> None:
    stored = {**msgspec.to_builtins(proposed().arguments), **changes}
    with pytest.raises(msgspec.ValidationError, match=field):
        REFUND.decode_arguments(stored)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"subject": "x" * 301}, "subject"),
        ({"body": "x" * 20_001}, "body"),
        ({"segment": "x" * 129}, "segment"),
        ({"recipients": 0}, "recipients"),
        ({"draft_id": "d\n"}, "draft_id"),
    ],
)
def test_stored_draft_arguments_are_bounded(changes: dict[str, Any], field: str) -> None:
    stored = {**msgspec.to_builtins(draft_proposed().arguments), **changes}
    with pytest.raises(msgspec.ValidationError, match=field):
        DRAFT.decode_arguments(stored)


# -- actions whose request is their arguments -------------------------------------------


def test_a_host_comment_freezes_the_revision_the_preview_showed() -> None:
    frozen = frozen_of("host.ticket.comment.create")
    assert frozen.arguments.revision == "r3"
    assert (frozen.preview.subject, frozen.preview.status, frozen.preview.comments_before) == (
        "Order 7781 shipped late",
        "open",
        2,
    )
    call = ACTIONS["host.ticket.comment.create"].provider_call(frozen.arguments)
    assert (call.method, call.path, call.if_match) == (
        "POST",
        "/api/v1/tickets/T-1001/comments",
        "r3",
    )
    assert call.body == {"body": "We refunded the shipping."}
    update = ACTIONS["host.ticket.update"]
    patch = update.provider_call(frozen_of("host.ticket.update").arguments)
    assert (patch.method, patch.body, patch.if_match) == ("PATCH", {"status": "solved"}, "r3")
    with pytest.raises(Invalid, match="neither"):
        update.resolve(update.decode_request({"ticket_id": "T-1001"}), update.decode_facts(TICKET))
    with pytest.raises(Invalid, match="not found"):
        ACTIONS["host.ticket.comment.create"].resolve(
            ACTIONS["host.ticket.comment.create"].decode_request(
                VALID["host.ticket.comment.create"]
            ),
            None,
        )


@pytest.mark.parametrize("name", ["crm.note.create", "writ.noop", "payment.charge.create"])
def test_request_is_the_arguments_and_the_preview_shows_them(name: str) -> None:
    contract = ACTIONS[name]
    request = contract.decode_request(VALID[name])
    frozen = contract.resolve(request, None)
    assert frozen.arguments == request
    assert msgspec.to_builtins(frozen.arguments) == VALID[name]
    assert msgspec.to_builtins(frozen.preview) == VALID[name]
    assert contract.facts is None
    assert contract.facts_ref(request) is None
    assert contract.facts_ref_of(frozen.arguments) is None
    # Nothing the preview states can go stale: there are no facts behind it.
    contract.revalidate(frozen.arguments, frozen.preview, None, key=KEY)


def test_noop_defaults_its_marker() -> None:
    contract = ACTIONS["writ.noop"]
    frozen = contract.resolve(contract.decode_request({}), None)
    assert msgspec.to_builtins(frozen.arguments) == {"marker": ""}
    assert frozen.preview == frozen.arguments


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_render_is_a_plain_sentence_with_the_receipt(name: str) -> None:
    assert "rcpt-9" in ACTIONS[name].render("rcpt-9")
    assert ACTIONS[name].render(None)


# -- payment.refund: resolve -------------------------------------------------------------


def test_refund_amount_and_destination_are_computed_by_code() -> None:
    frozen = proposed()
    assert frozen.arguments == RefundArguments(
        payment_id="pay_1",
        line_id="L1",
        discount_id="D1",
        amount_cents=1500,
        currency="EUR",
        destination=Destination(kind="original_method", last4="4242"),
    )
    assert frozen.preview == RefundPreview(
        participant="Ada Lovelace",
        product="Winter league",
        discount="Junior",
        payment_method="card ending 4242",
        amount_cents=1500,
        currency="EUR",
        current_total_cents=20000,
        resulting_total_cents=18500,
        destination="card ending 4242",
        payment="pay_1",
    )


def test_refund_amount_follows_the_line_discount_not_the_first_line() -> None:
    frozen = REFUND.resolve(ask("L3"), facts())
    assert (frozen.arguments.line_id, frozen.arguments.discount_id) == ("L3", "D3")
    assert frozen.arguments.amount_cents == 500
    assert (frozen.preview.participant, frozen.preview.discount) == ("Grace Hopper", "Sibling")
    assert frozen.preview.resulting_total_cents == 19500


def test_refund_preview_totals_count_earlier_refunds_on_other_lines() -> None:
    raw = refunded(payment(), "L3", 500, "acme:other-op")
    frozen = REFUND.resolve(ask(), facts(raw))
    assert (frozen.preview.current_total_cents, frozen.preview.resulting_total_cents) == (
        19500,
        18000,
    )


def test_refund_destination_is_the_payments_own_method() -> None:
    raw = payment(method={"kind": "bank_account", "last4": "0071", "usable": True})
    frozen = REFUND.resolve(ask(), facts(raw))
    assert msgspec.to_builtins(frozen.arguments.destination) == {
        "kind": "original_method",
        "last4": "0071",
    }
    assert (
        frozen.preview.payment_method == frozen.preview.destination == ("bank_account ending 0071")
    )


def test_refund_reads_the_payment_it_names() -> None:
    assert REFUND.facts_ref(ask()) == FactsRef(kind="payment", id="pay_1")
    assert REFUND.facts_ref_of(proposed().arguments) == FactsRef(kind="payment", id="pay_1")


def test_refund_facts_ignore_fields_the_provider_adds() -> None:
    raw = payment(risk_score=3, metadata={"x": 1})
    raw["method"]["brand"] = "visa"
    line(raw, "L1")["discount"]["code"] = "JR25"
    assert REFUND.resolve(ask(), facts(raw)) == proposed()


@pytest.mark.parametrize(
    ("raw", "request_line", "words"),
    [
        (None, "L1", ["pay_1", "not found"]),
        (payment(status="authorized"), "L1", ["authorized"]),
        (payment(status="pending"), "L1", ["pending"]),
        (payment(status="voided"), "L1", ["voided"]),
        (payment(status="disputed"), "L1", ["disputed"]),
        (payment(), "L9", ["L9"]),
        (payment(), "L2", ["L2", "no discount"]),
        (refunded(payment(), "L1", 1500, "acme:earlier-op"), "L1", ["L1", "already refunded"]),
        (refunded(payment(), "L1", 700, None), "L1", ["L1", "already refunded"]),
        (payment(amount_cents=1400), "L1", ["less than"]),
        (
            payment(method={"kind": "card", "last4": "4242", "usable": False}),
            "L1",
            ["method", "can no longer"],
        ),
    ],
)
def test_refund_that_cannot_be_made_is_invalid(
    raw: dict[str, Any] | None, request_line: str, words: list[str]
) -> None:
    with pytest.raises(Invalid) as caught:
        REFUND.resolve(ask(request_line), None if raw is None else facts(raw))
    for word in words:
        assert word in str(caught.value)
    assert_safe_sentence(str(caught.value))


def test_not_enough_left_counts_refunds_on_other_lines() -> None:
    raw = payment(amount_cents=9000)
    raw = refunded(raw, "L3", 5000, "acme:op-a")
    raw = refunded(raw, "L2", 3000, "acme:op-b")
    with pytest.raises(Invalid, match="less than"):
        REFUND.resolve(ask(), facts(raw))
    # Exactly what is left is enough.
    raw = refunded(payment(amount_cents=9500), "L3", 5000, "acme:op-a")
    raw = refunded(raw, "L2", 3000, "acme:op-b")
    assert REFUND.resolve(ask(), facts(raw)).preview.resulting_total_cents == 0


def test_a_refund_under_this_operations_key_is_this_operation() -> None:
    raw = refunded(payment(), "L1", 1500, KEY)
    with pytest.raises(Invalid, match="already refunded"):
        REFUND.resolve(ask(), facts(raw))
    assert REFUND.resolve(ask(), facts(raw), key=KEY) == proposed()


def test_resolve_refuses_facts_that_break_the_contracts_own_bounds() -> None:
    # Arguments that could never be decoded again must not be frozen and shown to an approver.
    for raw in (
        payment(method={"kind": "card", "last4": "42", "usable": True}),
        payment(currency="eur"),
    ):
        with pytest.raises(Invalid):
            REFUND.resolve(ask(), facts(raw))
    zero = payment()
    line(zero, "L1")["discount"]["amount_cents"] = 0
    with pytest.raises(Invalid):
        REFUND.resolve(ask(), facts(zero))


# -- payment.refund: revalidate ----------------------------------------------------------


def test_revalidate_passes_when_nothing_changed() -> None:
    frozen = proposed()
    REFUND.revalidate(frozen.arguments, frozen.preview, facts(), key=KEY)
    # Fields the contract does not read may change freely.
    raw = payment(customer_id="ACME-43")
    line(raw, "L1")["refunded_cents"] = 0
    REFUND.revalidate(frozen.arguments, frozen.preview, facts(raw), key=KEY)


def test_revalidate_ignores_the_refund_this_operation_already_made() -> None:
    frozen = proposed()
    raw = refunded(payment(), "L1", 1500, KEY)
    REFUND.revalidate(frozen.arguments, frozen.preview, facts(raw), key=KEY)
    with pytest.raises(Stale, match="already refunded"):
        REFUND.revalidate(frozen.arguments, frozen.preview, facts(raw), key="acme:op-2")


def _changed_line(line_id: str, **changes: Any) -> dict[str, Any]:
    raw = payment()
    line(raw, line_id).update(changes)
    return raw


def _changed_discount(**changes: Any) -> dict[str, Any]:
    raw = payment()
    line(raw, "L1")["discount"].update(changes)
    return raw


STALE_REFUND: dict[str, tuple[dict[str, Any] | None, list[str]]] = {
    "discount amount changed": (_changed_discount(amount_cents=1200), ["1200", "1500"]),
    "discount replaced": (_changed_discount(discount_id="D7"), ["discount"]),
    "discount removed": (_changed_line("L1", discount=None), ["no discount"]),
    "discount renamed": (_changed_discount(name="Junior (old)"), []),
    "line removed": (
        payment(lines=[ln for ln in PAYMENT["lines"] if ln["line_id"] != "L1"]),
        ["L1"],
    ),
    "participant changed": (_changed_line("L1", participant="Alan Turing"), []),
    "product changed": (_changed_line("L1", product="Summer league"), []),
    "payment gone": (None, ["not found"]),
    "refunded elsewhere": (refunded(payment(), "L1", 1500, "acme:op-2"), ["already refunded"]),
    "refunded elsewhere without reference": (
        refunded(payment(), "L1", 1500, None),
        ["already refunded"],
    ),
    "other line refunded": (refunded(payment(), "L3", 500, "acme:op-2"), ["total"]),
    "payment total changed": (payment(amount_cents=21000), ["total"]),
    "method last4 changed": (
        payment(method={"kind": "card", "last4": "1881", "usable": True}),
        ["method changed"],
    ),
    "method kind changed": (
        payment(method={"kind": "wallet", "last4": "4242", "usable": True}),
        ["method"],
    ),
    "method unusable": (
        payment(method={"kind": "card", "last4": "4242", "usable": False}),
        ["method"],
    ),
    "currency changed": (payment(currency="USD"), []),
    "disputed": (payment(status="disputed"), ["disputed"]),
    "voided": (payment(status="voided"), ["voided"]),
}


@pytest.mark.parametrize("case", sorted(STALE_REFUND))
def test_revalidate_raises_stale_when_a_stated_fact_changed(case: str) -> None:
    raw, words = STALE_REFUND[case]
    frozen = proposed()
    with pytest.raises(Stale) as caught:
        REFUND.revalidate(
            frozen.arguments, frozen.preview, None if raw is None else facts(raw), key=KEY
        )
    message = str(caught.value)
    assert_safe_sentence(message)
    for word in words:
        assert word in message
    assert "new proposal" in message or "since it was proposed" in message


def test_stale_totals_message_only_blames_totals_when_they_differ() -> None:
    frozen = proposed()
    with pytest.raises(Stale) as caught:
        REFUND.revalidate(
            frozen.arguments,
            frozen.preview,
            facts(_changed_line("L1", participant="Alan Turing")),
            key=KEY,
        )
    assert "total" not in str(caught.value)


def test_revalidate_checks_the_preview_it_is_given() -> None:
    # A preview that claims other totals than the facts support is not approved blindly.
    frozen = proposed()
    lying = msgspec.structs.replace(frozen.preview, current_total_cents=99999)
    with pytest.raises(Stale):
        REFUND.revalidate(frozen.arguments, lying, facts(), key=KEY)


def test_stale_does_not_chain_the_internal_error() -> None:
    frozen = proposed()
    with pytest.raises(Stale) as caught:
        REFUND.revalidate(frozen.arguments, frozen.preview, None, key=KEY)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


# -- email.draft.apply ------------------------------------------------------------------


def test_draft_resolve_freezes_the_draft_as_read() -> None:
    frozen = draft_proposed()
    assert frozen.arguments == DraftArguments(
        draft_id="spring-news",
        subject="Spring league opens",
        body="Sign up by May 1.",
        segment="members",
        recipients=42,
    )
    assert frozen.preview == DraftPreview(
        subject="Spring league opens", segment="members", recipients=42, body="Sign up by May 1."
    )
    assert DRAFT.facts_ref(DRAFT.decode_request({"draft_id": "spring-news"})) == FactsRef(
        kind="mail_draft", id="spring-news"
    )
    assert DRAFT.facts_ref_of(frozen.arguments) == FactsRef(kind="mail_draft", id="spring-news")


@pytest.mark.parametrize(
    ("found", "words"),
    [
        (None, ["spring-news", "not found"]),
        ({"state": "archived"}, ["archived"]),
        ({"recipients": 0}, ["empty"]),
        # The host owns drafts; one Writ could never execute must not be frozen and approved.
        ({"subject": "x" * 301}, ["subject"]),
        ({"segment": "s" * 129}, ["segment"]),
    ],
)
def test_draft_that_cannot_be_applied_is_invalid(
    found: dict[str, Any] | None, words: list[str]
) -> None:
    request = DRAFT.decode_request({"draft_id": "spring-news"})
    with pytest.raises(Invalid) as caught:
        DRAFT.resolve(request, None if found is None else draft_facts(**found))
    for word in words:
        assert word in str(caught.value)


def test_draft_revalidate_passes_when_unchanged() -> None:
    frozen = draft_proposed()
    DRAFT.revalidate(frozen.arguments, frozen.preview, draft_facts(), key=KEY)


def test_draft_revalidate_names_both_audience_counts() -> None:
    frozen = draft_proposed()
    for now in (41, 43, 0):
        with pytest.raises(Stale) as caught:
            DRAFT.revalidate(frozen.arguments, frozen.preview, draft_facts(recipients=now), key=KEY)
        message = str(caught.value)
        assert_safe_sentence(message)
        assert "42" in message and str(now) in message


@pytest.mark.parametrize(
    "changes",
    [
        {"subject": "Spring league opens!"},
        {"body": "Sign up by May 2."},
        {"segment": "juniors"},
        {"state": "archived"},
        None,
    ],
)
def test_draft_revalidate_raises_stale_when_the_draft_changed(
    changes: dict[str, Any] | None,
) -> None:
    frozen = draft_proposed()
    with pytest.raises(Stale) as caught:
        DRAFT.revalidate(
            frozen.arguments,
            frozen.preview,
            None if changes is None else draft_facts(**changes),
            key=KEY,
        )
    assert_safe_sentence(str(caught.value))
    assert "new proposal" in str(caught.value)


# -- outcome_of ---------------------------------------------------------------------------

PROVIDER_TEXT = "HTTP 500 from api.payments.example: Traceback (most recent call last) sk_live_x"


def test_succeeded_keeps_the_receipt() -> None:
    assert outcome_of("succeeded", receipt="re_1", reason=None, operation_id="op-1") == Outcome(
        kind="succeeded", receipt="re_1"
    )


def test_unknown_needs_reconciliation_and_says_how() -> None:
    outcome = outcome_of("unknown", receipt=None, reason=PROVIDER_TEXT, operation_id="op-1")
    assert outcome.kind == "needs_reconciliation"
    assert "writ reconcile" in outcome.detail and "op-1" in outcome.detail
    assert PROVIDER_TEXT not in outcome.detail and outcome.receipt is None


def test_failed_is_terminal_with_a_correlation_id_and_no_provider_text() -> None:
    outcome = outcome_of("failed", receipt=None, reason=PROVIDER_TEXT, operation_id="op-7")
    assert outcome.kind == "terminal_failure"
    assert outcome.correlation_id == "op-7"
    assert outcome.detail and "correlation id" in outcome.detail
    for fragment in ("HTTP", "500", "api.payments", "Traceback", "sk_live"):
        assert fragment not in outcome.detail


@pytest.mark.parametrize("state", ["revision_required", "denied", "expired"])
def test_recoverable_states_keep_their_reason(state: str) -> None:
    outcome = outcome_of(
        state, receipt=None, reason="the audience changed: 42 then 41", operation_id="op-1"
    )
    assert outcome == Outcome(kind=state, detail="the audience changed: 42 then 41")  # type: ignore[arg-type]
    assert outcome_of(state, receipt=None, reason=None, operation_id="op-1").detail == state


@pytest.mark.parametrize("state", ["pending", "dispatching"])
def test_unfinished_states_are_pending(state: str) -> None:
    outcome = outcome_of(state, receipt=None, reason=None, operation_id="op-1")
    assert outcome.kind == "pending" and outcome.correlation_id is None


# -- admission: validate then resolve a refund -------------------------------------------


def refund_proposal(arguments: dict[str, Any]) -> ProposeCommand:
    return ProposeCommand(
        run_id="run-1",
        step=0,
        tenant="acme",
        principal="alice@acme",
        agent="orders",
        action="payment.refund",
        arguments=arguments,
    )


def test_admission_resolves_a_refund_against_the_providers_json() -> None:
    validated = validate(refund_proposal({"payment_id": "pay_1", "line_id": "L1"}))
    raw = refunded(payment(risk_score=3), "L3", 500, "acme:op-0")
    raw["refunds"][0]["status"] = "succeeded"
    resolved = resolve(validated, raw)
    assert resolved.arguments == {
        "payment_id": "pay_1",
        "line_id": "L1",
        "discount_id": "D1",
        "amount_cents": 1500,
        "currency": "EUR",
        "destination": {"kind": "original_method", "last4": "4242"},
    }
    assert resolved.preview == {
        "participant": "Ada Lovelace",
        "product": "Winter league",
        "discount": "Junior",
        "payment_method": "card ending 4242",
        "amount_cents": 1500,
        "currency": "EUR",
        "current_total_cents": 19500,
        "resulting_total_cents": 18000,
        "destination": "card ending 4242",
        "payment": "pay_1",
    }
    # What admission stores decodes with the contract the dispatcher will use.
    assert REFUND.decode_arguments(resolved.arguments).amount_cents == 1500
    assert REFUND.decode_preview(resolved.preview).resulting_total_cents == 18000


def test_admission_refuses_what_the_model_may_not_choose() -> None:
    with pytest.raises(Invalid, match="amount_cents"):
        validate(refund_proposal({"payment_id": "pay_1", "line_id": "L1", "amount_cents": 100}))
    with pytest.raises(Invalid, match="destination"):
        validate(
            refund_proposal({"payment_id": "pay_1", "line_id": "L1", "destination": "account:123"})
        )


def test_admission_refuses_missing_or_unreadable_facts() -> None:
    validated = validate(refund_proposal({"payment_id": "pay_1", "line_id": "L1"}))
    with pytest.raises(Invalid, match="not found"):
        resolve(validated, None)
    with pytest.raises(Invalid, match="unreadable"):
        resolve(validated, {k: v for k, v in PAYMENT.items() if k != "method"})
    with pytest.raises(Invalid, match="unreadable"):
        resolve(validated, payment(amount_cents="20000"))


def test_request_hash_is_over_the_request_not_the_facts() -> None:
    request = {"payment_id": "pay_1", "line_id": "L1"}
    first = validate(refund_proposal(request))
    one = resolve(first, payment())
    other = resolve(first, refunded(payment(), "L3", 500, "acme:op-0"))
    assert one.preview != other.preview
    again = validate(refund_proposal(dict(request)))
    assert again.request_hash == first.request_hash
    assert first.request_hash == canonical_hash(
        tenant="acme",
        principal="alice@acme",
        action="payment.refund",
        version=1,
        arguments={**request, "destination": "original_method"},
        agent="orders",
    )
    assert first.request_hash != canonical_hash(
        tenant="acme",
        principal="alice@acme",
        action="payment.refund",
        version=1,
        arguments=one.arguments,
        agent="orders",
    )
    # Spelling out the default asks for the same thing.
    explicit = validate(refund_proposal({**request, "destination": "original_method"}))
    assert explicit.request_hash == first.request_hash


def test_request_hash_differs_for_another_line_or_payment() -> None:
    base = validate(refund_proposal({"payment_id": "pay_1", "line_id": "L1"})).request_hash
    assert validate(refund_proposal({"payment_id": "pay_1", "line_id": "L3"})).request_hash != base
    assert validate(refund_proposal({"payment_id": "pay_2", "line_id": "L1"})).request_hash != base


def test_a_refund_is_described_to_its_approver_field_by_field_in_plain_words() -> None:
    described = dict(REFUND.describe(proposed().preview))
    assert described == {
        "Participant": "Ada Lovelace",
        "Product": "Winter league",
        "Discount": "Junior",
        "Payment": "pay_1",
        "Payment method": "card ending 4242",
        "Amount to refund": "15.00 EUR",
        "Destination": "card ending 4242",
        "Current order total": "200.00 EUR",
        "Resulting order total": "185.00 EUR",
        "Currency": "EUR",
    }


def test_a_refund_frozen_before_previews_named_the_payment_still_revalidates() -> None:
    frozen = proposed()
    old = msgspec.structs.replace(frozen.preview, payment="")
    REFUND.revalidate(frozen.arguments, old, facts(), key="acme:op")  # no Stale raised


def test_contracts_that_move_money_are_never_covered_by_a_standing_grant() -> None:
    never = {name for name, c in ACTIONS.items() if not c.grant_may_cover()}
    assert {"payment.charge.create", "payment.refund"} <= never
    for contract in ACTIONS.values():
        if contract.standing_grant is None:  # not declared: its effects and family decide
            assert contract.grant_may_cover() == (
                not contract.effects and contract.family != "send_external"
            )


def test_an_undeclared_consequential_contract_defaults_to_never() -> None:
    # Contracts that leave the grant unsaid where their parent said it: a narrower literal
    # loosened on purpose.
    class Transfer(PaymentChargeCreate):
        name = "payment.transfer"
        standing_grant = None

    class Invite(CrmNoteCreate):
        name = "access.invite"
        effects = frozenset({"access"})
        standing_grant = None  # type: ignore[assignment]

    class Send(CrmNoteCreate):
        name = "mail.send"
        family = "send_external"  # type: ignore[assignment]
        standing_grant = None  # type: ignore[assignment]

    class Note(CrmNoteCreate):
        standing_grant = None  # type: ignore[assignment]

    assert [c().grant_may_cover() for c in (Transfer, Invite, Send, Note)] == [
        False,
        False,
        False,
        True,
    ]


def test_a_charge_reads_as_an_amount_and_a_currency_never_cents() -> None:
    charge = ACTIONS["payment.charge.create"]
    frozen = charge.resolve(
        charge.decode_request({**VALID["payment.charge.create"], "amount_cents": 4200}), None
    )
    lines = dict(charge.describe(frozen.preview))
    assert lines["Amount to charge"] == "42.00 " + frozen.preview.currency
    assert not any("cents" in label.lower() for label in lines)


def test_a_ticket_update_states_each_change_from_the_facts_the_page_shows() -> None:
    update = ACTIONS["host.ticket.update"]
    facts = update.decode_facts({**TICKET, "status": "open", "priority": "low"})
    frozen = update.resolve(
        update.decode_request({"ticket_id": "T-1001", "status": "pending", "priority": "high"}),
        facts,
    )
    assert frozen.preview.changes == {"status": "open -> pending", "priority": "low -> high"}


@pytest.mark.parametrize(
    "request_",
    [
        {"ticket_id": "T-1001", "status": "pending"},
        {"ticket_id": "T-1001", "priority": "low"},
        {"ticket_id": "T-1001", "status": "pending", "priority": "low"},
    ],
)
def test_a_ticket_update_that_changes_nothing_is_invalid(request_: dict[str, Any]) -> None:
    update = ACTIONS["host.ticket.update"]
    facts = update.decode_facts({**TICKET, "status": "pending", "priority": "low"})
    with pytest.raises(Invalid, match="nothing would change"):
        update.resolve(update.decode_request(request_), facts)


def test_a_ticket_update_leaves_out_a_field_already_at_its_value() -> None:
    update = ACTIONS["host.ticket.update"]
    facts = update.decode_facts({**TICKET, "status": "pending", "priority": "low"})
    frozen = update.resolve(
        update.decode_request({"ticket_id": "T-1001", "status": "pending", "priority": "high"}),
        facts,
    )
    assert frozen.preview.changes == {"priority": "low -> high"}
    assert update.provider_call(frozen.arguments).body == {"priority": "high"}


def test_money_above_its_contracts_amount_needs_two_approvers() -> None:
    charge, refund = ACTIONS["payment.charge.create"], ACTIONS["payment.refund"]
    assert charge.approvers_needed({"amount_cents": 49_999}) == 1
    assert charge.approvers_needed({"amount_cents": 50_000}) == 2
    assert refund.approvers_needed({"amount_cents": 99_000}) == 2
    assert ACTIONS["crm.note.create"].approvers_needed({"amount_cents": 10**8}) == 1
