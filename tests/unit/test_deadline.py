"""`libs.deadline`: which requests count as abandoned by their caller."""

from __future__ import annotations

import time

from libs.deadline import HEADER, expired, with_deadline


def test_a_deadline_in_the_past_is_expired_and_one_ahead_is_not() -> None:
    headers = with_deadline({"traceparent": "00-x"}, 2.0)
    deadline = float(headers[HEADER])
    assert headers["traceparent"] == "00-x"
    assert not expired(headers, now=deadline - 0.5)
    assert not expired(headers, now=deadline)
    assert expired(headers, now=deadline + 0.001)
    assert expired({HEADER: f"{time.time() - 1:.3f}"})


def test_a_request_without_a_usable_deadline_never_expires() -> None:
    for headers in (
        None,
        {},
        {HEADER: ""},
        {HEADER: "soon"},
        {HEADER: "nan"},
        {HEADER: "-inf"},
        {"traceparent": "00-x"},
    ):
        assert not expired(headers, now=time.time() + 1e9), headers
