"""`services.admission.logic`: contract validation, canonical hash, operation ids."""

from __future__ import annotations

import unicodedata
import uuid
from typing import Any

import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from actions import ACTIONS
from actions.crm_note_create import NoteArguments
from schemas.planner import ProposeCommand
from services.admission.logic import (
    Invalid,
    Validated,
    canonical_hash,
    operation_id_for,
    proposal_id_for,
    validate,
)

BASE: dict[str, Any] = {
    "tenant": "acme",
    "principal": "alice@acme",
    "action": "crm.note.create",
    "version": 1,
    "agent": "assistant",
    "arguments": {"customer_id": "ACME-42", "body": "Called back about the invoice."},
}


PAYMENT: dict[str, Any] = {
    "customer_id": "ACME-42",
    "amount_cents": 12_50,
    "currency": "EUR",
    "description": "Invoice 7",
}


def h(**changes: Any) -> bytes:
    return canonical_hash(**{**BASE, **changes})


def proposal(arguments: dict[str, Any] | None = None, **fields: Any) -> ProposeCommand:
    values: dict[str, Any] = {
        "run_id": "run-1",
        "step": 3,
        "tenant": "acme",
        "principal": "alice@acme",
        "agent": "assistant",
        "action": "crm.note.create",
        "arguments": dict(BASE["arguments"]) if arguments is None else arguments,
    }
    values.update(fields)
    return ProposeCommand(**values)


# -- canonical_hash ------------------------------------------------------------------------


def test_hash_is_sha256_sized_and_deterministic() -> None:
    assert len(h()) == 32
    assert h() == h()


def test_hash_ignores_key_order() -> None:
    reordered = {"body": "Called back about the invoice.", "customer_id": "ACME-42"}
    assert list(reordered) != list(BASE["arguments"])
    assert h(arguments=reordered) == h()


def test_hash_ignores_nested_key_order() -> None:
    a = {"outer": {"x": 1, "y": [{"p": "1", "q": "2"}]}}
    b = {"outer": {"y": [{"q": "2", "p": "1"}], "x": 1}}
    assert h(arguments=a) == h(arguments=b)


def test_hash_ignores_unicode_normal_form() -> None:
    nfc = unicodedata.normalize("NFC", "Café crème, Zoë")
    nfd = unicodedata.normalize("NFD", "Café crème, Zoë")
    assert nfc != nfd
    assert h(arguments={"body": nfc}) == h(arguments={"body": nfd})
    assert h(arguments={nfc: "v"}) == h(arguments={nfd: "v"})  # keys too
    assert h(principal=unicodedata.normalize("NFD", "zoë")) == h(principal="zoë")


@pytest.mark.parametrize(("a", "b"), [(1.0, 1), (100, 1e2), (-0.0, 0), (0.5, 5e-1)])
def test_hash_ignores_number_spelling(a: Any, b: Any) -> None:
    assert h(arguments={"n": a}) == h(arguments={"n": b})


@pytest.mark.parametrize(
    "change",
    [
        {"tenant": "globex"},
        {"principal": "bob@acme"},
        {"action": "crm.note.delete"},
        {"version": 2},
        {"target": "ACME-42"},
        {"expected_revision": "r7"},
        {"arguments": {"customer_id": "ACME-43", "body": "Called back about the invoice."}},
        {"arguments": {"customer_id": "ACME-42", "body": "Called back about the invoice!"}},
        {"arguments": {"customer_id": "ACME-42"}},
        {
            "arguments": {
                "customer_id": "ACME-42",
                "body": "Called back about the invoice.",
                "extra": None,
            }
        },
        {"arguments": {"customer_id": "ACME-42", "body": ["Called back about the invoice."]}},
    ],
    ids=lambda c: next(iter(c)),
)
def test_hash_changes_with_any_field(change: dict[str, Any]) -> None:
    assert h(**change) != h()


def test_hash_distinguishes_types() -> None:
    assert h(arguments={"n": 1}) != h(arguments={"n": "1"})
    assert h(arguments={"n": True}) != h(arguments={"n": 1})
    assert h(arguments={"n": None}) != h(arguments={})


_plain_text = st.text(max_size=20)


@settings(max_examples=200, deadline=None)
@given(
    items=st.dictionaries(_plain_text, _plain_text, max_size=12).map(lambda d: list(d.items())),
    data=st.data(),
)
def test_key_order_never_changes_the_hash(
    items: list[tuple[str, str]], data: st.DataObject
) -> None:
    # Keys that are distinct only up to unicode normalisation are the separate case below.
    keys = [unicodedata.normalize("NFC", k) for k, _ in items]
    assume(len(set(keys)) == len(keys))
    permuted = data.draw(st.permutations(items))
    assert h(arguments=dict(permuted)) == h(arguments=dict(items))


def test_keys_equal_after_normalisation_are_refused_rather_than_hashed_by_order() -> None:
    nfc, nfd = "\u00e9", "e\u0301"
    for arguments in ({nfc: "1", nfd: "2"}, {nfd: "2", nfc: "1"}):
        with pytest.raises(Invalid):
            h(arguments=arguments)


# -- validate ------------------------------------------------------------------------------


def test_valid_proposal_gets_typed_arguments_and_its_hash() -> None:
    validated = validate(proposal())
    assert isinstance(validated, Validated)
    assert validated.contract is ACTIONS["crm.note.create"]
    assert validated.arguments == {
        "customer_id": "ACME-42",
        "body": "Called back about the invoice.",
    }
    assert len(validated.request_hash) == 32
    assert validated.request_hash == h()


def test_validated_hash_is_tenant_and_principal_scoped() -> None:
    base = validate(proposal()).request_hash
    assert validate(proposal(tenant="globex")).request_hash != base
    assert validate(proposal(principal="bob")).request_hash != base
    # The agent acting is part of what a key binds; run and step are not.
    assert validate(proposal(agent="other")).request_hash != base
    assert validate(proposal(run_id="run-2", step=9)).request_hash == base


def test_validated_hash_covers_the_expected_revision() -> None:
    base = validate(proposal()).request_hash
    pinned = validate(proposal(expected_revision="r3")).request_hash
    assert pinned != base
    assert pinned == h(expected_revision="r3")
    assert validate(proposal(expected_revision="r4")).request_hash != pinned


def test_host_key_and_request_id_are_not_part_of_the_hash() -> None:
    # A host's retry under the same key must hash the same as its first submission.
    assert (
        validate(proposal(operation_key="k1", request_id="req-1")).request_hash
        == validate(proposal(operation_key="k1", request_id="req-2")).request_hash
    )


def test_validate_normalises_unicode() -> None:
    nfd = unicodedata.normalize("NFD", "Rappel: café livré")
    validated = validate(proposal({"customer_id": "ACME-42", "body": nfd}))
    assert validated.arguments["body"] == unicodedata.normalize("NFC", nfd)
    assert (
        validated.request_hash
        == validate(
            proposal({"customer_id": "ACME-42", "body": unicodedata.normalize("NFC", nfd)})
        ).request_hash
    )


def test_body_at_the_limit_is_valid() -> None:
    validate(proposal({"customer_id": "ACME-42", "body": "x" * 2000}))


@pytest.mark.parametrize(
    ("arguments", "mentions"),
    [
        ({"customer_id": "ACME-42", "body": "hi", "priority": "high"}, "priority"),
        ({"customer_id": "ACME-42", "body": "x" * 2001}, "body"),
        ({"customer_id": "ACME-42", "body": ""}, "body"),
        ({"customer_id": "acme-42", "body": "hi"}, "customer_id"),
        ({"customer_id": "ACME/42", "body": "hi"}, "customer_id"),
        ({"customer_id": "-ACME", "body": "hi"}, "customer_id"),
        ({"customer_id": "A" * 65, "body": "hi"}, "customer_id"),
        ({"customer_id": 42, "body": "hi"}, "customer_id"),
        ({"body": "hi"}, "customer_id"),
        ({"customer_id": "ACME-42"}, "body"),
    ],
    ids=[
        "unknown-argument",
        "body-too-long",
        "body-empty",
        "lowercase-id",
        "slash-in-id",
        "leading-dash",
        "id-too-long",
        "id-not-a-string",
        "missing-id",
        "missing-body",
    ],
)
def test_arguments_outside_the_contract_are_invalid(
    arguments: dict[str, Any], mentions: str
) -> None:
    with pytest.raises(Invalid, match=mentions):
        validate(proposal(arguments))


@pytest.mark.parametrize(
    ("action", "arguments"),
    [
        ("crm.note.create", {"customer_id": "ACME-42\n", "body": "hi"}),
        ("payment.charge.create", {**PAYMENT, "customer_id": "ACME-42\n"}),
        ("payment.charge.create", {**PAYMENT, "currency": "EUR\n"}),
    ],
    ids=["crm-customer-id", "payment-customer-id", "payment-currency"],
)
def test_pattern_fields_with_a_trailing_newline_are_invalid(
    action: str, arguments: dict[str, Any]
) -> None:
    with pytest.raises(Invalid):
        validate(proposal(arguments, action=action))


def test_valid_payment_charge() -> None:
    validated = validate(proposal(PAYMENT, action="payment.charge.create"))
    assert validated.contract.family == "write_delete"
    assert validated.arguments == PAYMENT
    assert validated.request_hash == h(action="payment.charge.create", arguments=PAYMENT)


@pytest.mark.parametrize(
    ("changes", "mentions"),
    [
        ({"amount_cents": 0}, "amount_cents"),
        ({"amount_cents": 100_000_001}, "amount_cents"),
        ({"amount_cents": 10.5}, "amount_cents"),
        ({"amount_cents": 1000.0}, "amount_cents"),  # typed int: no float spelling at all
        ({"amount_cents": "1000"}, "amount_cents"),
        ({"amount_cents": True}, "amount_cents"),
        ({"currency": "eur"}, "currency"),
        ({"currency": "EURO"}, "currency"),
        ({"description": ""}, "description"),
        ({"description": "x" * 501}, "description"),
        ({"refund": True}, "refund"),
    ],
)
def test_payment_charge_outside_the_contract(changes: dict[str, Any], mentions: str) -> None:
    with pytest.raises(Invalid, match=mentions):
        validate(proposal({**PAYMENT, **changes}, action="payment.charge.create"))


def test_unknown_action_is_invalid() -> None:
    with pytest.raises(Invalid, match="crm.customer.delete"):
        validate(proposal(action="crm.customer.delete"))


def test_frozen_arguments_fit_the_contract() -> None:
    validated = validate(proposal({"customer_id": "ACME-42", "body": "Zoë"}))
    assert msgspec.convert(validated.arguments, NoteArguments) == NoteArguments(
        customer_id="ACME-42", body="Zoë"
    )


def test_bounds_are_checked_on_the_normalised_arguments_that_get_frozen() -> None:
    # U+0958 becomes two code points under NFC: 2000 of them no longer fit in 2000.
    with pytest.raises(Invalid):
        validate(proposal({"customer_id": "ACME-42", "body": "\u0958" * 2000}))
    validated = validate(proposal({"customer_id": "ACME-42", "body": "\u0958" * 1000}))
    msgspec.convert(validated.arguments, NoteArguments)


# -- ids -----------------------------------------------------------------------------------


def test_operation_id_is_stable_and_tenant_scoped() -> None:
    op = operation_id_for("acme", "run-1", 3)
    assert op == operation_id_for("acme", "run-1", 3)
    assert uuid.UUID(op).version == 5
    assert op != operation_id_for("globex", "run-1", 3)
    assert op != operation_id_for("acme", "run-2", 3)
    assert op != operation_id_for("acme", "run-1", 4)


def test_operation_id_from_a_host_key_is_stable_and_tenant_scoped() -> None:
    op = operation_id_for("acme", "run-1", 3, "invoice-7")
    assert op == operation_id_for("acme", "run-other", 9, "invoice-7")  # the key names it
    assert op != operation_id_for("globex", "run-1", 3, "invoice-7")
    assert op != operation_id_for("acme", "run-1", 3, "invoice-8")
    assert op != operation_id_for("acme", "run-1", 3)


def test_operation_and_proposal_ids_are_different_namespaces() -> None:
    assert proposal_id_for("acme", "run-1", 3) == proposal_id_for("acme", "run-1", 3)
    assert proposal_id_for("acme", "run-1", 3) != operation_id_for("acme", "run-1", 3)
    assert proposal_id_for("acme", "run-1", 3) != proposal_id_for("globex", "run-1", 3)


def test_a_plans_step_is_admitted_only_with_the_preview_the_plan_showed() -> None:
    from schemas.planner import preview_digest
    from services.admission.logic import Resolved, plan_refusal

    shown = {"customer_id": "ACME-42", "body": "Le client a payé."}
    resolved = Resolved(arguments=shown, preview=dict(reversed(shown.items())))
    base = ProposeCommand(
        run_id="ses-1-t1",
        step=2,
        tenant="acme",
        principal="alice",
        agent="a",
        action="crm.note.create",
        arguments=shown,
    )
    assert plan_refusal(base, resolved) is None  # no plan's step: nothing to hold it to
    held = msgspec.structs.replace(base, plan_preview=preview_digest(shown))
    assert plan_refusal(held, resolved) is None  # the same preview, whatever its key order
    moved = Resolved(arguments=shown, preview={**shown, "body": "Autre chose."})
    assert "changed since the user approved the plan" in (plan_refusal(held, moved) or "")
    with pytest.raises(msgspec.ValidationError):  # a digest, or nothing
        msgspec.convert(
            {**msgspec.to_builtins(base), "plan_preview": "not-a-digest"}, ProposeCommand
        )


def test_a_plans_step_is_kept_under_an_id_no_proposal_has() -> None:
    from services.admission.logic import plan_step_id_for

    ids = {plan_step_id_for("acme", "s-1:1", step) for step in range(50)}
    proposals = {proposal_id_for("acme", "s-1:1", step) for step in range(50)}
    assert len(ids) == 50 and not ids & proposals
    assert plan_step_id_for("acme", "s-1:1", 0) == plan_step_id_for("acme", "s-1:1", 0)
    assert plan_step_id_for("acme", "s-1:1", 0) != plan_step_id_for("globex", "s-1:1", 0)
