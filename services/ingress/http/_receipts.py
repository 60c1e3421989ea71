"""`GET /api/v1/receipts/keys`: the keys that verify Writ's approval receipts, as a JWKS.

Systems of record fetch it to check the `Writ-Authorization` receipt on each write
(docs/receipts.md). The file (`WRIT_RECEIPT_KEYS_FILE`) is read on each request, so a rotation
is served as soon as the deployment writes it: during one, both keys are listed.
"""

from __future__ import annotations

from typing import Annotated, Literal

import anyio
import msgspec
from litestar import get
from litestar.handlers import HTTPRouteHandler

from services.ingress.http._problems import ApiError, problems

__all__ = ["Jwk", "Jwks", "receipt_key_handlers"]

_MAX_KEYS = 16
_KEYS_FILE_BYTES = 64 * 1024


class Jwk(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One Ed25519 verification key (RFC 8037)."""

    kty: Literal["OKP"]
    crv: Literal["Ed25519"]
    x: Annotated[str, msgspec.Meta(min_length=43, max_length=43)]
    kid: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    use: Literal["sig"] = "sig"
    alg: Literal["EdDSA"] = "EdDSA"


class Jwks(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The receipt verification keys; a receipt names its key by `kid`."""

    keys: Annotated[list[Jwk], msgspec.Meta(max_length=_MAX_KEYS)]


def receipt_key_handlers(keys_file: str) -> list[HTTPRouteHandler]:
    """The key set route, reading `keys_file` (empty: no receipts are signed, 404)."""

    @get(
        "/receipts/keys",
        summary="The approval receipts' verification keys (JWKS)",
        tags=["receipts"],
        security=[],
        responses=problems(s404="NOT_FOUND: this deployment signs no receipts"),
    )
    async def receipt_keys() -> Jwks:
        """Every key whose receipts may still be in flight (two during a rotation). Public: a
        system of record needs no Writ credential to verify what it is sent."""
        if not keys_file:
            raise ApiError("NOT_FOUND", "this deployment signs no receipts")
        try:
            data = await anyio.Path(keys_file).read_bytes()
        except FileNotFoundError:
            raise ApiError("NOT_FOUND", "this deployment publishes no receipt keys") from None
        if len(data) > _KEYS_FILE_BYTES:
            raise ApiError("INTERNAL", "the receipt key set is too large")
        return msgspec.json.decode(data, type=Jwks)

    return [receipt_keys]
