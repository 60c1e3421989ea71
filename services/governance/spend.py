"""Spend caps: a tenant's signed price table, what a step may cost at worst, what it did cost,
and which caps cover it. Pure, no I/O but reading the signed file.

A price file is JSON `{"prices": {...}, "signature": {"key_id", "value"}}`, signed like an
organisation policy (Ed25519 over the RFC 8785 canonical form of `prices`, with the same
keys). Money is counted in micros (millionths of the table's currency) so that a token priced
at 0.15 per million tokens costs exactly 0.15 micros; every cost is rounded up.

Caps are per tenant or per agent, per day or per month; a window is the calendar day or month
in the tenant's time zone (`window_key`), so the day resets at the tenant's midnight.
"""

from __future__ import annotations

import base64
import hashlib
import math
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "MAX_PRICES_BYTES",
    "ActionPrice",
    "Cap",
    "Charge",
    "ModelPrice",
    "PriceTable",
    "PricesRefused",
    "Unpriced",
    "covering",
    "covering_all",
    "load_prices",
    "money",
    "sign_prices",
    "window_key",
]

MAX_PRICES_BYTES = 256 * 1024
MICROS = 1_000_000
_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[^\s]+$")]
# A decimal amount of the table's currency, as text ("12.50"): never a float.
_Money = Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,12}(\.[0-9]{1,6})?$")]


class ModelPrice(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A model's price per million tokens, input and output."""

    input_per_mtok: _Money
    output_per_mtok: _Money


class ActionPrice(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An action contract's price: per call, plus, where `amount_from_arguments`, the amount
    the call's frozen arguments carry (a charge's amount, in the table's currency)."""

    per_call: _Money = "0"
    amount_from_arguments: bool = False


class Cap(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """At most `limit` per window, for the tenant's runs or for one agent's."""

    name: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
    window: Literal["day", "month"]
    limit: _Money
    agent: _Name | None = None  # None: every run of the tenant


class PriceTable(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an operator signs for one tenant: prices and caps in one currency."""

    tenant: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]{0,62}(?!\n)$")]
    version: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    currency: Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{3}$")]
    time_zone: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "UTC"
    # "provider/model" -> its price.
    models: Annotated[dict[_Name, ModelPrice], msgspec.Meta(max_length=1000)] = {}
    # Action contract (a tool name) -> its price.
    actions: Annotated[dict[_Name, ActionPrice], msgspec.Meta(max_length=1000)] = {}
    caps: Annotated[list[Cap], msgspec.Meta(max_length=100)] = []

    def __post_init__(self) -> None:
        names = [c.name for c in self.caps]
        if len(set(names)) != len(names):
            raise ValueError("two caps have the same name")
        try:
            ZoneInfo(self.time_zone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {self.time_zone!r}") from exc


class PricesRefused(ValueError):
    """The price file cannot be believed (unreadable, unsigned, not for this tenant)."""


@dataclass(frozen=True, slots=True)
class Charge:
    """How one step is priced, fixed when it is reserved and used again when it is settled.

    Token rates are micros per million tokens' worth, i.e. micros per token times a million
    (`ceil(tokens * rate / 1e6)`); `fixed` is charged once whatever the step used."""

    input_rate: int = 0
    output_rate: int = 0
    per_call: int = 0
    fixed: int = 0

    def worst(self, *, tokens: int, calls: int) -> int:
        """The most a step reserving `tokens` and `calls` can cost (every token at the dearer
        rate)."""
        return _tokens_cost(tokens, max(self.input_rate, self.output_rate)) + self.cost(calls=calls)

    def cost(
        self,
        *,
        calls: int,
        tokens: int = 0,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> int:
        """What a step that used these cost. Without the input/output split, every token is
        priced at the dearer rate (never less than it may have cost)."""
        if input_tokens is not None and output_tokens is not None:
            spent = _tokens_cost(input_tokens, self.input_rate) + _tokens_cost(
                output_tokens, self.output_rate
            )
        else:
            spent = _tokens_cost(tokens, max(self.input_rate, self.output_rate))
        return spent + calls * self.per_call + (self.fixed if calls else 0)


def _tokens_cost(tokens: int, rate: int) -> int:
    return -(-tokens * rate // MICROS) if tokens and rate else 0


def money(text: str) -> int:
    """A decimal amount of the currency, in micros (at most six decimals: exact)."""
    try:
        micros = Decimal(text) * MICROS
    except InvalidOperation as exc:
        raise ValueError(f"not an amount: {text!r}") from exc
    return math.ceil(micros)


class Unpriced(ValueError):
    """A step whose price the table reads from its arguments carries no amount in the
    table's currency: it cannot be priced, so it is refused (never charged nothing)."""


def charge_for(
    table: PriceTable,
    *,
    model: str | None,
    action: str | None,
    amount: str | None,
    currency: str | None = None,
) -> Charge | None:
    """The step's price, or None when the table prices nothing it does (then no cap is
    charged). A model or action the table does not list costs nothing.

    Raises:
        Unpriced: the table reads the action's price from its amount, and the step has
            none, or has one in another currency than the table's.
    """
    rates = Charge()
    if model is not None and (m := table.models.get(model)) is not None:
        rates = Charge(input_rate=money(m.input_per_mtok), output_rate=money(m.output_per_mtok))
    if action is not None and (a := table.actions.get(action)) is not None:
        fixed = 0
        if a.amount_from_arguments:
            if amount is None or currency != table.currency:
                raise Unpriced(
                    f"{action} is priced by its amount in {table.currency}; this call "
                    + ("carries none" if amount is None else f"is in {currency}")
                )
            fixed = money(amount)
        rates = Charge(
            input_rate=rates.input_rate,
            output_rate=rates.output_rate,
            per_call=money(a.per_call),
            fixed=fixed,
        )
    return rates if rates != Charge() else None


def window_key(window: Literal["day", "month"], now: datetime, time_zone: str) -> str:
    """The window `now` falls in, in the tenant's time zone: `2026-12-07` or `2026-12`."""
    local = now.astimezone(ZoneInfo(time_zone))
    return local.strftime("%Y-%m-%d" if window == "day" else "%Y-%m")


def covering(table: PriceTable, agent: str, now: datetime) -> list[tuple[Cap, str]]:
    """Every cap that covers a step of `agent`'s run, with its current window, by name (the
    order their rows are locked in)."""
    return sorted(
        (
            (cap, window_key(cap.window, now, table.time_zone))
            for cap in table.caps
            if cap.agent is None or cap.agent == agent
        ),
        key=lambda c: c[0].name,
    )


def covering_all(table: PriceTable, now: datetime) -> list[tuple[Cap, str]]:
    """Every cap of the table, with its current window."""
    return [(cap, window_key(cap.window, now, table.time_zone)) for cap in table.caps]


class _Signature(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    key_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    value: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class _SignedFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    prices: msgspec.Raw
    signature: _Signature


def load_prices(
    raw: bytes, tenant: str, keys: dict[str, Ed25519PublicKey]
) -> tuple[PriceTable, str]:
    """The tenant's price table and its file's sha256, once its signature verifies.

    Raises:
        PricesRefused: too large, not valid, an unknown key, a bad signature, or signed for
            another tenant.
    """
    digest = hashlib.sha256(raw).hexdigest()
    if len(raw) > MAX_PRICES_BYTES:
        raise PricesRefused("price file too large")
    try:
        signed = msgspec.json.decode(raw, type=_SignedFile)
        body = msgspec.json.decode(signed.prices)
        key = keys.get(signed.signature.key_id)
        if key is None:
            raise PricesRefused(f"unknown signing key {signed.signature.key_id!r}")
        key.verify(base64.b64decode(signed.signature.value, validate=True), rfc8785.dumps(body))
        table = msgspec.convert(body, PriceTable)
    except InvalidSignature as exc:
        raise PricesRefused("the signature does not verify") from exc
    except PricesRefused:
        raise
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        raise PricesRefused(f"not a valid price file: {exc}"[:500]) from exc
    if table.tenant != tenant:
        raise PricesRefused(f"the file is signed for tenant {table.tenant!r}")
    return table, digest


def read_prices(
    path: Path, tenant: str, keys: dict[str, Ed25519PublicKey]
) -> tuple[PriceTable, str]:
    """`load_prices` of a file."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PricesRefused(f"cannot read {path.name}: {exc.strerror}") from exc
    return load_prices(raw, tenant, keys)


def sign_prices(table: PriceTable, key: Ed25519PrivateKey, key_id: str) -> bytes:
    """A signed price file for `table`."""
    body = msgspec.to_builtins(table)
    signature = base64.b64encode(key.sign(rfc8785.dumps(body))).decode()
    return msgspec.json.format(
        msgspec.json.encode({"prices": body, "signature": {"key_id": key_id, "value": signature}}),
        indent=2,
    )
