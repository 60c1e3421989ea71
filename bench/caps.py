"""`BENCH_CAPS=1`: every tenant of the bench deployment gets a signed price table whose caps
cover all its runs (and never refuse: the limit is far above what a bench spends), so the run
path pays for spend caps as a capped tenant does: a priced hold and charge on every model and
capability call, and no lease beyond the asking step (docs/budgets.md). Unset: no table, the
run path as an uncapped tenant's."""

from __future__ import annotations

import os

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from services.governance.spend import ActionPrice, Cap, ModelPrice, PriceTable, sign_prices
from writ.stack import POLICY_KEY_ID, Stack

__all__ = ["caps_on", "install_caps"]


def caps_on() -> bool:
    """Whether this bench runs with spend caps (`BENCH_CAPS=1`)."""
    return os.environ.get("BENCH_CAPS", "") == "1"


def install_caps(stack: Stack) -> list[str]:
    """Sign and install a capped price table for each tenant; the tenants it covers."""
    key = serialization.load_pem_private_key(
        (stack.secrets / "policy-signing.pem").read_bytes(), password=None
    )
    assert isinstance(key, Ed25519PrivateKey)
    folder = stack.policies / "prices"
    folder.mkdir(parents=True, exist_ok=True)
    tenants = stack.tenants()
    for tenant in tenants:
        table = PriceTable(
            tenant=tenant,
            version="bench",
            currency="EUR",
            models={"scripted/scripted": ModelPrice(input_per_mtok="1", output_per_mtok="2")},
            actions={"crm.note.create": ActionPrice(per_call="0.01")},
            caps=[
                Cap(name="bench-day", window="day", limit="1000000000"),
                Cap(name="bench-month", window="month", limit="1000000000"),
            ],
        )
        (folder / f"{tenant}.json").write_bytes(sign_prices(table, key, POLICY_KEY_ID))
    return tenants
