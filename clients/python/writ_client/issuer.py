"""Signing host tokens with the tenant's private key (EdDSA, the claims ingress checks)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

import jwt

__all__ = ["Issuer", "StaticToken", "Tokens"]


class Issuer:
    """A tenant's token issuer: `token(principal)` is what a host sends with each request."""

    def __init__(
        self,
        *,
        tenant: str,
        issuer: str,
        private_key_pem: bytes,
        audience: str = "writ",
        ttl_s: float = 300.0,
    ) -> None:
        self.tenant, self.issuer, self.audience = tenant, issuer, audience
        self._key, self._ttl = private_key_pem, ttl_s

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        *,
        tenant: str,
        issuer: str,
        audience: str = "writ",
        ttl_s: float = 300.0,
    ) -> Issuer:
        """An issuer whose private key (PKCS#8 PEM, Ed25519) is in `path`."""
        return cls(
            tenant=tenant,
            issuer=issuer,
            private_key_pem=Path(path).read_bytes(),
            audience=audience,
            ttl_s=ttl_s,
        )

    def token(
        self, principal: str, *, roles: Sequence[str] = (), ttl_s: float | None = None
    ) -> str:
        """A fresh token for `principal` (`roles`: `approver`, `auditor`)."""
        now = datetime.now(UTC)
        claims: dict[str, object] = {
            "iss": self.issuer,
            "aud": self.audience,
            "sub": principal,
            "tenant": self.tenant,
            "iat": now,
            "exp": now + timedelta(seconds=self._ttl if ttl_s is None else ttl_s),
            "jti": secrets.token_hex(8),
        }
        if roles:
            claims["roles"] = list(roles)
        return jwt.encode(claims, self._key, algorithm="EdDSA")


class Tokens(Protocol):
    """Where a client gets each request's token: an `Issuer`, or a `StaticToken`."""

    @property
    def tenant(self) -> str:
        """The tenant the tokens are for."""
        ...

    def token(self, principal: str, *, roles: Sequence[str] = ()) -> str:
        """A token for `principal` with `roles`."""
        ...


class StaticToken:
    """A token the host got elsewhere (its own issuer service), sent as it is: the principal
    and roles are the token's, whatever a client is given."""

    def __init__(self, token: str, *, tenant: str) -> None:
        self.tenant, self._token = tenant, token

    def token(self, principal: str, *, roles: Sequence[str] = ()) -> str:
        """The token."""
        return self._token

    def __repr__(self) -> str:
        return f"StaticToken(tenant={self.tenant!r})"
