"""A tenant onboarded on a running deployment (`writ tenant add`), on both doors, with nothing
restarted: its host runs over NATS and over HTTP with only what it was given; the deployment
restarted keeps the tenant, its ports and its host's credentials; nothing is dead-lettered;
`writ tenant remove` refuses those credentials on both doors and deletes its streams, on a
stopped deployment too. A tenant whose key is registered before its streams exist is refused at
the door, not accepted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import nats
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nats.js.errors import NotFoundError

from libs.embedded import EmbeddedNats
from schemas import subjects
from tests.e2e.conftest import service_violations
from tests.e2e.hostcreds import Credentials, nats_answer, read_credentials
from writ.stack import Stack, mint_token
from writ.stack._onboarding import offboard
from writ.tenants import TenantError, add_tenant, remove_tenant

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

PRINCIPAL = "carol@initech.example"
TEXT = "Note the delayed shipment call"


@pytest.fixture(scope="module")
def deployment(admin_dsn: str) -> Iterator[tuple[Path, str]]:
    """A home and a database of their own: the test starts, stops and restarts them."""
    if os.environ.get("WRIT_TEST_NATS_URL"):
        pytest.skip("tenants are onboarded live on the deployment's own NATS server")
    with tempfile.TemporaryDirectory(prefix="writ-onboard-") as home:
        yield Path(home), f"e2e_{uuid.uuid4().hex[:8]}"


def writ(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "writ.cli", args[0], "--home", str(home), *args[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def _api_code(api_url: str, token: str) -> str:
    async with httpx.AsyncClient(base_url=api_url, timeout=20) as api:
        response = await api.get(
            f"/runs/{uuid.uuid4()}", headers={"Authorization": f"Bearer {token}"}
        )
        return str(response.json()["code"])


async def _run_both_doors(given: Credentials) -> tuple[str, str]:
    over_nats = await given.run_over_nats(PRINCIPAL, text=TEXT, timeout=90)
    over_http = await anyio.to_thread.run_sync(lambda: given.run_over_http(PRINCIPAL, text=TEXT))
    return over_nats.status, str(over_http["status"])


async def _dead_letters(stack: Stack) -> int:
    nc = await nats.connect(stack.nats_url)
    try:
        return int((await nc.jetstream().stream_info("WRIT_DLQ")).state.messages)
    finally:
        await nc.close()


async def _log_says(stack: Stack, text: str, timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while text not in stack.log_tail("ingress", 200_000):
            await anyio.sleep(0.2)


@pytest.mark.timeout(600)  # two starts of a whole deployment, four runs
async def test_a_tenant_is_onboarded_live_kept_across_restarts_and_retired(
    deployment: tuple[Path, str], admin_dsn: str
) -> None:
    home, database = deployment
    tenant = f"t{uuid.uuid4().hex[:8]}"
    stack = Stack(home, admin_dsn=admin_dsn, database=database)
    try:
        await anyio.to_thread.run_sync(stack.start_all)
        api_url = stack.api_url

        # Registered before anything behind the doors exists for it: refused, not accepted.
        early = Ed25519PrivateKey.generate()
        public = early.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        private = early.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        issuer = add_tenant(home, tenant, public.decode())
        await _log_says(stack, f"tenant {tenant} is not served")
        early_token = mint_token(private, issuer=issuer, tenant=tenant, principal=PRINCIPAL)
        assert await _api_code(api_url, early_token) == "UNKNOWN_TENANT"
        async with httpx.AsyncClient(base_url=api_url, timeout=20) as api:
            refused = await api.post(
                "/runs",
                json={"agent": "crm-assistant", "input": TEXT},
                headers={
                    "Authorization": f"Bearer {early_token}",
                    "Idempotency-Key": f"early-{uuid.uuid4().hex[:8]}",
                },
            )
        assert (refused.status_code, refused.json()["code"]) == (401, "UNKNOWN_TENANT")
        remove_tenant(home, tenant)
        await anyio.sleep(3)  # ingress stops trying to bind it (its permissions do not reach it)
        probed = service_violations(stack)

        # Onboarded live: Writ makes its key pair, its host is given its credentials.
        added = await anyio.to_thread.run_sync(lambda: writ(home, "tenant", "add", tenant))
        assert added.returncode == 0, added.stderr
        folder = stack.host_credentials(tenant)
        assert str(folder) in added.stdout
        given = read_credentials(folder, tenant)
        with anyio.fail_after(30):
            while await _api_code(given.api_url, given.token(PRINCIPAL)) != "NOT_FOUND":
                await anyio.sleep(0.2)
        first = await _run_both_doors(given)
        assert first[0] == first[1] and first[0] in ("succeeded", "awaiting_human"), first

        # Restarted: the tenant, its ports and what its host was given stay.
        before = {p.name: p.read_bytes() for p in folder.iterdir()}
        await anyio.to_thread.run_sync(stack.stop)
        stack = Stack(home, admin_dsn=admin_dsn, database=database)
        await anyio.to_thread.run_sync(stack.start_all)
        assert stack.api_url == api_url
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
        again = await _run_both_doors(read_credentials(folder, tenant))
        assert again == first
        assert await _dead_letters(stack) == 0

        # Retired: its credentials are refused on both doors, its streams are gone.
        started = time.monotonic()
        removed = await anyio.to_thread.run_sync(lambda: writ(home, "tenant", "remove", tenant))
        print(f"writ tenant remove, live: {time.monotonic() - started:.2f} s")
        assert removed.returncode == 0, removed.stderr
        streams = f"{subjects.in_stream(tenant)}, {subjects.out_stream(tenant)}"
        assert f"its streams deleted ({streams})" in removed.stdout, removed.stdout
        assert await _api_code(given.api_url, given.token(PRINCIPAL)) == "UNKNOWN_TENANT"
        assert "Authorization Violation" in await nats_answer(given.nats_url)
        assert not folder.exists()
        nc = await nats.connect(stack.nats_url)
        try:
            for name in (subjects.in_stream(tenant), subjects.out_stream(tenant)):
                with pytest.raises(NotFoundError):
                    await nc.jetstream().stream_info(name)
        finally:
            await nc.close()
        # The other tenants are served as before, and no service was refused anything.
        acme = read_credentials(stack.host_credentials("acme"), "acme")
        assert (await acme.run_over_nats("alice@acme.example", text=TEXT)).status == "succeeded"
        assert await _dead_letters(stack) == 0
        assert service_violations(stack) == probed
    finally:
        await anyio.to_thread.run_sync(stack.stop)


@pytest.mark.timeout(300)
async def test_a_tenant_removed_from_a_stopped_deployment_leaves_no_streams(
    deployment: tuple[Path, str], admin_dsn: str
) -> None:
    home, database = deployment
    tenant = f"t{uuid.uuid4().hex[:8]}"
    stack = Stack(home, admin_dsn=admin_dsn, database=database)
    try:
        await anyio.to_thread.run_sync(stack.start_all)
        added = await anyio.to_thread.run_sync(lambda: writ(home, "tenant", "add", tenant))
        assert added.returncode == 0, added.stderr
        given = read_credentials(stack.host_credentials(tenant), tenant)
        with anyio.fail_after(30):
            while await _api_code(given.api_url, given.token(PRINCIPAL)) != "NOT_FOUND":
                await anyio.sleep(0.2)
        # An ingress that does not follow the registry (frozen) still serves the tenant: the
        # removal waits for it, then stops short, says so and removes nothing more.
        ingress = stack.procs["ingress"].pid
        os.kill(ingress, signal.SIGSTOP)
        try:
            with pytest.raises(TenantError, match="still serves") as short:
                await offboard(Stack.attach(home), tenant, patience_s=3)
        finally:
            os.kill(ingress, signal.SIGCONT)
        assert f"writ tenant remove {tenant}` again" in str(short.value)
        assert stack.host_credentials(tenant).exists()
        nc = await nats.connect(stack.nats_url)
        try:
            assert await nc.jetstream().stream_info(subjects.in_stream(tenant))
        finally:
            await nc.close()
    finally:
        await anyio.to_thread.run_sync(stack.stop)
    server = EmbeddedNats(home / "nats")
    assert not server.serving()

    # Run again on the stopped deployment, it finishes: the streams go too.
    removed = await anyio.to_thread.run_sync(lambda: writ(home, "tenant", "remove", tenant))
    assert removed.returncode == 0, removed.stderr
    streams = f"{subjects.in_stream(tenant)}, {subjects.out_stream(tenant)}"
    assert f"its streams deleted ({streams})" in removed.stdout, removed.stdout
    assert not stack.host_credentials(tenant).exists()
    assert not server.serving()  # started for the removal alone, and stopped again

    # What the next start would find: the tenant's streams are gone, the others' are there.
    attached = Stack.attach(home)
    with EmbeddedNats(
        home / "nats", port=int(attached._deployment()["nats_port"]), auth=attached._nats_auth()
    ):
        nc = await nats.connect(attached.nats_url)
        try:
            js = nc.jetstream()
            for name in (subjects.in_stream(tenant), subjects.out_stream(tenant)):
                with pytest.raises(NotFoundError):
                    await js.stream_info(name)
            assert (await js.stream_info(subjects.in_stream("acme"))).config.name
        finally:
            await nc.close()
    again = await anyio.to_thread.run_sync(lambda: writ(home, "tenant", "remove", tenant))
    assert again.returncode == 1 and "no tenant" in again.stderr, again
