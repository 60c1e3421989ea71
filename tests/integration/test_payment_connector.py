"""The payment connector against a real fake payment provider on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest

from fakes.payments import FakePayments
from libs.errors import PermanentError, RetryableError
from services.dispatcher.connectors.base import Connector, Result
from services.dispatcher.connectors.payments import PaymentConnector, PaymentReadRefused, ReadFailed

pytestmark = pytest.mark.anyio

TOKEN = "pay-token"
ACTION = "payment.charge.create"
ARGS: dict[str, Any] = {
    "customer_id": "ACME-42",
    "amount_cents": 4200,
    "currency": "USD",
    "description": "Consulting, March",
}


@pytest.fixture
def provider() -> Iterator[FakePayments]:
    with FakePayments(token=TOKEN, queryable=True) as server:
        yield server


@pytest.fixture
async def control(provider: FakePayments) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=provider.url, timeout=5) as c:
        yield c


@pytest.fixture
async def connector(provider: FakePayments) -> AsyncIterator[PaymentConnector]:
    conn = PaymentConnector(base_url=provider.url, token=TOKEN, queryable=True, timeout_s=5)
    yield conn
    await conn.aclose()


async def charges(control: httpx.AsyncClient) -> list[dict[str, Any]]:
    return (await control.get("/_control/charges")).json()


async def set_mode(
    control: httpx.AsyncClient, mode: str, count: int | None = 1, delay_s: float = 0.0
) -> None:
    r = await control.post(
        "/_control/mode", json={"mode": mode, "count": count, "delay_s": delay_s}
    )
    assert r.status_code == 200, r.text


async def charge(connector: PaymentConnector, key: str, **overrides: Any) -> Result:
    return await connector.execute(ACTION, {**ARGS, **overrides}, key=key, expected_revision=None)


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 5.0) -> Any:
    """Poll `check` until it returns something truthy, and return that."""
    with anyio.fail_after(timeout):
        while True:
            if value := await check():
                return value
            await anyio.sleep(0.01)


async def test_declares_its_contract_per_instance(provider: FakePayments) -> None:
    queryable = PaymentConnector(base_url=provider.url, token=TOKEN, queryable=True)
    blind = PaymentConnector(base_url=provider.url, token=TOKEN, queryable=False)
    try:
        conns: list[Connector] = [queryable, blind]
        assert [(c.name, c.contract) for c in conns] == [
            ("payments", "queryable"),
            ("payments", "none"),
        ]
    finally:
        await queryable.aclose()
        await blind.aclose()


async def test_charge_succeeds_with_the_charge_id(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    result = await charge(connector, "t1:op1")
    assert result == Result(kind="succeeded", receipt="ch_1")
    [charged] = await charges(control)
    assert charged["reference"] == "t1:op1"
    assert {k: charged[k] for k in ARGS} == ARGS


async def test_lost_response_is_lost_and_charged_once(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    await set_mode(control, "lose_response")
    result = await charge(connector, "t1:op1")
    assert result.kind == "lost" and result.receipt is None
    assert len(await charges(control)) == 1


async def test_lookup_after_a_lost_response_finds_the_charge(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    await set_mode(control, "lose_response")
    assert (await charge(connector, "t1:op1")).kind == "lost"
    [charged] = await charges(control)
    found = await connector.lookup(ACTION, key="t1:op1")
    assert found == Result(kind="succeeded", receipt=charged["charge_id"])


async def test_lookup_of_an_unknown_key_is_not_found(connector: PaymentConnector) -> None:
    assert (await charge(connector, "t1:op1")).kind == "succeeded"
    assert await connector.lookup(ACTION, key="t1:other") == Result(kind="not_found")


async def test_lookup_finding_duplicates_is_rejected(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    await charge(connector, "t1:op1")
    await charge(connector, "t1:op1")  # the provider does not dedupe
    found = await connector.lookup(ACTION, key="t1:op1")
    assert found.kind == "rejected"
    assert "duplicate" in found.detail and "ch_1" in found.detail and "ch_2" in found.detail


async def test_lookup_is_transient_when_the_provider_is_down(
    provider: FakePayments, connector: PaymentConnector
) -> None:
    provider.stop()
    assert (await connector.lookup(ACTION, key="t1:op1")).kind == "transient"


async def test_lookup_is_transient_when_the_provider_cannot_be_queried(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    await control.post("/_control/queryable", json={"queryable": False})
    result = await connector.lookup(ACTION, key="t1:op1")
    assert result.kind == "transient" and "404" in result.detail


async def test_fail_mode_is_transient_without_a_charge(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    await set_mode(control, "fail")
    assert (await charge(connector, "t1:op1")).kind == "transient"
    assert await charges(control) == []


async def test_execute_is_transient_when_the_provider_is_down(
    provider: FakePayments, connector: PaymentConnector
) -> None:
    provider.stop()
    assert (await charge(connector, "t1:op1")).kind == "transient"


async def test_timeout_is_lost_and_the_charge_lands_later(
    provider: FakePayments, control: httpx.AsyncClient
) -> None:
    await set_mode(control, "slow", delay_s=0.5)
    conn = PaymentConnector(base_url=provider.url, token=TOKEN, queryable=True, timeout_s=0.1)
    try:
        assert (await charge(conn, "t1:op1")).kind == "lost"
    finally:
        await conn.aclose()
    [late] = await eventually(lambda: charges(control))
    assert late["reference"] == "t1:op1"


async def test_arguments_outside_the_contract_are_rejected_before_the_provider_sees_them(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    # The request is built by the action's contract from its own typed arguments.
    result = await charge(connector, "t1:op1", currency="usd")
    assert result.kind == "rejected" and "currency" in result.detail
    assert await charges(control) == []
    assert (await control.get("/_control/calls")).json()["calls"] == 0


async def test_another_systems_action_is_rejected(connector: PaymentConnector) -> None:
    result = await connector.execute(
        "crm.note.create",
        {"customer_id": "ACME-42", "body": "x"},
        key="t1:op1",
        expected_revision=None,
    )
    assert (result.kind, result.detail) == ("rejected", "payments cannot perform crm.note.create")


async def test_bad_token_is_rejected(provider: FakePayments) -> None:
    conn = PaymentConnector(base_url=provider.url, token="wrong", queryable=True)
    try:
        result = await charge(conn, "t1:op1")
    finally:
        await conn.aclose()
    assert result.kind == "rejected" and "401" in result.detail


async def test_unknown_action_or_revision_is_rejected_without_a_call(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    other = await connector.execute("crm.note.create", ARGS, key="k", expected_revision=None)
    revised = await connector.execute(ACTION, ARGS, key="k", expected_revision="r1")
    assert (other.kind, revised.kind) == ("rejected", "rejected")
    assert (await control.get("/_control/calls")).json() == {"calls": 0}


# Refunds and reading payments.

REFUND = "payment.refund"
PAYMENT: dict[str, Any] = {
    "payment_id": "pay_7",
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
            "discount": {"discount_id": "D1", "name": "Junior", "amount_cents": 1500},
        }
    ],
}
REFUND_ARGS: dict[str, Any] = {
    "payment_id": "pay_7",
    "line_id": "L1",
    "amount_cents": 1500,
    "destination": {"kind": "original_method", "last4": "4242"},
}
# The refund's frozen arguments (actions/payment_refund.py): what the provider gets, and more.
FROZEN: dict[str, Any] = {**REFUND_ARGS, "discount_id": "D1", "currency": "EUR"}


@pytest.fixture
async def paid(control: httpx.AsyncClient) -> None:
    r = await control.post("/_control/payments", json=PAYMENT)
    assert r.status_code == 200, r.text


async def refunds(control: httpx.AsyncClient) -> list[dict[str, Any]]:
    return (await control.get("/_control/refunds")).json()


async def refund(connector: PaymentConnector, key: str, **overrides: Any) -> Result:
    return await connector.execute(REFUND, {**FROZEN, **overrides}, key=key, expected_revision=None)


@pytest.mark.usefixtures("paid")
async def test_read_payment_shows_its_facts_and_refunds(connector: PaymentConnector) -> None:
    payment = await connector.read_payment("pay_7")
    assert payment is not None
    assert (payment["amount_cents"], payment["refunded_cents"], payment["refunds"]) == (
        12000,
        0,
        [],
    )
    assert payment["method"] == PAYMENT["method"]
    assert (await refund(connector, "t1:op1")).kind == "succeeded"
    after = await connector.read_payment("pay_7")
    assert after is not None and after["refunded_cents"] == 1500
    assert [r["refund_id"] for r in after["refunds"]] == ["re_1"]


async def test_read_payment_of_an_unknown_id_is_none(connector: PaymentConnector) -> None:
    assert await connector.read_payment("pay_404") is None
    assert await connector.read_payment("pay_7/../../charges") is None  # escaped, not a path


async def test_read_payment_raises_retryable_when_the_provider_is_down(
    provider: FakePayments, connector: PaymentConnector
) -> None:
    provider.stop()
    with pytest.raises(ReadFailed) as caught:
        await connector.read_payment("pay_7")
    assert isinstance(caught.value, RetryableError)
    assert (caught.value.payment_id, caught.value.status) == ("pay_7", None)


@pytest.mark.usefixtures("paid")
async def test_read_payment_with_a_bad_token_is_permanent(provider: FakePayments) -> None:
    conn = PaymentConnector(base_url=provider.url, token="wrong", queryable=True)
    try:
        with pytest.raises(PaymentReadRefused) as caught:
            await conn.read_payment("pay_7")
    finally:
        await conn.aclose()
    assert isinstance(caught.value, PermanentError) and caught.value.status == 401


@pytest.mark.usefixtures("paid")
async def test_refund_succeeds_with_the_refund_id(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    assert await refund(connector, "t1:op1") == Result(kind="succeeded", receipt="re_1")
    [made] = await refunds(control)
    assert made["reference"] == "t1:op1"
    assert {k: made[k] for k in REFUND_ARGS} == REFUND_ARGS


@pytest.mark.usefixtures("paid")
async def test_over_refund_is_rejected_with_the_providers_reason(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    result = await refund(connector, "t1:op1", amount_cents=12001)
    assert result.kind == "rejected" and result.receipt is None
    assert "409" in result.detail and "exceeds what is left to refund" in result.detail
    assert await refunds(control) == []


@pytest.mark.usefixtures("paid")
async def test_wrong_destination_is_rejected(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    result = await refund(
        connector, "t1:op1", destination={"kind": "original_method", "last4": "1881"}
    )
    assert result.kind == "rejected" and "does not match" in result.detail
    assert await refunds(control) == []


@pytest.mark.usefixtures("paid")
async def test_lost_refund_is_lost_made_once_and_found_by_lookup(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    await set_mode(control, "lose_response")
    result = await refund(connector, "t1:op1")
    assert result.kind == "lost" and result.receipt is None
    [made] = await refunds(control)
    found = await connector.lookup(REFUND, key="t1:op1")
    assert found == Result(kind="succeeded", receipt=made["refund_id"])
    payment = await connector.read_payment("pay_7")
    assert payment is not None and payment["refunded_cents"] == 1500


@pytest.mark.usefixtures("paid")
async def test_slow_refund_is_lost_and_lands_later(
    provider: FakePayments, control: httpx.AsyncClient
) -> None:
    await set_mode(control, "slow", delay_s=0.5)
    conn = PaymentConnector(base_url=provider.url, token=TOKEN, queryable=True, timeout_s=0.1)
    try:
        assert (await refund(conn, "t1:op1")).kind == "lost"
    finally:
        await conn.aclose()
    [late] = await eventually(lambda: refunds(control))
    assert late["reference"] == "t1:op1"


@pytest.mark.usefixtures("paid")
async def test_fail_mode_is_transient_without_a_refund(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    await set_mode(control, "fail")
    assert await refund(connector, "t1:op1") == Result(kind="transient", detail="HTTP 503")
    assert await refunds(control) == []


async def test_refund_is_transient_when_the_provider_is_down(
    provider: FakePayments, connector: PaymentConnector
) -> None:
    provider.stop()
    assert (await refund(connector, "t1:op1")).kind == "transient"


@pytest.mark.usefixtures("paid")
async def test_refund_lookup_of_an_unknown_key_is_not_found(connector: PaymentConnector) -> None:
    assert (await refund(connector, "t1:op1")).kind == "succeeded"
    assert await connector.lookup(REFUND, key="t1:other") == Result(kind="not_found")
    # A charge under the same key is not a refund.
    assert await connector.lookup(ACTION, key="t1:op1") == Result(kind="not_found")


@pytest.mark.usefixtures("paid")
async def test_refund_lookup_finding_duplicates_is_rejected(connector: PaymentConnector) -> None:
    await refund(connector, "t1:op1")
    await refund(connector, "t1:op1")  # the provider does not dedupe
    found = await connector.lookup(REFUND, key="t1:op1")
    assert found.kind == "rejected"
    assert "duplicate" in found.detail and "re_1" in found.detail and "re_2" in found.detail


async def test_refund_lookup_is_transient_when_the_provider_cannot_be_queried(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    await control.post("/_control/queryable", json={"queryable": False})
    result = await connector.lookup(REFUND, key="t1:op1")
    assert result.kind == "transient" and "404" in result.detail


async def test_refund_with_missing_arguments_is_rejected_without_a_call(
    connector: PaymentConnector, control: httpx.AsyncClient
) -> None:
    args = {k: v for k, v in FROZEN.items() if k != "destination"}
    result = await connector.execute(REFUND, args, key="k", expected_revision=None)
    assert result.kind == "rejected" and "destination" in result.detail
    revised = await connector.execute(REFUND, FROZEN, key="k", expected_revision="r1")
    assert revised.kind == "rejected"
    assert (await control.get("/_control/calls")).json() == {"calls": 0}
