"""A simulated payment provider that is NOT idempotent: the same reference charged (or refunded)
twice is two charges (or two refunds). It is a real loopback HTTP server that can fail, slow down
or lose responses, and whose charges and refunds can be looked up by reference only when it is
`queryable`.

Payments with order lines are seeded through `POST /_control/payments` (upserting one again
replaces its facts but keeps its refunds, as if it had changed in another tab); refunds are made
per line through `POST /v1/refunds` and are refused (409) once nothing is left to refund.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import SplitResult, parse_qs

from fakes import _http
from fakes._http import MAX_BODY_BYTES, MODES, HttpError, Reply

__all__ = [
    "MAX_AMOUNT_CENTS",
    "MAX_BODY_BYTES",
    "MAX_DESCRIPTION_CHARS",
    "MAX_LINES",
    "MAX_NAME_CHARS",
    "MAX_REFERENCE_CHARS",
    "MODES",
    "PAYMENT_STATUSES",
    "FakePayments",
    "main",
]

MAX_REFERENCE_CHARS: Final = 255
MAX_AMOUNT_CENTS: Final = 100_000_000
MAX_DESCRIPTION_CHARS: Final = 500
MAX_LINES: Final = 100
MAX_NAME_CHARS: Final = 200
PAYMENT_STATUSES: Final = frozenset(
    {"pending", "authorized", "captured", "failed", "voided", "disputed"}
)
# The default backlog of 5 drops SYNs under a burst of concurrent charges, which costs the
# client a one-second retransmit per dropped connection.
_BACKLOG: Final = 128
_CHARGE_FIELDS: Final = frozenset({"customer_id", "amount_cents", "currency", "description"})
_CUSTOMER_ID: Final = re.compile(r"[^/\s]{1,255}")
_CURRENCY: Final = re.compile(r"[A-Z]{3}")
_PAYMENT_FIELDS: Final = frozenset(
    {"payment_id", "customer_id", "currency", "status", "method", "lines"}
)
_METHOD_FIELDS: Final = frozenset({"kind", "last4", "usable"})
_METHOD_KINDS: Final = frozenset({"card", "bank_account", "wallet"})
_LINE_FIELDS: Final = frozenset({"line_id", "product", "participant", "amount_cents", "discount"})
_DISCOUNT_FIELDS: Final = frozenset({"discount_id", "name", "amount_cents"})
_REFUND_FIELDS: Final = frozenset({"payment_id", "line_id", "amount_cents", "destination"})
_DESTINATION_FIELDS: Final = frozenset({"kind", "last4"})
_DESTINATION_KINDS: Final = frozenset({"original_method"})
# Payment ids travel in URL paths, so they are kept to characters that need no escaping.
_PAYMENT_ID: Final = re.compile(r"pay_[A-Za-z0-9_-]{1,64}")
_ITEM_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_LAST4: Final = re.compile(r"[0-9]{4}")


class _State(_http.State):
    """Charges, the fault mode and lookups; every method holds the lock for its whole body."""

    def __init__(self, *, queryable: bool) -> None:
        self._initially_queryable = queryable
        super().__init__()

    def _clear(self) -> None:
        self.charges: list[dict[str, Any]] = []
        self.payments: dict[str, dict[str, Any]] = {}
        self.refunds: list[dict[str, Any]] = []
        self.queryable = self._initially_queryable

    def create_charge(self, fields: dict[str, Any], reference: str | None) -> Reply:
        with self.lock:
            # Deliberately no lookup of `reference` here: this provider does not dedupe, so a
            # retry after a lost response charges the customer a second time.
            charge = {
                "charge_id": f"ch_{len(self.charges) + 1}",
                "reference": reference,
                "customer_id": fields["customer_id"],
                "amount_cents": fields["amount_cents"],
                "currency": fields["currency"],
                "description": fields["description"],
                "status": "captured",
                "created_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            }
            self.charges.append(charge)
            return Reply(201, dict(charge))

    def find(self, kind: str, reference: str | None) -> Reply:
        """The `kind` ("charges" or "refunds") made under `reference`."""
        with self.lock:
            # An unqueryable provider has no such endpoint, whatever the query says.
            if not self.queryable:
                raise HttpError(404, "lookup not supported")
            if reference is None:
                raise HttpError(400, "reference query parameter required")
            made = self.charges if kind == "charges" else self.refunds
            found = [copy.deepcopy(m) for m in made if m["reference"] == reference]
            return Reply(200, {kind: found})

    def upsert_payment(self, payment: dict[str, Any]) -> Reply:
        with self.lock:
            self.payments[payment["payment_id"]] = payment
            return Reply(200, self._view(payment))

    def payment(self, payment_id: str) -> Reply:
        with self.lock:
            if (payment := self.payments.get(payment_id)) is None:
                raise HttpError(404, "unknown payment")
            return Reply(200, self._view(payment))

    def create_refund(self, fields: dict[str, Any], reference: str | None) -> Reply:
        with self.lock:
            # The checks and the refund happen under one lock, so concurrent refunds cannot
            # together exceed what was paid. As with charges, `reference` is never looked up.
            payment = self.payments.get(fields["payment_id"])
            if payment is None:
                raise HttpError(404, "unknown payment")
            line = next((x for x in payment["lines"] if x["line_id"] == fields["line_id"]), None)
            if line is None:
                raise HttpError(404, "unknown line")
            if payment["status"] != "captured":
                raise HttpError(409, f"payment is {payment['status']}, not captured")
            method, destination = payment["method"], fields["destination"]
            if not method["usable"]:
                raise HttpError(409, "the payment's method can no longer receive refunds")
            if destination["last4"] != method["last4"]:
                raise HttpError(409, "destination does not match the payment's method")
            amount = fields["amount_cents"]
            refunds = self._refunds_of(payment["payment_id"])
            left = sum(x["amount_cents"] for x in payment["lines"]) - _total(refunds)
            if amount > left:
                raise HttpError(
                    409,
                    "amount exceeds what is left to refund on the payment",
                    refundable_cents=max(left, 0),
                )
            line_left = line["amount_cents"] - _total(
                r for r in refunds if r["line_id"] == line["line_id"]
            )
            if amount > line_left:
                raise HttpError(
                    409,
                    "amount exceeds what is left to refund on the line",
                    refundable_cents=max(line_left, 0),
                )
            refund = {
                "refund_id": f"re_{len(self.refunds) + 1}",
                "reference": reference,
                "payment_id": payment["payment_id"],
                "line_id": line["line_id"],
                "amount_cents": amount,
                "currency": payment["currency"],
                "destination": dict(destination),
                "created_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            }
            self.refunds.append(refund)
            return Reply(201, copy.deepcopy(refund))

    def _refunds_of(self, payment_id: str) -> list[dict[str, Any]]:
        return [r for r in self.refunds if r["payment_id"] == payment_id]

    def _view(self, payment: dict[str, Any]) -> dict[str, Any]:
        """The payment as the API shows it: its facts plus the computed totals and refunds."""
        refunds = self._refunds_of(payment["payment_id"])
        view = copy.deepcopy(payment)
        for line in view["lines"]:
            line["refunded_cents"] = _total(r for r in refunds if r["line_id"] == line["line_id"])
        view["amount_cents"] = sum(x["amount_cents"] for x in payment["lines"])
        view["refunded_cents"] = _total(refunds)
        view["refunds"] = [copy.deepcopy(r) for r in refunds]
        return view


class FakePayments(_http.LoopbackFake):
    """The payment provider that Writ's payment connector calls, served over HTTP on loopback."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str,
        queryable: bool = False,
    ) -> None:
        if not token:
            raise ValueError("token must not be empty")
        state = _State(queryable=queryable)
        # Bind now so `url` is known before start(), e.g. to hand to a subprocess.
        super().__init__(
            _http.Server(
                (host, port), _Handler, token=token.encode(), state=state, backlog=_BACKLOG
            )
        )


class _Handler(_http.Handler):
    server: _http.Server[_State]

    def _route_api(self, method: str, url: SplitResult) -> Reply | None:
        state, path = self.server.state, url.path
        post = method == "POST" and path in ("/v1/charges", "/v1/refunds")
        if post:
            state.count_call()  # every charge or refund POST counts, including those refused
        self._authorize()
        if post:
            return self._post_charge() if path == "/v1/charges" else self._post_refund()
        if method == "GET" and path in ("/v1/charges", "/v1/refunds"):
            references = parse_qs(url.query).get("reference")
            reference = references[0] if references else None
            state.note("lookup", reference, answered=True)
            return state.find(path.removeprefix("/v1/"), reference)
        if method == "GET" and path.startswith("/v1/payments/"):
            return state.payment(path.removeprefix("/v1/payments/"))
        raise HttpError(404, "not found")

    def _post_charge(self) -> Reply | None:
        fields = _parse_charge(self._json())
        reference = self._reference()
        self._check_once(reference, "charges")
        return self._under_mode(
            lambda: self.server.state.create_charge(fields, reference), reference
        )

    def _post_refund(self) -> Reply | None:
        fields = _parse_refund(self._json())
        reference = self._reference()
        self._check_once(reference, "refunds")
        # A refused refund (404, 409) raises inside the effect and is answered whatever the mode:
        # only a refund that was made can have its response lost.
        return self._under_mode(
            lambda: self.server.state.create_refund(fields, reference), reference
        )

    def _check_once(self, reference: str | None, kind: str) -> None:
        """With receipts required: the receipt must authorise this body under this reference,
        and, since this provider does not dedupe, a receipt whose operation already made a charge
        (or refund) is refused as `replayed` rather than paid out twice."""
        if self.server.receipts is None:
            return
        self._check_receipt(reference)
        state = self.server.state
        with state.lock:
            made = state.charges if kind == "charges" else state.refunds
            if any(m["reference"] == reference for m in made):
                raise HttpError(403, "approval receipt refused", reason="replayed")

    def _reference(self) -> str | None:
        reference = self.headers.get("Reference")
        if reference is not None and not 1 <= len(reference) <= MAX_REFERENCE_CHARS:
            raise HttpError(400, f"reference must be 1..{MAX_REFERENCE_CHARS} chars")
        return reference

    def _route_control(self, method: str, path: str) -> Reply:
        state = self.server.state
        if (method, path) == ("GET", "/_control/charges"):
            with state.lock:
                return Reply(200, [dict(c) for c in state.charges])
        if (method, path) == ("GET", "/_control/refunds"):
            with state.lock:
                return Reply(200, [copy.deepcopy(r) for r in state.refunds])
        if (method, path) == ("POST", "/_control/payments"):
            return state.upsert_payment(_parse_payment(self._json()))
        if (method, path) == ("POST", "/_control/queryable"):
            req = self._json()
            if not isinstance(req, dict) or not isinstance(queryable := req.get("queryable"), bool):
                raise HttpError(400, "queryable must be a boolean")
            with state.lock:
                state.queryable = queryable
            return Reply(200, {"queryable": queryable})
        raise HttpError(404, "not found")


def _parse_charge(req: Any) -> dict[str, Any]:
    if not isinstance(req, dict):
        raise HttpError(400, "body must be a JSON object")
    if unknown := sorted(set(req) - _CHARGE_FIELDS):
        raise HttpError(400, f"unknown fields: {', '.join(unknown)}")
    customer_id, amount = req.get("customer_id"), req.get("amount_cents")
    currency, description = req.get("currency"), req.get("description")
    if not isinstance(customer_id, str) or not _CUSTOMER_ID.fullmatch(customer_id):
        raise HttpError(400, "customer_id must be 1..255 chars without '/' or spaces")
    # `type() is int` because JSON true would otherwise pass as a one-cent charge.
    if type(amount) is not int or not 1 <= amount <= MAX_AMOUNT_CENTS:
        raise HttpError(400, f"amount_cents must be an integer in [1, {MAX_AMOUNT_CENTS}]")
    if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency):
        raise HttpError(400, "currency must be three upper-case letters")
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
        raise HttpError(400, f"description must be at most {MAX_DESCRIPTION_CHARS} chars")
    return {
        "customer_id": customer_id,
        "amount_cents": amount,
        "currency": currency,
        "description": description,
    }


def _parse_payment(req: Any) -> dict[str, Any]:
    _check_object(req, "payment", _PAYMENT_FIELDS)
    payment_id, customer_id = req["payment_id"], req["customer_id"]
    currency, status, lines = req["currency"], req["status"], req["lines"]
    if not isinstance(payment_id, str) or not _PAYMENT_ID.fullmatch(payment_id):
        raise HttpError(400, "payment_id must be 'pay_' then 1..64 of [A-Za-z0-9_-]")
    if not isinstance(customer_id, str) or not _CUSTOMER_ID.fullmatch(customer_id):
        raise HttpError(400, "customer_id must be 1..255 chars without '/' or spaces")
    if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency):
        raise HttpError(400, "currency must be three upper-case letters")
    if status not in PAYMENT_STATUSES:
        raise HttpError(400, f"status must be one of {sorted(PAYMENT_STATUSES)}")
    if not isinstance(lines, list) or not 1 <= len(lines) <= MAX_LINES:
        raise HttpError(400, f"lines must be a list of 1..{MAX_LINES} lines")
    parsed = [_parse_line(line) for line in lines]
    if len({line["line_id"] for line in parsed}) != len(parsed):
        raise HttpError(400, "line ids must be unique within a payment")
    return {
        "payment_id": payment_id,
        "customer_id": customer_id,
        "currency": currency,
        "status": status,
        "method": _parse_method(req["method"]),
        "lines": parsed,
    }


def _parse_method(req: Any) -> dict[str, Any]:
    _check_object(req, "method", _METHOD_FIELDS)
    if req["kind"] not in _METHOD_KINDS:
        raise HttpError(400, f"method.kind must be one of {sorted(_METHOD_KINDS)}")
    if not isinstance(req["last4"], str) or not _LAST4.fullmatch(req["last4"]):
        raise HttpError(400, "method.last4 must be four digits")
    if not isinstance(req["usable"], bool):
        raise HttpError(400, "method.usable must be a boolean")
    return {"kind": req["kind"], "last4": req["last4"], "usable": req["usable"]}


def _parse_line(req: Any) -> dict[str, Any]:
    _check_object(req, "line", _LINE_FIELDS)
    line_id, amount, discount = req["line_id"], req["amount_cents"], req["discount"]
    if not isinstance(line_id, str) or not _ITEM_ID.fullmatch(line_id):
        raise HttpError(400, "line_id must be 1..64 of [A-Za-z0-9_-]")
    for name in ("product", "participant"):
        _check_name(req[name], f"line.{name}")
    _check_amount(amount, "line.amount_cents")
    if discount is not None:
        _check_object(discount, "discount", _DISCOUNT_FIELDS)
        if not isinstance(discount["discount_id"], str) or not _ITEM_ID.fullmatch(
            discount["discount_id"]
        ):
            raise HttpError(400, "discount_id must be 1..64 of [A-Za-z0-9_-]")
        _check_name(discount["name"], "discount.name")
        _check_amount(discount["amount_cents"], "discount.amount_cents")
        if discount["amount_cents"] > amount:
            raise HttpError(400, "a discount cannot exceed its line's amount")
        discount = {k: discount[k] for k in ("discount_id", "name", "amount_cents")}
    return {
        "line_id": line_id,
        "product": req["product"],
        "participant": req["participant"],
        "amount_cents": amount,
        "discount": discount,
    }


def _parse_refund(req: Any) -> dict[str, Any]:
    _check_object(req, "body", _REFUND_FIELDS)
    payment_id, line_id, amount = req["payment_id"], req["line_id"], req["amount_cents"]
    if not isinstance(payment_id, str) or not _PAYMENT_ID.fullmatch(payment_id):
        raise HttpError(400, "payment_id must be 'pay_' then 1..64 of [A-Za-z0-9_-]")
    if not isinstance(line_id, str) or not _ITEM_ID.fullmatch(line_id):
        raise HttpError(400, "line_id must be 1..64 of [A-Za-z0-9_-]")
    _check_amount(amount, "amount_cents")
    destination = req["destination"]
    _check_object(destination, "destination", _DESTINATION_FIELDS)
    if destination["kind"] not in _DESTINATION_KINDS:
        raise HttpError(400, f"destination.kind must be one of {sorted(_DESTINATION_KINDS)}")
    if not isinstance(destination["last4"], str) or not _LAST4.fullmatch(destination["last4"]):
        raise HttpError(400, "destination.last4 must be four digits")
    return {
        "payment_id": payment_id,
        "line_id": line_id,
        "amount_cents": amount,
        "destination": {"kind": destination["kind"], "last4": destination["last4"]},
    }


def _check_object(req: Any, what: str, fields: frozenset[str]) -> None:
    """A 400 unless `req` is an object with exactly `fields`."""
    if not isinstance(req, dict):
        raise HttpError(400, f"{what} must be a JSON object")
    if unknown := sorted(set(req) - fields):
        raise HttpError(400, f"unknown fields in {what}: {', '.join(unknown)}")
    if missing := sorted(fields - set(req)):
        raise HttpError(400, f"missing fields in {what}: {', '.join(missing)}")


def _check_name(value: Any, what: str) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_CHARS:
        raise HttpError(400, f"{what} must be 1..{MAX_NAME_CHARS} chars")


def _check_amount(value: Any, what: str) -> None:
    # `type() is int` because JSON true would otherwise pass as one cent.
    if type(value) is not int or not 1 <= value <= MAX_AMOUNT_CENTS:
        raise HttpError(400, f"{what} must be an integer in [1, {MAX_AMOUNT_CENTS}]")


def _total(refunds: Iterable[dict[str, Any]]) -> int:
    return sum(r["amount_cents"] for r in refunds)


def main(argv: list[str] | None = None) -> None:
    """Serve the fake payment provider until SIGTERM or SIGINT."""
    parser = _http.arg_parser("python -m fakes.payments", main.__doc__)
    parser.add_argument(
        "--queryable",
        action="store_true",
        help="answer GET /v1/charges?reference=... and GET /v1/refunds?reference=...",
    )
    _http.serve(
        parser,
        argv,
        lambda args, token: FakePayments(
            host=args.host, port=args.port, token=token, queryable=args.queryable
        ),
    )


if __name__ == "__main__":
    main()
