"""Tenants onboarded and retired on a running deployment (`writ tenant add|remove`), on both
doors, without restarting anything.

Adding a tenant, in this order, so that no door takes a request for it before everything
behind the door exists:

1. NATS: its host's user and account, and ingress's reach to its streams, applied to the
   running embedded server by a configuration reload (`Stack.reload_nats`).
2. Its streams (`WRIT_IN_<tenant>`, `WRIT_OUT_<tenant>`) and ingress's consumer on them, made
   as provisioning's identity (`libs.provision.provision_tenant`).
3. Its issuer's key in the registry (`config/tenant-keys.json`). Ingress serves a registered
   tenant on both doors once it has bound to that consumer and found its result stream; until
   then both doors refuse it (`UNKNOWN_TENANT`), so nothing it accepts can be lost for want of
   a stream.
4. Its host's credentials (`hosts/<tenant>/`).

Removing one goes the other way: out of the registry (ingress stops serving it within a
second), then, after `grace_s`, its NATS user and account (its host's connections are closed),
its streams and what they held, its credentials.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import anyio
import nats
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from libs.embedded import EmbeddedNats
from libs.natsauth import PROVISION, ensure_passwords, host_user
from libs.provision import provision_tenant, retire_tenant
from writ.stack._stack import Stack
from writ.tenants import add_tenant, remove_host_credentials, remove_tenant, validate

__all__ = ["Onboarded", "offboard", "onboard"]

# How long a removal waits, once the tenant is out of the registry, for ingress to stop
# serving it (it looks every second) before its NATS user and streams go.
GRACE_S = 3.0


@dataclass(frozen=True)
class Onboarded:
    """What adding a tenant did."""

    issuer: str
    credentials: Path
    live: bool  # the deployment was running: its NATS server and streams were changed now


def _key_pair() -> tuple[str, bytes]:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return public.decode(), private


async def _provision(stack: Stack, tenant: str, *, retire: bool = False) -> list[str]:
    nc = await nats.connect(
        stack.public_nats_url,
        connect_timeout=5,
        max_reconnect_attempts=2,
        **stack.nats_options(PROVISION),
    )
    try:
        if retire:
            return await retire_tenant(nc.jetstream(), tenant)
        await provision_tenant(nc.jetstream(), tenant)
        return []
    finally:
        await nc.close()


def _running(stack: Stack) -> bool:
    """Whether the deployment's NATS server runs (the embedded one: its process; one named
    by `WRIT_NATS_URL`: taken to run)."""
    if not stack.authenticated:
        return True
    server = stack.embedded_nats or EmbeddedNats(stack.home / "nats")
    return server.serving()


async def onboard(
    stack: Stack,
    tenant: str,
    *,
    public_key_pem: str | None = None,
    issuer: str = "",
    principals: str = "exact",
) -> Onboarded:
    """Add (or re-key) a tenant; with no `public_key_pem`, Writ makes its key pair and puts
    the private half in its host's credentials only. On a deployment that is not running, the
    registry and the credentials are written and its next start does the rest.

    Raises:
        TenantError: as `writ.tenants.validate`.
    """
    signing_pem: bytes | None = None
    if public_key_pem is None:
        public_key_pem, signing_pem = _key_pair()
    validate(tenant, public_key_pem, principals=principals)
    live = _running(stack)
    tenants = sorted({*stack.tenants(), tenant})
    if live:
        stack.reload_nats(tenants)
        await _provision(stack, tenant)
    else:
        ensure_passwords(stack.secrets, tenants)
    issuer = add_tenant(stack.home, tenant, public_key_pem, issuer=issuer, principals=principals)
    if signing_pem is None:  # its host keeps its own key: none of an earlier one stays here
        (stack.host_credentials(tenant) / "signing.pem").unlink(missing_ok=True)
    folder = stack.write_host_credentials(tenant, signing_pem=signing_pem)
    return Onboarded(issuer=issuer, credentials=folder, live=live)


async def offboard(stack: Stack, tenant: str, *, grace_s: float = GRACE_S) -> list[str]:
    """Retire a tenant: refused on both doors at once, then its NATS user and account, its
    streams (what they held is deleted) and its host's credentials; the streams deleted.

    Raises:
        TenantError: no such tenant is registered.
    """
    remove_tenant(stack.home, tenant)
    live = _running(stack)
    deleted: list[str] = []
    if live:
        await anyio.sleep(grace_s)
        stack.reload_nats()
        deleted = await _provision(stack, tenant, retire=True)
    remove_host_credentials(stack.home, tenant)
    (stack.secrets / f"nats-{host_user(tenant)}.password").unlink(missing_ok=True)
    return deleted
