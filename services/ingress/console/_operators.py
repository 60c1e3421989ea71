"""Operators: an identity Writ gives, never a host.

A host's token is signed by the host's own key and its roles are the host's to write, so a
host could claim any role it likes. The console's MCP pages let a person classify what a
host's MCP server says, which decides what a run may read: that person must be someone the
deployment made an operator. The stack generates an operators' signing key
(`secrets/operators-signing.pem`); ingress holds its public half only
(`WRIT_OPERATORS_KEY_FILE`), and `writ console --operator <principal>` signs a one-time
sign-in link with the private half. Ingress takes the role `operator` from a token of that
key alone (issuer `writ-operators`, audience `writ-console-operators`), and refuses a host's
token that claims it.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Final

import jwt
import msgspec
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from schemas.base import Principal, Tenant

__all__ = [
    "MAX_OPERATOR_TTL_S",
    "OPERATORS_AUDIENCE",
    "OPERATORS_ISSUER",
    "OPERATOR_ROLE",
    "OperatorKey",
    "OperatorRefused",
    "is_operator_token",
    "mint_operator_token",
]

OPERATOR_ROLE: Final = "operator"
OPERATORS_ISSUER: Final = "writ-operators"
OPERATORS_AUDIENCE: Final = "writ-console-operators"
# The longest session an operator's link opens (exp - iat).
MAX_OPERATOR_TTL_S: Final = 8 * 3600.0
_LEEWAY_S: Final = 30.0


class OperatorRefused(Exception):
    """The token is not an operator's that this deployment made; the text is safe to show."""


class _Claims(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    iss: str
    aud: str
    sub: Principal
    tenant: Tenant
    roles: list[str]
    iat: float
    exp: float
    jti: str


def is_operator_token(token: str) -> bool:
    """Whether a token says it is an operator's (unverified: it picks the key that checks it)."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError:
        return False
    return isinstance(claims, dict) and claims.get("iss") == OPERATORS_ISSUER


def mint_operator_token(
    private_pem: bytes,
    *,
    tenant: str,
    principal: str,
    ttl_s: float = 3600.0,
    now: float | None = None,
) -> str:
    """An operator's sign-in token for `tenant`, signed with the operators' key.

    Raises:
        OperatorRefused: the tenant, principal or lifetime is not one ingress would take.
    """
    issued = time.time() if now is None else now
    claims = {
        "iss": OPERATORS_ISSUER,
        "aud": OPERATORS_AUDIENCE,
        "sub": principal,
        "tenant": tenant,
        "roles": [OPERATOR_ROLE],
        "iat": int(issued),
        "exp": int(issued + ttl_s),
        "jti": uuid.uuid4().hex,
    }
    try:
        msgspec.convert(claims, _Claims)
    except msgspec.ValidationError as exc:
        raise OperatorRefused(f"not an operator's token ingress would take: {exc}") from None
    if not 0 < ttl_s <= MAX_OPERATOR_TTL_S:
        raise OperatorRefused(f"an operator's session lasts at most {MAX_OPERATOR_TTL_S:.0f} s")
    key = serialization.load_pem_private_key(private_pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise OperatorRefused("the operators' signing key must be an Ed25519 key")
    return jwt.encode(claims, key, algorithm="EdDSA")


class OperatorKey:
    """The operators' public key, as ingress holds it."""

    def __init__(self, public_pem: bytes) -> None:
        key = serialization.load_pem_public_key(public_pem)
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("the operators' key must be an Ed25519 public key")
        self._key = key

    def verify(self, token: str) -> tuple[str, str, float]:
        """(tenant, principal, expiry) of an operator's token this key signed.

        Raises:
            OperatorRefused: signature, issuer, audience, lifetime or claims do not check out.
        """
        try:
            raw: Any = jwt.decode(
                token,
                self._key,
                algorithms=["EdDSA"],
                audience=OPERATORS_AUDIENCE,
                issuer=OPERATORS_ISSUER,
                leeway=_LEEWAY_S,
                options={"require": ["iss", "aud", "sub", "iat", "exp", "jti"]},
            )
            claims = msgspec.convert(raw, _Claims)
        except (jwt.InvalidTokenError, msgspec.ValidationError) as exc:
            raise OperatorRefused(
                f"not an operator's token of this deployment: {exc}"[:300]
            ) from None
        if claims.roles != [OPERATOR_ROLE]:
            raise OperatorRefused("an operator's token carries the role `operator` alone")
        if claims.exp - claims.iat > MAX_OPERATOR_TTL_S + _LEEWAY_S:
            raise OperatorRefused("an operator's token lives longer than ingress allows")
        return claims.tenant, claims.sub, claims.exp
