"""Spend caps' price tables: believed only when signed for the tenant by a known key; costs in
exact micros, rounded up; windows are the tenant's calendar day or month."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from services.governance.spend import (
    ActionPrice,
    Cap,
    Charge,
    ModelPrice,
    PricesRefused,
    PriceTable,
    Unpriced,
    charge_for,
    covering,
    load_prices,
    money,
    read_prices,
    sign_prices,
    window_key,
)
from writ.cli import main

KEY = Ed25519PrivateKey.generate()
KEYS = {"ops-1": KEY.public_key()}
TABLE = PriceTable(
    tenant="acme",
    version="2026-12",
    currency="EUR",
    time_zone="Pacific/Auckland",
    models={"openai/gpt-test": ModelPrice(input_per_mtok="0.15", output_per_mtok="0.60")},
    actions={
        "payment.charge.create": ActionPrice(per_call="0.01", amount_from_arguments=True),
        "crm.lookup": ActionPrice(per_call="0.002"),
    },
    caps=[
        Cap(name="tenant-month", window="month", limit="500"),
        Cap(name="billing-day", window="day", limit="20.50", agent="billing"),
    ],
)


def test_a_signed_table_loads_and_any_change_is_refused() -> None:
    signed = sign_prices(TABLE, KEY, "ops-1")
    table, digest = load_prices(signed, "acme", KEYS)
    assert table == TABLE and len(digest) == 64
    body = json.loads(signed)
    body["prices"]["caps"][0]["limit"] = "5000"
    with pytest.raises(PricesRefused, match="does not verify"):
        load_prices(json.dumps(body).encode(), "acme", KEYS)
    with pytest.raises(PricesRefused, match="signed for tenant"):
        load_prices(signed, "globex", KEYS)
    with pytest.raises(PricesRefused, match="unknown signing key"):
        load_prices(signed, "acme", {"other": KEY.public_key()})
    other = Ed25519PrivateKey.generate()
    with pytest.raises(PricesRefused, match="does not verify"):
        load_prices(sign_prices(TABLE, other, "ops-1"), "acme", KEYS)


def test_an_invalid_table_is_refused_even_when_signed() -> None:
    body = json.loads(sign_prices(TABLE, KEY, "ops-1"))
    for bad in ({"limit": "1e3"}, {"limit": 12.5}, {"window": "week"}, {"surprise": 1}):
        prices = {**body["prices"], "caps": [{**body["prices"]["caps"][0], **bad}]}
        resigned = sign_prices_raw(prices)
        with pytest.raises(PricesRefused, match="not a valid price file"):
            load_prices(resigned, "acme", KEYS)
    for prices in (
        {**body["prices"], "time_zone": "Mars/Olympus"},
        {**body["prices"], "caps": body["prices"]["caps"] * 2},  # two caps, one name
    ):
        with pytest.raises(PricesRefused, match="not a valid price file"):
            load_prices(sign_prices_raw(prices), "acme", KEYS)


def sign_prices_raw(prices: dict[str, Any]) -> bytes:
    value = base64.b64encode(KEY.sign(rfc8785.dumps(prices))).decode()
    return json.dumps({"prices": prices, "signature": {"key_id": "ops-1", "value": value}}).encode()


def test_costs_are_exact_micros_rounded_up() -> None:
    model = charge_for(TABLE, model="openai/gpt-test", action=None, amount=None)
    assert model == Charge(input_rate=150_000, output_rate=600_000)
    # 10,000 tokens at the dearer rate: 0.006; what was used: 1,000 in, 1,001 out.
    assert model.worst(tokens=10_000, calls=1) == 6_000
    assert model.cost(calls=1, tokens=2_001, input_tokens=1_000, output_tokens=1_001) == 150 + 601
    # Without the split, every token at the dearer rate (never less than it may have cost).
    assert model.cost(calls=1, tokens=2_001) == 1_201
    charge = charge_for(
        TABLE, model=None, action="payment.charge.create", amount="120.00", currency="EUR"
    )
    assert charge is not None and charge.worst(tokens=0, calls=1) == money("120.01")
    assert charge.cost(calls=0) == 0  # released before the call: nothing
    # The amount is read only where the operator says so.
    assert charge_for(TABLE, model=None, action="crm.lookup", amount="9999").worst(  # type: ignore[union-attr]
        tokens=0, calls=1
    ) == money("0.002")
    assert charge_for(TABLE, model="other/model", action="other.tool", amount="5") is None


def test_an_action_priced_by_its_amount_without_one_in_the_tables_currency_is_unpriced() -> None:
    for amount, currency in ((None, None), ("120.00", "USD"), ("120.00", None)):
        with pytest.raises(Unpriced):
            charge_for(
                TABLE,
                model=None,
                action="payment.charge.create",
                amount=amount,
                currency=currency,
            )


def test_windows_are_the_tenants_calendar_day_and_month() -> None:
    # Late on 31 December in UTC is already 1 January in Auckland.
    now = datetime(2026, 12, 31, 11, 30, tzinfo=UTC)
    assert window_key("day", now, "Pacific/Auckland") == "2027-01-01"
    assert window_key("month", now, "Pacific/Auckland") == "2027-01"
    assert window_key("day", now, "UTC") == "2026-12-31"
    billing = [(c.name, w) for c, w in covering(TABLE, "billing", now)]
    assert billing == [("billing-day", "2027-01-01"), ("tenant-month", "2027-01")]
    assert [c.name for c, _ in covering(TABLE, "support", now)] == ["tenant-month"]


def test_writ_prices_sign_writes_a_file_governance_believes(tmp_path: Path) -> None:
    (tmp_path / "table.json").write_bytes(msgspec.json.encode(TABLE))
    (tmp_path / "key.pem").write_bytes(
        KEY.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    )
    out = tmp_path / "acme.json"
    with pytest.raises(SystemExit) as done:
        main(
            [
                "prices",
                "sign",
                str(tmp_path / "table.json"),
                "--key",
                str(tmp_path / "key.pem"),
                "--key-id",
                "ops-1",
                "--output",
                str(out),
            ]
        )
    assert done.value.code == 0
    assert read_prices(out, "acme", KEYS)[0] == TABLE
