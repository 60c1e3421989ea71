"""How an HTTP answer classifies, for the three HTTP connectors at once (`answer_of`).

The CRM and the host dedupe by the operation's key (`replay_safe`) and honour `If-Match`
(`revisions`); the payment provider does neither, so an answer that may follow an applied
request is `lost` there, never retried blindly.
"""

from __future__ import annotations

import pytest

from services.dispatcher.connectors.base import Result, answer_of


def keyed(status: int, text: str = "body") -> Result | None:
    """As the CRM and the host connectors classify."""
    return answer_of(status, text, ok=(200, 201), replay_safe=True, revisions=True)


def payments(status: int, text: str = "body") -> Result | None:
    """As the payment connector classifies."""
    return answer_of(status, text, ok=(201,), replay_safe=False, revisions=False)


@pytest.mark.parametrize(
    ("status", "by_key", "by_payments"),
    [
        (200, None, "lost"),  # the provider answers a create with 201 only: 200 proves nothing
        (201, None, None),
        (204, "rejected", "lost"),
        (400, "rejected", "rejected"),
        (409, "rejected", "rejected"),
        (412, "revision_mismatch", "rejected"),
        (422, "rejected", "rejected"),
        (429, "transient", "transient"),
        (500, "rejected", "lost"),
        (502, "transient", "lost"),
        (503, "transient", "transient"),
        (504, "transient", "lost"),
    ],
)
def test_each_status_classifies_as_its_connector_can_prove(
    status: int, by_key: str | None, by_payments: str | None
) -> None:
    got_keyed, got_payments = keyed(status), payments(status)
    assert (got_keyed.kind if got_keyed else None) == by_key
    assert (got_payments.kind if got_payments else None) == by_payments


def test_a_refusal_carries_the_providers_words_bounded() -> None:
    refused = payments(409, "nothing left to refund " * 100)
    assert refused is not None and refused.kind == "rejected"
    assert refused.detail.startswith("HTTP 409: nothing left to refund")
    assert len(refused.detail) == 500
