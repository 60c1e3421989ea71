"""A simulated payment provider that is NOT idempotent: the same reference charged twice is two
charges. It is a real loopback HTTP server that can fail, slow down or lose responses, and whose
charges can be looked up by reference only when it is `queryable`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import SplitResult, parse_qs

from fakes import _http
from fakes._http import MAX_BODY_BYTES, MODES, HttpError, Reply

__all__ = [
    "MAX_AMOUNT_CENTS",
    "MAX_BODY_BYTES",
    "MAX_DESCRIPTION_CHARS",
    "MAX_REFERENCE_CHARS",
    "MODES",
    "FakePayments",
    "main",
]

MAX_REFERENCE_CHARS: Final = 255
MAX_AMOUNT_CENTS: Final = 100_000_000
MAX_DESCRIPTION_CHARS: Final = 500
# The default backlog of 5 drops SYNs under a burst of concurrent charges, which costs the
# client a one-second retransmit per dropped connection.
_BACKLOG: Final = 128
_CHARGE_FIELDS: Final = frozenset({"customer_id", "amount_cents", "currency", "description"})
_CUSTOMER_ID: Final = re.compile(r"[^/\s]{1,255}")
_CURRENCY: Final = re.compile(r"[A-Z]{3}")


class _State(_http.State):
    """Charges, the fault mode and lookups; every method holds the lock for its whole body."""

    def __init__(self, *, queryable: bool) -> None:
        self._initially_queryable = queryable
        super().__init__()

    def _clear(self) -> None:
        self.charges: list[dict[str, Any]] = []
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

    def find(self, reference: str | None) -> Reply:
        with self.lock:
            # An unqueryable provider has no such endpoint, whatever the query says.
            if not self.queryable:
                raise HttpError(404, "lookup not supported")
            if reference is None:
                raise HttpError(400, "reference query parameter required")
            return Reply(
                200, {"charges": [dict(c) for c in self.charges if c["reference"] == reference]}
            )


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
        charge = (method, path) == ("POST", "/v1/charges")
        if charge:
            state.count_call()  # every charge POST counts, including those refused below
        self._authorize()
        if charge:
            return self._post_charge()
        if (method, path) == ("GET", "/v1/charges"):
            references = parse_qs(url.query).get("reference")
            return state.find(references[0] if references else None)
        raise HttpError(404, "not found")

    def _post_charge(self) -> Reply | None:
        fields = _parse_charge(self._json())
        reference = self.headers.get("Reference")
        if reference is not None and not 1 <= len(reference) <= MAX_REFERENCE_CHARS:
            raise HttpError(400, f"reference must be 1..{MAX_REFERENCE_CHARS} chars")
        return self._under_mode(lambda: self.server.state.create_charge(fields, reference))

    def _route_control(self, method: str, path: str) -> Reply:
        state = self.server.state
        if (method, path) == ("GET", "/_control/charges"):
            with state.lock:
                return Reply(200, [dict(c) for c in state.charges])
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


def main(argv: list[str] | None = None) -> None:
    """Serve the fake payment provider until SIGTERM or SIGINT."""
    parser = _http.arg_parser("python -m fakes.payments", main.__doc__)
    parser.add_argument(
        "--queryable", action="store_true", help="answer GET /v1/charges?reference=..."
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
