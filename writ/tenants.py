"""Registering tenants: the tenants' issuer keys that ingress verifies tokens with, and the
credentials each tenant's host is given.

The file is `config/tenant-keys.json` under the deployment's home (what `WRIT_TENANT_KEYS_FILE`
names; on Kubernetes the same JSON in a Secret): `{"<tenant>": {"issuer": "<iss>",
"public_key": "<Ed25519 public key, PEM>", "principals": "exact" | "email"}}`: `email`
says the issuer's principals are e-mail addresses, one person whatever their case. Ingress
re-reads it when it changes. It is also the deployment's list of tenants: `writ run` starts
with the tenants it names (NATS users and accounts, streams), so a tenant added stays added.

A host's credentials are a folder, `hosts/<tenant>/` under the home (mode 0700, each file
0600), holding what a host needs and nothing of anyone else's (`HOST_FILES`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "HOST_FILES",
    "TenantError",
    "add_tenant",
    "host_dir",
    "keys_file",
    "registered",
    "remove_host_credentials",
    "remove_tenant",
    "validate",
    "write_host_credentials",
]

_TENANT: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
# What a host is given, one value per file: its NATS URL with its own user and password in it
# (the form nats-py's and nats.js's `connect` take), the inbox prefix its replies must arrive
# under, the HTTP API's base URL, the issuer its tokens must carry and, when Writ made the key
# pair, the Ed25519 private key it signs them with.
HOST_FILES: Final = ("nats.url", "nats.inbox", "api.url", "issuer", "signing.pem")


class TenantError(ValueError):
    """The tenant or its key cannot be registered."""


def keys_file(home: Path) -> Path:
    """The tenant keys file of a local deployment."""
    return home / "config" / "tenant-keys.json"


def host_dir(home: Path, tenant: str) -> Path:
    """The folder of a tenant's host credentials."""
    return home / "hosts" / tenant


def registered(home: Path) -> list[str]:
    """The tenants registered in a deployment, sorted."""
    return sorted(_read(keys_file(home)))


def _write_private(path: Path, value: str | bytes) -> None:
    """Replace `path` whole, readable by its owner alone from the moment it exists."""
    data = value.encode() if isinstance(value, str) else value
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def write_host_credentials(
    home: Path,
    tenant: str,
    *,
    nats_url: str,
    inbox: str,
    api_url: str,
    issuer: str,
    signing_pem: bytes | None = None,
) -> Path:
    """Write (or rewrite) a tenant's host credentials; the folder. A `signing_pem` replaces
    the one there; None leaves it as it is (or absent: the host holds its own key)."""
    for folder in (home / "hosts", host_dir(home, tenant)):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)
    folder = host_dir(home, tenant)
    values = {"nats.url": nats_url, "nats.inbox": inbox, "api.url": api_url, "issuer": issuer}
    for name, value in values.items():
        _write_private(folder / name, value + "\n")
    if signing_pem is not None:
        _write_private(folder / "signing.pem", signing_pem)
    return folder


def remove_host_credentials(home: Path, tenant: str) -> None:
    """Delete a tenant's host credentials folder (what is known of them is retired too)."""
    folder = host_dir(home, tenant)
    for name in (*HOST_FILES, *(f".{n}.tmp" for n in HOST_FILES)):
        (folder / name).unlink(missing_ok=True)
    if folder.exists():
        folder.rmdir()


def _read(path: Path) -> dict[str, dict[str, str]]:
    return json.loads(path.read_text()) if path.exists() else {}


def _write(path: Path, keys: dict[str, dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(keys, indent=2, sort_keys=True))
    os.replace(tmp, path)  # ingress never reads half a file


def validate(tenant: str, public_key_pem: str, *, principals: str = "exact") -> None:
    """Check a tenant's name, key and principals before anything is made for it.

    Raises:
        TenantError: the name is no tenant name, the key no Ed25519 public key, or the
            principals neither `exact` nor `email`.
    """
    if _TENANT.fullmatch(tenant) is None:
        raise TenantError(f"{tenant!r} is not a tenant name (a-z, 0-9, '-', 63 at most)")
    try:
        key = serialization.load_pem_public_key(public_key_pem.encode())
    except ValueError as exc:
        raise TenantError(f"not a PEM public key: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise TenantError("the key must be Ed25519 (tokens are EdDSA-signed)")
    if principals not in ("exact", "email"):
        raise TenantError(f"principals are 'exact' or 'email', not {principals!r}")


def add_tenant(
    home: Path, tenant: str, public_key_pem: str, *, issuer: str = "", principals: str = "exact"
) -> str:
    """Register (or re-key) a tenant; returns its issuer.

    Raises:
        TenantError: as `validate`.
    """
    validate(tenant, public_key_pem, principals=principals)
    issuer = issuer or f"https://{tenant}.example/host"
    path = keys_file(home)
    keys = _read(path)
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
