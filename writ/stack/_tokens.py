"""Tokens as a host mints them, and the small helpers the deployment's modules share."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

import jwt

from libs.db import load_migrations

__all__ = ["AUDIENCE", "POLICY_KEY_ID", "migrations", "mint_token", "write_secret"]

AUDIENCE: Final = "writ"
POLICY_KEY_ID: Final = "org-1"
_WITH_DATABASE: Final = ("retrieval", "planner", "governance", "admission", "dispatcher")


def mint_token(
    private_key_pem: bytes,
    *,
    issuer: str,
    tenant: str,
    principal: str,
    ttl_s: float = 300.0,
    audience: str = AUDIENCE,
    now: datetime | None = None,
    **extra: object,
) -> str:
    """An EdDSA-signed JWT as a host would send it."""
    issued = now or datetime.now(UTC)
    claims = {
        "iss": issuer,
        "aud": audience,
        "sub": principal,
        "tenant": tenant,
        "iat": issued,
        "exp": issued + timedelta(seconds=ttl_s),
        "jti": secrets.token_hex(8),
        **extra,
    }
    return jwt.encode(claims, private_key_pem, algorithm="EdDSA")


def migrations() -> dict[str, list]:
    root = Path(__file__).resolve().parents[2] / "services"
    return {name: load_migrations(name, root / name / "migrations") for name in _WITH_DATABASE}


def write_secret(path: Path, value: str) -> None:
    """Write a secret file, readable by its owner alone."""
    path.write_text(value)
    path.chmod(0o600)
