"""Check Writ's approval receipts: proof, for a system of record, that a write was authorised.

Every command Writ's dispatcher sends carries a receipt in the `Writ-Authorization` header: a
compact JWS (EdDSA, Ed25519) signed by Writ's admission service, which the dispatcher cannot
sign for. It names the tenant, the operation id (the idempotency key is
`<tenant>:<operation_id>`), the SHA-256 of the exact request body, the action and its contract
version, who authorised it (a person, as their verified credential named them, or the policy
line that allowed it without one), when, and until when it may be sent.

    from writ_client.receipts import KeySet, ReceiptRefused, verify

    keys = KeySet.from_jwks(httpx.get(f"{api_url}/receipts/keys").json())  # api_url: .../api/v1
    try:
        receipt = verify(request.headers.get("Writ-Authorization"), body, keys,
                         tenant="acme", operation_id=operation_id)
    except ReceiptRefused as exc:
        return 403, {"error": exc.reason}

`verify` raises `ReceiptRefused` with a typed `reason` (see `RefusalReason`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from collections.abc import Mapping
from typing import Any, Literal

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "HEADER",
    "Authority",
    "KeySet",
    "Receipt",
    "ReceiptRefused",
    "RefusalReason",
    "body_digest",
    "verify",
]

HEADER = "Writ-Authorization"
TYPE = "writ-receipt+jws"
MAX_RECEIPT = 8192  # bytes: a receipt is a few hundred; anything larger is refused unread

RefusalReason = Literal[
    "missing",  # no receipt at all
    "malformed",  # not a compact JWS of a receipt
    "unknown_key",  # signed with a key id the key set does not hold
    "forged",  # the signature does not verify
    "expired",  # past its `exp`
    "tenant_mismatch",  # issued for another tenant
    "body_mismatch",  # the body does not hash to the receipt's digest
    "operation_mismatch",  # issued for another operation id: a replay under another key
]


class ReceiptRefused(Exception):
    """The receipt does not authorise this request; `reason` says why."""

    def __init__(self, reason: RefusalReason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


class Authority(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Who authorised the write: a `person` (their principal, from their verified credential)
    or a `policy` (the `decide` line and policy version that allowed it without one)."""

    kind: Literal["person", "policy"]
    principal: str | None = None
    decision_id: str | None = None
    line: int | None = None
    policy_version: str | None = None


class Receipt(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A receipt's claims, once verified."""

    iss: Literal["writ"]
    tenant: str
    operation_id: str
    request_hash: str  # Writ's hash of the frozen command (action, version, arguments)
    body_sha256: str  # base64url (no padding) SHA-256 of the exact request body sent
    method: str
    path: str
    action: str
    version: int
    on_behalf_of: str  # the principal the run acts for
    authorized_by: Authority
    iat: int
    exp: int


class _Header(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    alg: Literal["EdDSA"]
    typ: Literal["writ-receipt+jws"]
    kid: str


class KeySet:
    """Writ's verification keys by key id (a JWKS of Ed25519 `OKP` keys).

    During a rotation the set holds two keys; receipts name theirs by `kid`.
    """

    def __init__(self, keys: Mapping[str, Ed25519PublicKey]) -> None:
        self.keys = dict(keys)

    @classmethod
    def from_jwks(cls, jwks: Mapping[str, Any] | str | bytes) -> KeySet:
        """Parse a JWKS document; keys other than Ed25519 signing keys are ignored."""
        doc = json.loads(jwks) if isinstance(jwks, str | bytes) else jwks
        keys: dict[str, Ed25519PublicKey] = {}
        for jwk in doc.get("keys", []):
            if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519" or "kid" not in jwk:
                continue
            keys[str(jwk["kid"])] = Ed25519PublicKey.from_public_bytes(_unb64(str(jwk["x"])))
        return cls(keys)


def body_digest(body: bytes) -> str:
    """The `body_sha256` a receipt carries for `body`."""
    return _b64(hashlib.sha256(body).digest())


def verify(
    receipt: str | None,
    body: bytes,
    key_set: KeySet,
    *,
    tenant: str | None = None,
    operation_id: str | None = None,
    now: float | None = None,
) -> Receipt:
    """The receipt's claims if it authorises sending `body` (the exact bytes received).

    Checks the signature against `key_set` (by the receipt's `kid`), the expiry, the tenant and
    the operation id (when given: take both from the request's idempotency key), and that `body`
    hashes to the receipt's `body_sha256`.

    Raises:
        ReceiptRefused: it does not; `reason` says why.
    """
    if not receipt:
        raise ReceiptRefused("missing")
    if len(receipt) > MAX_RECEIPT:
        raise ReceiptRefused("malformed", "too large")
    parts = receipt.split(".")
    if len(parts) != 3:
        raise ReceiptRefused("malformed", "not a compact JWS")
    try:
        header = msgspec.json.decode(_unb64(parts[0]), type=_Header)
        signature = _unb64(parts[2])
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
        raise ReceiptRefused("malformed", str(exc)[:200]) from None
    key = key_set.keys.get(header.kid)
    if key is None:
        raise ReceiptRefused("unknown_key", header.kid[:64])
    try:
        key.verify(signature, f"{parts[0]}.{parts[1]}".encode("ascii"))
    except (InvalidSignature, UnicodeEncodeError):
        raise ReceiptRefused("forged") from None
    try:
        claims = msgspec.json.decode(_unb64(parts[1]), type=Receipt)
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
        raise ReceiptRefused("malformed", str(exc)[:200]) from None
    if (time.time() if now is None else now) >= claims.exp:
        raise ReceiptRefused("expired")
    if tenant is not None and claims.tenant != tenant:
        raise ReceiptRefused("tenant_mismatch")
    if operation_id is not None and claims.operation_id != operation_id:
        raise ReceiptRefused("operation_mismatch")
    if body_digest(body) != claims.body_sha256:
        raise ReceiptRefused("body_mismatch")
    return claims


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64url: {exc}") from None
