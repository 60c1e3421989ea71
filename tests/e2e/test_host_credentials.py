"""What a host is given (`.writ/hosts/<tenant>/`) is enough to use both doors, and no more:
its NATS URL connects as its own user, with its inbox prefix, and cannot read Writ's
internals; its key and issuer mint tokens the HTTP API takes; no file a host is told to read
holds an administrator's password."""

from __future__ import annotations

import stat

import anyio
import pytest

from libs.natsauth import ADMIN, AUDIT_ADMIN, PROVISION
from tests.e2e.hostcreds import nats_answer, read_credentials
from writ.stack import Stack
from writ.tenants import HOST_FILES

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def _embedded(stack: Stack) -> None:
    if stack.embedded_nats is None:
        pytest.skip("a NATS server named by WRIT_TEST_NATS_URL has its own users")


async def test_each_tenants_host_is_given_its_own_credentials(stack: Stack) -> None:
    _embedded(stack)
    for tenant in ("acme", "globex"):
        folder = stack.host_credentials(tenant)
        assert folder == stack.home / "hosts" / tenant
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert sorted(p.name for p in folder.iterdir()) == sorted(HOST_FILES)
        for name in HOST_FILES:
            assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
        given = read_credentials(folder, tenant)
        password = stack.nats_password(f"host-{tenant}")
        assert given.nats_url == stack.public_nats_url.replace(
            "nats://", f"nats://host-{tenant}:{password}@"
        )
        assert given.inbox == f"_INBOX.host-{tenant}"
        assert given.api_url == stack.api_url
        assert given.issuer == stack.issuer(tenant)
    # Nothing under hosts/ holds a password but the hosts' own.
    others = [stack.nats_password(u) for u in (ADMIN, AUDIT_ADMIN, PROVISION, "ingress")]
    for path in (stack.home / "hosts").rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert not [p for p in others if p in text], path


async def test_a_host_runs_over_both_doors_with_what_it_was_given(stack: Stack) -> None:
    _embedded(stack)
    given = read_credentials(stack.host_credentials("acme"), "acme")
    over_nats = await given.run_over_nats(
        "alice@acme.example", text="Note the delayed shipment call"
    )
    assert over_nats.status == "succeeded", over_nats
    over_http = await anyio.to_thread.run_sync(
        lambda: given.run_over_http("alice@acme.example", text="Note the delayed shipment call")
    )
    assert over_http["status"] == "succeeded", over_http


async def test_a_hosts_connection_cannot_read_writs_internals(stack: Stack) -> None:
    _embedded(stack)
    given = read_credentials(stack.host_credentials("acme"), "acme")
    errors: list[str] = []

    async def record(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await given.connect(error_cb=record)
    try:
        await nc.subscribe("writ.int.>")
        await nc.flush()
        with anyio.fail_after(10):
            while not any("permissions violation" in e for e in errors):
                await anyio.sleep(0.05)
        # Another inbox than its own is refused too: replies meant for others stay theirs.
        await nc.subscribe("_INBOX.ingress.>")
        await nc.flush()
        with anyio.fail_after(10):
            while not any("_inbox.ingress" in e.lower() for e in errors):
                await anyio.sleep(0.05)
    finally:
        await nc.close()
    # The host's URL lets it in; the administrator's password on the host's user does not.
    assert await nats_answer(given.nats_url) == "PONG"
    wrong = given.nats_url.replace(stack.nats_password("host-acme"), stack.nats_password(ADMIN), 1)
    assert "Authorization Violation" in await nats_answer(wrong)
