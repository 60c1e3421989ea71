"""Signing host tokens with the tenant's private key (EdDSA, the claims ingress checks)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jwt

__all__ = ["Issuer"]


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
