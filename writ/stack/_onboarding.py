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

Removing one goes the other way: out of the registry; then, once ingress no longer serves it
(its HTTP door says `UNKNOWN_TENANT` for it, within a second or so: ingress drops a tenant's key
and stops consuming its stream in one step), its NATS user and account (its host's connections
are closed), its streams and what they held, its credentials. On a stopped deployment its NATS
server is started alone for the streams' removal, then stopped: nothing of the tenant is left
for a next start to find. If ingress still serves the tenant after `patience_s`, nothing more is
removed and the error says so; `writ tenant remove` again finishes the removal.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import nats
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from libs.embedded import EmbeddedNats
from libs.natsauth import PROVISION, ensure_passwords, host_user
from libs.provision import provision_tenant, retire_tenant
from writ.stack._stack import Stack
from writ.stack._tokens import mint_token
from writ.tenants import (
    TenantError,
    add_tenant,
    remove_host_credentials,
    remove_tenant,
    validate,
)

__all__ = ["Onboarded", "offboard", "onboard"]

# How long a removal waits, once the tenant is out of the registry, for ingress to stop
# serving it (it looks every second) before its NATS user and streams go.
PATIENCE_S = 30.0


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


async def _unserved(stack: Stack, tenant: str, *, patience_s: float) -> None:
    """Return once ingress serves `tenant` no more: its HTTP door answers a token of the tenant
    `UNKNOWN_TENANT` (the probe's is signed by a key of its own: while the tenant is served it
    is `BAD_SIGNATURE`), or no ingress listens at all (one that listens and does not answer
    may still serve it).

    Raises:
        TenantError: still served after `patience_s`.
    """
    probe = mint_token(_key_pair()[1], issuer="writ-tenant-remove", tenant=tenant, principal="-")
    url = f"http://127.0.0.1:{stack.http_port}/api/v1/runs/{uuid.uuid4()}"
    deadline = time.monotonic() + patience_s
    code = ""
    async with httpx.AsyncClient(timeout=5.0) as client:
        while time.monotonic() < deadline:
            try:
                answer = await client.get(url, headers={"Authorization": f"Bearer {probe}"})
            except httpx.ConnectError:
                return  # no ingress runs: none serves it
            except httpx.TransportError as exc:  # one runs, and says nothing yet
                code = type(exc).__name__
                continue
            try:
                code = str(answer.json().get("code", ""))
            except ValueError:
                code = f"HTTP {answer.status_code}"
            if code == "UNKNOWN_TENANT":
                return
            await anyio.sleep(0.1)
    raise TenantError(
        f"ingress still serves tenant {tenant!r} after {patience_s:g} s (its door answers "
        f"{code or 'nothing definite'}): it is out of the registry, but its NATS user, streams "
        f"and host credentials are kept; run `writ tenant remove {tenant}` again to finish"
    )


async def _retire_stopped(stack: Stack, tenant: str) -> list[str]:
    """Delete a tenant's streams on a stopped deployment: its embedded NATS server started
    alone, on its own port and store, with the remaining tenants' users, then stopped."""
    server = EmbeddedNats(
        stack.home / "nats",
        port=int(stack._deployment()["nats_port"]),
        auth=stack._nats_auth(),
    )
    await anyio.to_thread.run_sync(server.start)
    try:
        return await _provision(stack, tenant, retire=True)
    finally:
        await anyio.to_thread.run_sync(server.stop)


async def offboard(stack: Stack, tenant: str, *, patience_s: float = PATIENCE_S) -> list[str]:
    """Retire a tenant: refused on both doors at once, then its NATS user and account, its
    streams (what they held is deleted) and its host's credentials; the streams deleted. A
    tenant no longer registered whose credentials are still here (a removal that stopped
    short) is retired the same way.

    Raises:
        TenantError: no such tenant is registered (nor left over), or ingress still serves it.
    """
    try:
        remove_tenant(stack.home, tenant)
    except TenantError:
        if not stack.host_credentials(tenant).exists():
            raise
    live = _running(stack)
    if live:
        await _unserved(stack, tenant, patience_s=patience_s)
        stack.reload_nats()
        deleted = await _provision(stack, tenant, retire=True)
    elif stack.authenticated:
        deleted = await _retire_stopped(stack, tenant)
    else:
        deleted = []
    remove_host_credentials(stack.home, tenant)
    (stack.secrets / f"nats-{host_user(tenant)}.password").unlink(missing_ok=True)
    # A demo tenant's key, which the demo signed with, is retired with it.
    (stack.secrets / f"host-{tenant}.pem").unlink(missing_ok=True)
    return deleted
