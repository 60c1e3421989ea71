"""Registering a tenant without editing code (`writ tenant add <tenant> --public-key <pem>`):
the running ingress takes it within seconds, `writ token --key` mints a token it accepts, and
`writ tenant remove` makes its tokens refused again."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def writ(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "writ.cli", args[0], "--home", str(stack.home), *args[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def _code(stack: Stack, token: str) -> str:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=10) as api:
        response = await api.get(
            f"/runs/{uuid.uuid4()}", headers={"Authorization": f"Bearer {token}"}
        )
        return response.json()["code"]


@pytest.mark.timeout(300)  # the deployment's start, and two live NATS reloads
async def test_a_tenant_added_at_run_time_is_served_then_removed(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    key = Ed25519PrivateKey.generate()
    private, public = tmp_path / "host.pem", tmp_path / "host.pub.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    issuer = f"https://{tenant}.example.org/idp"

    def token() -> str:
        minted = writ(
            stack,
            "token",
            "--tenant",
            tenant,
            "--principal",
            "carol@x.example",
            "--key",
            str(private),
            "--issuer",
            issuer,
        )
        assert minted.returncode == 0, minted.stderr
        return minted.stdout.strip()

    # One token for every ask: minting runs `writ`, seconds on a loaded machine.
    minted = token()
    assert await _code(stack, minted) == "UNKNOWN_TENANT"
    added = writ(stack, "tenant", "add", tenant, "--public-key", str(public), "--issuer", issuer)
    assert added.returncode == 0, added.stderr
    with anyio.fail_after(60):
        while await _code(stack, minted) != "NOT_FOUND":  # known now: its run is not
            await anyio.sleep(0.2)
    refused = writ(stack, "tenant", "add", "Bad_Name", "--public-key", str(public))
    assert refused.returncode == 1 and "not a tenant name" in refused.stderr
    not_a_key = writ(stack, "tenant", "add", "other", "--public-key", str(private))
    assert not_a_key.returncode == 1

    assert writ(stack, "tenant", "remove", tenant).returncode == 0
    with anyio.fail_after(60):
        while await _code(stack, minted) != "UNKNOWN_TENANT":
            await anyio.sleep(0.2)
