"""The fake payment provider, driven over real HTTP on loopback."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from fakes.payments import FakePayments

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token"
ROOT = Path(__file__).resolve().parents[2]
CHARGE: dict[str, Any] = {
    "customer_id": "ACME-42",
    "amount_cents": 1250,
    "currency": "EUR",
    "description": "March invoice",
}


@pytest.fixture
def payments() -> Iterator[FakePayments]:
    with FakePayments(token=TOKEN) as server:
        yield server


@pytest.fixture
async def client(payments: FakePayments) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=payments.url, headers=headers, timeout=5) as c:
        yield c


async def charge(
    client: httpx.AsyncClient, reference: str | None, body: Any = None, **headers: str
) -> httpx.Response:
    if reference is not None:
        headers["Reference"] = reference
    return await client.post("/v1/charges", json=CHARGE if body is None else body, headers=headers)


async def stored_charges(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    return (await client.get("/_control/charges")).json()


async def calls(client: httpx.AsyncClient) -> int:
    return (await client.get("/_control/calls")).json()["calls"]


async def set_mode(
    client: httpx.AsyncClient, mode: str, count: int | None = None, delay_s: float = 0.0
) -> None:
    r = await client.post("/_control/mode", json={"mode": mode, "count": count, "delay_s": delay_s})
    assert r.status_code == 200, r.text


async def set_queryable(client: httpx.AsyncClient, queryable: Any) -> httpx.Response:
    return await client.post("/_control/queryable", json={"queryable": queryable})


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 5.0) -> Any:
    """Poll `check` until it returns something truthy, and return that."""
    with anyio.fail_after(timeout):
        while True:
            if value := await check():
                return value
            await anyio.sleep(0.01)


async def test_healthz_needs_no_token(payments: FakePayments) -> None:
    async with httpx.AsyncClient(base_url=payments.url) as anon:
        r = await anon.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})


async def test_charge_is_captured_and_stored(client: httpx.AsyncClient) -> None:
    r = await charge(client, "t1:op1")
    assert r.status_code == 201
    created = r.json()
    assert created.pop("created_at")
    assert created == {
        "charge_id": "ch_1",
        "reference": "t1:op1",
        "status": "captured",
        **CHARGE,
    }
    assert await stored_charges(client) == [r.json()]
    assert await calls(client) == 1


async def test_reference_is_optional(client: httpx.AsyncClient) -> None:
    r = await charge(client, None)
    assert (r.status_code, r.json()["reference"]) == (201, None)


async def test_same_reference_twice_charges_twice(client: httpx.AsyncClient) -> None:
    first, second = await charge(client, "k1"), await charge(client, "k1")
    assert (first.status_code, second.status_code) == (201, 201)
    assert (first.json()["charge_id"], second.json()["charge_id"]) == ("ch_1", "ch_2")
    assert [c["reference"] for c in await stored_charges(client)] == ["k1", "k1"]
    assert await calls(client) == 2


@pytest.mark.parametrize(
    "body",
    [
        [1, 2],
        {**CHARGE, "amount_cents": 0},
        {**CHARGE, "amount_cents": True},
        {**CHARGE, "amount_cents": 12.5},
        {**CHARGE, "amount_cents": 100_000_001},
        {**CHARGE, "currency": "eur"},
        {**CHARGE, "customer_id": ""},
        {**CHARGE, "customer_id": "a/b"},
        {**CHARGE, "description": None},
        {**CHARGE, "description": "x" * 501},
        {**CHARGE, "capture": False},
        {k: v for k, v in CHARGE.items() if k != "currency"},
    ],
)
async def test_invalid_charge_is_400_without_effect(client: httpx.AsyncClient, body: Any) -> None:
    r = await charge(client, "k1", body)
    assert r.status_code == 400, r.text
    assert await stored_charges(client) == []


@pytest.mark.parametrize("reference", ["", "x" * 256])
async def test_bad_reference_is_400_without_effect(
    client: httpx.AsyncClient, reference: str
) -> None:
    r = await charge(client, reference)
    assert r.status_code == 400
    assert await stored_charges(client) == []


@pytest.mark.parametrize("content", [b"{not json", b""])
async def test_malformed_json_is_400_without_effect(
    client: httpx.AsyncClient, content: bytes
) -> None:
    r = await client.post(
        "/v1/charges", content=content, headers={"Content-Type": "application/json"}
    )
    assert (r.status_code, r.json()) == (400, {"error": "malformed JSON"})
    assert await stored_charges(client) == []


async def test_oversized_body_is_413_without_effect(client: httpx.AsyncClient) -> None:
    r = await charge(client, "k1", {**CHARGE, "description": "x" * (64 * 1024)})
    assert r.status_code == 413
    assert await stored_charges(client) == []


@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Basic {TOKEN}", TOKEN])
async def test_bad_token_is_401_without_effect(
    payments: FakePayments, client: httpx.AsyncClient, auth: str | None
) -> None:
    await set_queryable(client, True)
    headers = {"Authorization": auth} if auth else {}
    async with httpx.AsyncClient(base_url=payments.url, headers=headers) as anon:
        r = await anon.post("/v1/charges", json=CHARGE, headers={"Reference": "k1"})
        lookup = await anon.get("/v1/charges", params={"reference": "k1"})
    assert (r.status_code, r.json()) == (401, {"error": "unauthorized"})
    assert lookup.status_code == 401
    assert await stored_charges(client) == []
    assert await calls(client) == 1


async def test_fail_mode_is_503_without_effect_then_recovers(client: httpx.AsyncClient) -> None:
    await set_mode(client, "fail", count=1)
    r = await charge(client, "k1")
    assert (r.status_code, r.json()) == (503, {"error": "unavailable"})
    assert await stored_charges(client) == []
    assert (await charge(client, "k1")).status_code == 201
    assert len(await stored_charges(client)) == 1


async def test_fail_mode_without_count_lasts_until_changed(client: httpx.AsyncClient) -> None:
    await set_mode(client, "fail")
    assert [(await charge(client, "k1")).status_code for _ in range(3)] == [503] * 3
    await set_mode(client, "normal")
    assert (await charge(client, "k1")).status_code == 201
    assert await calls(client) == 4


async def test_lose_response_charges_and_drops_the_connection(client: httpx.AsyncClient) -> None:
    await set_mode(client, "lose_response", count=1)
    with pytest.raises(httpx.RemoteProtocolError):
        await charge(client, "k1")
    [charged] = await stored_charges(client)
    assert (charged["charge_id"], charged["reference"]) == ("ch_1", "k1")
    # The retry a naive client would make is a second charge.
    assert (await charge(client, "k1")).json()["charge_id"] == "ch_2"
    assert len(await stored_charges(client)) == 2


async def test_slow_mode_charges_after_the_delay(client: httpx.AsyncClient) -> None:
    await set_mode(client, "slow", count=1, delay_s=0.5)
    with pytest.raises(httpx.ReadTimeout):
        await client.post("/v1/charges", json=CHARGE, headers={"Reference": "k1"}, timeout=0.1)
    assert await stored_charges(client) == []
    await eventually(lambda: stored_charges(client))
    started = time.monotonic()
    assert (await charge(client, "k2")).status_code == 201  # count=1: back to normal
    assert time.monotonic() - started < 0.4


@pytest.mark.parametrize(
    "mode", [{"mode": "chaos"}, {"mode": "fail", "count": 0}, {"mode": "slow", "delay_s": -1}]
)
async def test_bad_mode_is_rejected(client: httpx.AsyncClient, mode: dict[str, Any]) -> None:
    assert (await client.post("/_control/mode", json=mode)).status_code == 400
    assert (await charge(client, "k1")).status_code == 201


async def test_lookup_is_404_when_not_queryable(client: httpx.AsyncClient) -> None:
    await charge(client, "k1")
    r = await client.get("/v1/charges", params={"reference": "k1"})
    assert (r.status_code, r.json()) == (404, {"error": "lookup not supported"})
    assert (await client.get("/v1/charges")).status_code == 404


async def test_lookup_by_reference_when_queryable(client: httpx.AsyncClient) -> None:
    assert (await set_queryable(client, True)).json() == {"queryable": True}
    first, _, third = [(await charge(client, ref)).json() for ref in ("k1", "k2", "k1")]
    r = await client.get("/v1/charges", params={"reference": "k1"})
    assert (r.status_code, r.json()) == (200, {"charges": [first, third]})
    none = await client.get("/v1/charges", params={"reference": "other"})
    assert none.json() == {"charges": []}
    assert (await client.get("/v1/charges")).status_code == 400


async def test_the_call_log_names_each_charge_and_lookup_by_reference(
    client: httpx.AsyncClient,
) -> None:
    await set_queryable(client, True)
    await charge(client, "k1")
    await set_mode(client, "lose_response", count=1)
    with pytest.raises(httpx.RemoteProtocolError):
        await charge(client, "k2")
    await client.get("/v1/charges", params={"reference": "k2"})
    assert (await client.get("/_control/log")).json()["log"] == [
        {"kind": "write", "key": "k1", "answered": True},
        {"kind": "write", "key": "k2", "answered": False},
        {"kind": "lookup", "key": "k2", "answered": True},
    ]


async def test_queryable_switches_at_runtime(client: httpx.AsyncClient) -> None:
    await set_queryable(client, True)
    assert (await client.get("/v1/charges", params={"reference": "k1"})).status_code == 200
    await set_queryable(client, False)
    assert (await client.get("/v1/charges", params={"reference": "k1"})).status_code == 404
    assert (await set_queryable(client, "yes")).status_code == 400


async def test_constructor_queryable_is_what_reset_restores() -> None:
    with FakePayments(token=TOKEN, queryable=True) as payments:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=payments.url, headers=headers) as client:
            assert (await client.get("/v1/charges", params={"reference": "k"})).status_code == 200
            await set_queryable(client, False)
            await client.post("/_control/reset")
            assert (await client.get("/v1/charges", params={"reference": "k"})).status_code == 200


async def test_reset_forgets_charges_calls_and_mode(client: httpx.AsyncClient) -> None:
    await charge(client, "k1")
    await set_mode(client, "fail")
    await set_queryable(client, True)
    assert (await client.post("/_control/reset")).status_code == 200
    assert await stored_charges(client) == [] and await calls(client) == 0
    r = await charge(client, "k1")
    assert (r.status_code, r.json()["charge_id"]) == (201, "ch_1")
    assert (await client.get("/v1/charges", params={"reference": "k1"})).status_code == 404


async def test_concurrent_charges_with_one_reference_all_charge(
    client: httpx.AsyncClient,
) -> None:
    statuses: list[int] = []

    async def one() -> None:
        statuses.append((await charge(client, "k1")).status_code)

    async with anyio.create_task_group() as tg:
        for _ in range(16):
            tg.start_soon(one)
    assert statuses == [201] * 16
    ids = [c["charge_id"] for c in await stored_charges(client)]
    assert sorted(ids) == sorted(f"ch_{n}" for n in range(1, 17))


async def test_stop_hangs_up_idle_and_cuts_slow_requests_short() -> None:
    payments = FakePayments(token=TOKEN)
    payments.start()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=payments.url, headers=headers) as client:
        await set_mode(client, "slow", delay_s=60)

        async def slow_charge() -> None:
            # Whether the slow request gets its answer or a hang-up is a race; either is fine.
            try:
                await charge(client, "k1")
            except httpx.TransportError:
                pass

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(slow_charge)
                await eventually(lambda: calls(client))
                # stop() blocks on joins, so run it off the loop the request is waiting on.
                await anyio.to_thread.run_sync(payments.stop)
    payments.stop()  # idempotent


async def test_stop_without_start_releases_the_port() -> None:
    FakePayments(token=TOKEN).stop()


async def test_empty_token_is_refused() -> None:
    with pytest.raises(ValueError):
        FakePayments(token="")


async def test_main_serves_until_sigterm(tmp_path: Path) -> None:
    token_file, ready = anyio.Path(tmp_path / "token"), anyio.Path(tmp_path / "ready")
    await token_file.write_text(TOKEN + "\n")
    cmd = [
        sys.executable,
        "-m",
        "fakes.payments",
        "--port",
        "0",
        "--token-file",
        str(token_file),
        "--ready-file",
        str(ready),
        "--queryable",
    ]
    async with await anyio.open_process(cmd, cwd=ROOT) as proc:
        try:
            await eventually(ready.exists, timeout=20)
            url = await ready.read_text()
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=url, headers=headers) as client:
                assert (await charge(client, "k1")).status_code == 201
                found = await client.get("/v1/charges", params={"reference": "k1"})
                assert len(found.json()["charges"]) == 1
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(10):
                assert await proc.wait() == 0
            assert proc.stdout is not None
            assert (await proc.stdout.receive()).decode().strip() == url
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


# Payments and refunds.

LINE: dict[str, Any] = {
    "line_id": "L1",
    "product": "Winter league",
    "participant": "Ada Lovelace",
    "amount_cents": 12000,
    "discount": {"discount_id": "D1", "name": "Junior", "amount_cents": 1500},
}
PAYMENT: dict[str, Any] = {
    "payment_id": "pay_1",
    "customer_id": "ACME-42",
    "currency": "EUR",
    "status": "captured",
    "method": {"kind": "card", "last4": "4242", "usable": True},
    "lines": [LINE, {**LINE, "line_id": "L2", "amount_cents": 3000, "discount": None}],
}
REFUND: dict[str, Any] = {
    "payment_id": "pay_1",
    "line_id": "L1",
    "amount_cents": 1500,
    "destination": {"kind": "original_method", "last4": "4242"},
}


async def upsert(client: httpx.AsyncClient, payment: Any = None) -> httpx.Response:
    return await client.post("/_control/payments", json=PAYMENT if payment is None else payment)


async def refund(
    client: httpx.AsyncClient, reference: str | None = "t1:op1", body: Any = None, **overrides: Any
) -> httpx.Response:
    headers = {} if reference is None else {"Reference": reference}
    return await client.post(
        "/v1/refunds", json={**REFUND, **overrides} if body is None else body, headers=headers
    )


async def stored_refunds(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    return (await client.get("/_control/refunds")).json()


async def read(client: httpx.AsyncClient, payment_id: str = "pay_1") -> dict[str, Any]:
    r = await client.get(f"/v1/payments/{payment_id}")
    assert r.status_code == 200, r.text
    return r.json()


async def test_upserted_payment_reads_back_with_computed_fields(
    client: httpx.AsyncClient,
) -> None:
    r = await upsert(client)
    assert r.status_code == 200, r.text
    payment = await read(client)
    assert r.json() == payment
    assert payment == {
        **PAYMENT,
        "lines": [{**line, "refunded_cents": 0} for line in PAYMENT["lines"]],
        "amount_cents": 15000,
        "refunded_cents": 0,
        "refunds": [],
    }


@pytest.mark.parametrize(
    "payment",
    [
        [PAYMENT],
        {**PAYMENT, "extra": 1},
        {k: v for k, v in PAYMENT.items() if k != "method"},
        {**PAYMENT, "payment_id": "ch_1"},
        {**PAYMENT, "payment_id": "pay_a/b"},
        {**PAYMENT, "payment_id": "pay_" + "x" * 65},
        {**PAYMENT, "customer_id": ""},
        {**PAYMENT, "currency": "eur"},
        {**PAYMENT, "status": "refunded"},
        {**PAYMENT, "method": {"kind": "card", "last4": "424", "usable": True}},
        {**PAYMENT, "method": {"kind": "cash", "last4": "4242", "usable": True}},
        {**PAYMENT, "method": {"kind": "card", "last4": "4242", "usable": 1}},
        {**PAYMENT, "method": {"kind": "card", "last4": "4242", "usable": True, "cvc": "1"}},
        {**PAYMENT, "lines": []},
        {**PAYMENT, "lines": [LINE] * 101},
        {**PAYMENT, "lines": [LINE, LINE]},
        {**PAYMENT, "lines": [{**LINE, "line_id": "L 1"}]},
        {**PAYMENT, "lines": [{**LINE, "amount_cents": 0}]},
        {**PAYMENT, "lines": [{**LINE, "amount_cents": True}]},
        {**PAYMENT, "lines": [{**LINE, "amount_cents": 100_000_001}]},
        {**PAYMENT, "lines": [{**LINE, "product": ""}]},
        {**PAYMENT, "lines": [{**LINE, "participant": "x" * 201}]},
        {**PAYMENT, "lines": [{**LINE, "note": "hi"}]},
        {**PAYMENT, "lines": [{k: v for k, v in LINE.items() if k != "discount"}]},
        {**PAYMENT, "lines": [{**LINE, "discount": {**LINE["discount"], "amount_cents": 12001}}]},
        {**PAYMENT, "lines": [{**LINE, "discount": {**LINE["discount"], "name": ""}}]},
        {**PAYMENT, "lines": [{**LINE, "discount": {**LINE["discount"], "percent": 10}}]},
    ],
)
async def test_invalid_payment_is_400_and_not_stored(
    client: httpx.AsyncClient, payment: Any
) -> None:
    r = await upsert(client, payment)
    assert r.status_code == 400, r.text
    assert (await client.get("/v1/payments/pay_1")).status_code == 404


async def test_unknown_payment_is_404_and_reading_needs_the_token(
    payments: FakePayments, client: httpx.AsyncClient
) -> None:
    await upsert(client)
    assert (await client.get("/v1/payments/pay_2")).json() == {"error": "unknown payment"}
    assert (await client.get("/v1/payments/")).status_code == 404
    async with httpx.AsyncClient(base_url=payments.url) as anon:
        assert (await anon.get("/v1/payments/pay_1")).status_code == 401
        assert (await anon.post("/v1/refunds", json=REFUND)).status_code == 401
    assert await stored_refunds(client) == []


async def test_refund_is_made_and_counted_on_its_payment(client: httpx.AsyncClient) -> None:
    await upsert(client)
    r = await refund(client)
    assert r.status_code == 201, r.text
    made = r.json()
    assert made.pop("created_at")
    assert made == {"refund_id": "re_1", "reference": "t1:op1", "currency": "EUR", **REFUND}
    assert await stored_refunds(client) == [r.json()]
    payment = await read(client)
    assert (payment["amount_cents"], payment["refunded_cents"]) == (15000, 1500)
    assert [line["refunded_cents"] for line in payment["lines"]] == [1500, 0]
    assert payment["refunds"] == [r.json()]
    assert await calls(client) == 1


async def test_same_reference_twice_refunds_twice(client: httpx.AsyncClient) -> None:
    await upsert(client)
    first, second = await refund(client, "k1"), await refund(client, "k1")
    assert (first.status_code, second.status_code) == (201, 201)
    assert (first.json()["refund_id"], second.json()["refund_id"]) == ("re_1", "re_2")
    assert (await read(client))["refunded_cents"] == 3000


async def test_refunds_are_refused_beyond_what_is_left(client: httpx.AsyncClient) -> None:
    await upsert(client)
    assert (await refund(client, amount_cents=12000)).status_code == 201
    over_line = await refund(client, amount_cents=1)
    assert over_line.status_code == 409
    assert over_line.json() == {
        "error": "amount exceeds what is left to refund on the line",
        "refundable_cents": 0,
    }
    # L1 is replaced by L3 "in another tab": L3 has nothing refunded, but the payment's total
    # is no more than what was already refunded, and the payment's balance is what binds.
    l3 = {**LINE, "line_id": "L3", "amount_cents": 9000}
    await upsert(client, {**PAYMENT, "lines": [PAYMENT["lines"][1], l3]})
    over_payment = await refund(client, line_id="L3", amount_cents=1)
    assert (over_payment.status_code, over_payment.json()) == (
        409,
        {"error": "amount exceeds what is left to refund on the payment", "refundable_cents": 0},
    )
    assert len(await stored_refunds(client)) == 1
    payment = await read(client)
    assert (payment["amount_cents"], payment["refunded_cents"]) == (12000, 12000)
    assert [line["refunded_cents"] for line in payment["lines"]] == [0, 0]


async def test_upsert_replaces_facts_but_keeps_refunds(client: httpx.AsyncClient) -> None:
    await upsert(client)
    await refund(client)
    shrunk = {**PAYMENT, "lines": [{**LINE, "amount_cents": 1000, "discount": None}]}
    r = await upsert(client, shrunk)
    assert (r.json()["amount_cents"], r.json()["refunded_cents"]) == (1000, 1500)
    assert r.json()["lines"][0]["discount"] is None
    refused = await refund(client, amount_cents=1)
    assert (refused.status_code, refused.json()["refundable_cents"]) == (409, 0)


@pytest.mark.parametrize(
    ("facts", "error"),
    [
        ({"status": "authorized"}, "payment is authorized, not captured"),
        ({"status": "voided"}, "payment is voided, not captured"),
        (
            {"method": {"kind": "card", "last4": "4242", "usable": False}},
            "the payment's method can no longer receive refunds",
        ),
        (
            {"method": {"kind": "card", "last4": "1881", "usable": True}},
            "destination does not match the payment's method",
        ),
    ],
)
async def test_refund_is_409_when_the_payment_cannot_take_it(
    client: httpx.AsyncClient, facts: dict[str, Any], error: str
) -> None:
    await upsert(client, {**PAYMENT, **facts})
    r = await refund(client)
    assert (r.status_code, r.json()) == (409, {"error": error})
    assert await stored_refunds(client) == []
    assert await calls(client) == 1


async def test_refund_of_an_unknown_payment_or_line_is_404(client: httpx.AsyncClient) -> None:
    await upsert(client)
    unknown_payment = await refund(client, payment_id="pay_2")
    unknown_line = await refund(client, line_id="L9")
    assert unknown_payment.json() == {"error": "unknown payment"}
    assert unknown_line.json() == {"error": "unknown line"}
    assert (unknown_payment.status_code, unknown_line.status_code) == (404, 404)
    assert await stored_refunds(client) == []


@pytest.mark.parametrize(
    "body",
    [
        [REFUND],
        {**REFUND, "reason": "missing discount"},
        {k: v for k, v in REFUND.items() if k != "destination"},
        {**REFUND, "payment_id": 1},
        {**REFUND, "line_id": ""},
        {**REFUND, "amount_cents": 0},
        {**REFUND, "amount_cents": True},
        {**REFUND, "amount_cents": 100_000_001},
        {**REFUND, "destination": "original_method"},
        {**REFUND, "destination": {"kind": "bank_transfer", "last4": "4242"}},
        {**REFUND, "destination": {"kind": "original_method", "last4": "42x2"}},
        {**REFUND, "destination": {"kind": "original_method"}},
        {**REFUND, "destination": {"kind": "original_method", "last4": "4242", "iban": "x"}},
    ],
)
async def test_invalid_refund_is_400_without_effect(client: httpx.AsyncClient, body: Any) -> None:
    await upsert(client)
    r = await refund(client, body=body)
    assert r.status_code == 400, r.text
    assert await stored_refunds(client) == []


@pytest.mark.parametrize("reference", ["", "x" * 256])
async def test_bad_refund_reference_is_400(client: httpx.AsyncClient, reference: str) -> None:
    await upsert(client)
    assert (await refund(client, reference)).status_code == 400
    assert (await refund(client, None)).json()["reference"] is None
    assert len(await stored_refunds(client)) == 1


async def test_refund_lookup_only_when_queryable(client: httpx.AsyncClient) -> None:
    await upsert(client)
    first, _, third = [
        (await refund(client, ref, amount_cents=100)).json() for ref in ("k1", "k2", "k1")
    ]
    r = await client.get("/v1/refunds", params={"reference": "k1"})
    assert (r.status_code, r.json()) == (404, {"error": "lookup not supported"})
    await set_queryable(client, True)
    r = await client.get("/v1/refunds", params={"reference": "k1"})
    assert (r.status_code, r.json()) == (200, {"refunds": [first, third]})
    assert (await client.get("/v1/refunds", params={"reference": "x"})).json() == {"refunds": []}
    assert (await client.get("/v1/refunds")).status_code == 400
    # Charges and refunds are looked up separately.
    assert (await client.get("/v1/charges", params={"reference": "k1"})).json() == {"charges": []}


async def test_fail_mode_refuses_a_refund_without_effect(client: httpx.AsyncClient) -> None:
    await upsert(client)
    await set_mode(client, "fail", count=1)
    r = await refund(client)
    assert (r.status_code, r.json()) == (503, {"error": "unavailable"})
    assert await stored_refunds(client) == []
    assert (await refund(client)).status_code == 201
    assert await calls(client) == 2


async def test_lose_response_refunds_and_drops_the_connection(client: httpx.AsyncClient) -> None:
    await upsert(client)
    await set_mode(client, "lose_response", count=1)
    with pytest.raises(httpx.RemoteProtocolError):
        await refund(client, "k1")
    [made] = await stored_refunds(client)
    assert (made["refund_id"], made["reference"]) == ("re_1", "k1")
    assert (await read(client))["refunded_cents"] == 1500
    # The retry a naive client would make is a second refund.
    assert (await refund(client, "k1")).json()["refund_id"] == "re_2"
    assert (await read(client))["refunded_cents"] == 3000


async def test_lose_response_still_answers_a_refused_refund(client: httpx.AsyncClient) -> None:
    await upsert(client, {**PAYMENT, "status": "voided"})
    await set_mode(client, "lose_response", count=1)
    assert (await refund(client)).status_code == 409  # nothing was refunded, nothing to lose
    await upsert(client)
    assert (await refund(client)).status_code == 201  # the mode was used up


async def test_slow_mode_refunds_after_the_delay(client: httpx.AsyncClient) -> None:
    await upsert(client)
    await set_mode(client, "slow", count=1, delay_s=0.5)
    with pytest.raises(httpx.ReadTimeout):
        await client.post("/v1/refunds", json=REFUND, headers={"Reference": "k1"}, timeout=0.1)
    assert await stored_refunds(client) == []
    [late] = await eventually(lambda: stored_refunds(client))
    assert late["reference"] == "k1"


async def test_concurrent_refunds_never_exceed_the_line(client: httpx.AsyncClient) -> None:
    await upsert(client)
    statuses: list[int] = []

    async def one() -> None:
        statuses.append((await refund(client, "k1", amount_cents=1000)).status_code)

    async with anyio.create_task_group() as tg:
        for _ in range(16):
            tg.start_soon(one)
    assert sorted(statuses) == [201] * 12 + [409] * 4
    assert (await read(client))["refunded_cents"] == 12000


async def test_reset_forgets_payments_and_refunds(client: httpx.AsyncClient) -> None:
    await upsert(client)
    await refund(client)
    await client.post("/_control/reset")
    assert await stored_refunds(client) == []
    assert (await client.get("/v1/payments/pay_1")).status_code == 404
    await upsert(client)
    assert (await refund(client)).json()["refund_id"] == "re_1"
