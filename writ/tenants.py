"""Registering tenants: the tenants' issuer keys that ingress verifies tokens with.

The file is `config/tenant-keys.json` under the deployment's home (what `WRIT_TENANT_KEYS_FILE`
names; on Kubernetes the same JSON in a Secret): `{"<tenant>": {"issuer": "<iss>",
"public_key": "<Ed25519 public key, PEM>", "principals": "exact" | "email"}}`: `email`
says the issuer's principals are e-mail addresses, one person whatever their case. Ingress
re-reads it when it changes.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = ["TenantError", "add_tenant", "keys_file", "remove_tenant"]

_TENANT: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


class TenantError(ValueError):
    """The tenant or its key cannot be registered."""


def keys_file(home: Path) -> Path:
    """The tenant keys file of a local deployment."""
    return home / "config" / "tenant-keys.json"


def _read(path: Path) -> dict[str, dict[str, str]]:
    return json.loads(path.read_text()) if path.exists() else {}


def _write(path: Path, keys: dict[str, dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(keys, indent=2, sort_keys=True))
    os.replace(tmp, path)  # ingress never reads half a file


def add_tenant(
    home: Path, tenant: str, public_key_pem: str, *, issuer: str = "", principals: str = "exact"
) -> str:
    """Register (or re-key) a tenant; returns its issuer.

    Raises:
        TenantError: the name is no tenant name, or the key is no Ed25519 public key.
    """
    if _TENANT.fullmatch(tenant) is None:
        raise TenantError(f"{tenant!r} is not a tenant name (a-z, 0-9, '-', 63 at most)")
    try:
        key = serialization.load_pem_public_key(public_key_pem.encode())
    except ValueError as exc:
        raise TenantError(f"not a PEM public key: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise TenantError("the key must be Ed25519 (tokens are EdDSA-signed)")
    issuer = issuer or f"https://{tenant}.example/host"
    path = keys_file(home)
    keys = _read(path)
    if principals not in ("exact", "email"):
        raise TenantError(f"principals are 'exact' or 'email', not {principals!r}")
    keys[tenant] = {
        "issuer": issuer,
        "public_key": public_key_pem.strip() + "\n",
        "principals": principals,
    }
    _write(path, keys)
    return issuer


def remove_tenant(home: Path, tenant: str) -> None:
    """Forget a tenant."""
    path = keys_file(home)
    keys = _read(path)
    if keys.pop(tenant, None) is None:
        raise TenantError(f"no tenant {tenant!r} is registered")
    _write(path, keys)
