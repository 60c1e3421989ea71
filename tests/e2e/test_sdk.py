"""The host SDK (`clients/python`, `writ_client`) against the real deployment, on both
transports: the same methods give the same runs and effects over HTTP and NATS; a retry under
the same key is the same run; refusals are `WritError`s with Writ's code."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Sequence

import asyncpg
import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from libs.natsauth import host_user
from tests.e2e.conftest import notes_for
from writ.stack import Stack
from writ_client import Client, Issuer, NatsClient, SyncClient, WritError
from writ_client.types import RunResult, StepRecorded

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]
INPUT = "Note the delayed shipment call"


def issuer(stack: Stack, tenant: str = "acme") -> Issuer:
    return Issuer.from_file(
        stack.secrets / f"host-{tenant}.pem", tenant=tenant, issuer=stack.issuer(tenant)
    )


async def host_nats(
    stack: Stack, tokens: Issuer, principal: str, *, roles: Sequence[str] = ()
) -> NatsClient:
    """A `NatsClient` connected as acme's host (its NATS user, password and inbox prefix)."""
    options = stack.nats_options(host_user("acme"))
    return await NatsClient.connect(
        stack.public_nats_url, tokens, principal, roles=roles, **options
    )


async def test_a_run_through_the_async_client_and_a_retry_under_its_key(
    stack: Stack, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    async with Client(stack.api_url, issuer(stack), "alice@acme.example") as client:
        request_id = f"sdk-{uuid.uuid4().hex[:12]}"
        accepted = await client.start_run("crm-assistant", INPUT, request_id=request_id)
        again = await client.start_run("crm-assistant", INPUT, request_id=request_id)
        assert again == accepted
        result = await client.wait(accepted.run_id)
        assert (result.status, result.run_id) == ("succeeded", accepted.run_id)
        assert (await client.get_run(accepted.run_id)).status == "succeeded"
        timeline = [e async for e in client.events(accepted.run_id)]
        assert [type(e).__name__ for e in timeline][-1] == "RunResult"
        steps = [e for e in timeline[:-1] if isinstance(e, StepRecorded)]
        assert [e.seq for e in steps] == list(range(len(timeline) - 1))
        resumed = [e async for e in client.events(accepted.run_id, after=0)]
        assert resumed[:-1] == timeline[1:-1]
        with pytest.raises(WritError) as refused:
            await client.start_run("crm-assistant", "another input", request_id=request_id)
        assert (refused.value.code, refused.value.status) == ("CONFLICT", 409)
        cancelled = await client.cancel(accepted.run_id)  # after its end: nothing changes
        assert cancelled.run_id == accepted.run_id
        assert (await client.wait(accepted.run_id)).status == "succeeded"
        with pytest.raises(WritError) as forbidden:
            await client.pending()
        assert forbidden.value.code == "FORBIDDEN"
    assert (
        await db.fetchval("SELECT count(*) FROM planner.runs WHERE request_id = $1", request_id)
        == 1
    )
    [action] = result.actions
    assert len(notes_for(crm, f"acme:{action.operation_id}")) == 1


def test_a_run_through_the_sync_client(stack: Stack, crm: httpx.Client) -> None:
    with SyncClient(stack.api_url, issuer(stack), "alice@acme.example") as client:
        result = client.run("crm-assistant", INPUT)
        assert result.status == "succeeded"
    [action] = result.actions
    assert len(notes_for(crm, f"acme:{action.operation_id}")) == 1


async def test_the_same_methods_over_nats(stack: Stack, crm: httpx.Client) -> None:
    client = await host_nats(stack, issuer(stack), "alice@acme.example")
    try:
        result = await client.run("crm-assistant", INPUT)
        assert result.status == "succeeded" and result.run_id is not None
        [action] = result.actions
        assert len(notes_for(crm, f"acme:{action.operation_id}")) == 1
        assert (await client.get_run(result.run_id)).status == "succeeded"
        timeline = [e async for e in client.events(result.run_id)]
        last = timeline[-1]
        assert isinstance(last, RunResult) and len(timeline) >= 4
        assert (last.run_id, last.version) == (result.run_id, result.version)
        with pytest.raises(WritError) as forbidden:
            await client.pending()
        assert (forbidden.value.code, forbidden.value.status) == ("FORBIDDEN", 403)
        command = await client.submit_command(
            "crm-assistant",
            f"op-{uuid.uuid4().hex[:12]}",
            "crm.note.create",
            {"customer_id": "ACME-42", "body": "Called back about order 7781."},
        )
        assert command.status == "succeeded"
    finally:
        await client.aclose()
    auditor = await host_nats(
        stack, issuer(stack), "audit@acme.example", roles=["auditor", "approver"]
    )
    try:
        assert (await auditor.replay(result.run_id)).run_id == result.run_id
        assert isinstance((await auditor.pending()).decisions, list)
        with pytest.raises(WritError) as missing:
            await auditor.get_run("no-such-run")
        assert missing.value.code == "NOT_FOUND"
    finally:
        await auditor.aclose()
    foreign = Issuer(
        tenant="acme",
        issuer=stack.issuer("acme"),
        private_key_pem=Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    client = await host_nats(stack, foreign, "mallory@acme.example")
    try:
        with pytest.raises(WritError) as refused:
            await client.run("crm-assistant", INPUT, timeout_s=20)
        assert refused.value.code == "BAD_SIGNATURE"
    finally:
        await client.aclose()


async def test_approvals_through_the_client(stack: Stack, payments: httpx.Client) -> None:
    from tests.e2e.test_proposals import _payment, _refunds

    payment_id = f"pay_{uuid.uuid4().hex[:12]}"
    payments.post("/_control/payments", json=_payment(payment_id)).raise_for_status()
    async with (
        Client(stack.api_url, issuer(stack), "alice@acme.example") as host,
        Client(stack.api_url, issuer(stack), "ops@acme.example", roles=["approver"]) as approver,
    ):
        waiting = await host.submit_command(
            "refund-assistant",
            f"refund-{uuid.uuid4().hex[:12]}",
            "payment.refund",
            {"payment_id": payment_id, "line_id": "L2"},
        )
        assert waiting.status == "awaiting_human" and waiting.proposal is not None
        proposal_id = waiting.proposal.proposal_id
        assert (await approver.proposal(proposal_id)).state == "pending"
        approved = await approver.approve(proposal_id, request_id="approve-" + proposal_id)
        again = await approver.approve(proposal_id, request_id="approve-" + proposal_id)
        assert approved.status == "claimed" and again == approved
    assert len(_refunds(payments, payment_id)) <= 1  # the one execution, if it ran already


def test_the_sdk_imports_none_of_the_services_dependencies() -> None:
    probe = (
        "import sys, writ_client; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'asyncpg', "
        "'litestar', 'uvicorn', 'services', 'libs', 'prometheus_client', "
        "'opentelemetry', 'nats'}); print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class _LosesFirstResponse(httpx.AsyncBaseTransport):
    """The real server answers; the first POST's answer is lost on the way back."""

    def __init__(self) -> None:
        self._inner, self.lost = httpx.AsyncHTTPTransport(), 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if request.method == "POST" and not self.lost:
            await response.aread()
            self.lost += 1
            raise httpx.ReadError("connection reset after the server answered", request=request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_a_retry_after_a_lost_response_is_the_same_run(
    stack: Stack, db: asyncpg.Connection
) -> None:
    transport = _LosesFirstResponse()
    http = httpx.AsyncClient(base_url=stack.api_url, transport=transport, timeout=30)
    async with Client(stack.api_url, issuer(stack), "alice@acme.example", http=http) as client:
        accepted = await client.start_run("crm-assistant", INPUT)  # retried under its key
        assert transport.lost == 1
        assert (await client.wait(accepted.run_id)).status == "succeeded"
    assert (
        await db.fetchval(
            "SELECT count(*) FROM planner.runs WHERE request_id = $1", accepted.request_id
        )
        == 1
    )
