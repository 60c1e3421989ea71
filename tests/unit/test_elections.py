"""What an election looks like to a caller, and what it is not: `libs.bus.in_election` and
`until_answered`, the dispatcher's breaker outcome of a call this side held up, and the retry
class of the errors an election raises."""

from __future__ import annotations

import anyio
import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import (
    APIError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    ServiceUnavailableError,
)

from libs.bus import BusUnavailable, in_election, until_answered
from libs.errors import waits_out
from services.dispatcher.breaker import call_outcome


def _api(code: int, description: str) -> APIError:
    return APIError(code=code, err_code=0, description=description)


@pytest.mark.parametrize(
    "exc",
    [
        NoStreamResponseError(),
        NoRespondersError(),
        _api(503, "JetStream system temporarily unavailable"),
        _api(409, "duplicate message id is in process"),
        NatsTimeoutError(),
    ],
    ids=["no-stream-response", "no-responders", "503", "409-in-process", "timeout"],
)
def test_an_election_is_recognised(exc: Exception) -> None:
    assert in_election(exc)


@pytest.mark.parametrize(
    "exc",
    [
        _api(400, "stream name already in use with a different configuration"),
        _api(409, "consumer name already in use"),
        _api(404, "stream not found"),
        ValueError("not the bus"),
        KeyWrongLastSequenceError(),  # a key-value create that found the key: it sets no code
    ],
    ids=["400", "409-other", "404", "other", "kv-wrong-last-sequence"],
)
def test_an_answer_is_not_an_election(exc: Exception) -> None:
    assert not in_election(exc)


def test_a_timeout_is_an_election_only_where_repeating_is_harmless() -> None:
    # A publish without a message id may have been stored: sent again, it would be stored twice.
    assert not in_election(NatsTimeoutError(), idempotent=False)
    assert in_election(NoStreamResponseError(), idempotent=False)  # certainly not stored


def test_errors_an_election_raises_wait_out_instead_of_spending_retries() -> None:
    assert waits_out(NoStreamResponseError())
    assert waits_out(ServiceUnavailableError())
    assert waits_out(BusUnavailable("no answer"))


@pytest.mark.anyio
async def test_a_call_is_repeated_through_an_election_until_it_answers() -> None:
    calls: list[int] = []

    async def call() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise NoStreamResponseError()
        return "stored"

    assert await until_answered(call, what="publish") == "stored"
    assert len(calls) == 4


@pytest.mark.anyio
async def test_an_answer_that_is_not_an_election_is_raised_at_once() -> None:
    calls: list[int] = []

    async def call() -> None:
        calls.append(1)
        raise _api(400, "bad request")

    with pytest.raises(APIError):
        await until_answered(call, what="publish")
    assert len(calls) == 1


@pytest.mark.anyio
async def test_an_election_past_the_patience_is_bus_unavailable() -> None:
    async def call() -> None:
        raise NoStreamResponseError()

    with anyio.fail_after(5):
        with pytest.raises(BusUnavailable) as raised:
            await until_answered(call, what="publish to writ.cmd.acme", patience_s=0.3)
    assert "writ.cmd.acme" in str(raised.value)
    assert isinstance(raised.value.__cause__, NoStreamResponseError)


def test_a_call_this_side_held_up_does_not_count_against_the_tool() -> None:
    # A 1.5 s call that "timed out" after 7 s: the dispatcher was frozen, not the CRM slow.
    assert call_outcome("lost", elapsed_s=7.0, timeout_s=1.5) == "neutral"
    assert call_outcome("transient", elapsed_s=7.0, timeout_s=1.5) == "neutral"
    # The tool's own failures, in about the time it was given, count.
    assert call_outcome("lost", elapsed_s=1.6, timeout_s=1.5) == "transient"
    assert call_outcome("transient", elapsed_s=0.01, timeout_s=1.5) == "transient"
    # A success is a success however long it took.
    assert call_outcome("succeeded", elapsed_s=7.0, timeout_s=1.5) == "success"
    assert call_outcome("rejected", elapsed_s=0.1, timeout_s=1.5) == "neutral"
