"""The SDK as a host uses it: on the credentials a deployment gives a tenant's host
(`.writ/hosts/<tenant>/`), never as NATS's administrator. Over NATS and over HTTP: a run and
its handle, a command replayed and one in conflict, a decision a person answers while the
host's handle waits for what followed; and the host's connection cannot read Writ's
internal subjects, nor learn of a wrong login only from a timeout."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.conftest import notes_for
from tests.e2e.test_governance import charges_for
from writ.stack import Stack
from writ_client import (
    AuthenticationError,
    Client,
    Conflict,
    HostCredentials,
    NatsClient,
    PermissionDenied,
    StaticToken,
    SyncClient,
)
from writ_client.types import RunResult, StepRecorded

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]
INPUT = "Note the delayed shipment call"
NOTE = {"customer_id": "ACME-42", "body": "Called back about order 7781."}


def host_folder(stack: Stack, tenant: str) -> Path:
    """The tenant's host credentials folder, as the deployment wrote it."""
    if stack.embedded_nats is None:
        pytest.skip("a NATS server named by WRIT_TEST_NATS_URL has its own users")
    return stack.host_credentials(tenant)


@pytest.fixture
def acme(stack: Stack) -> HostCredentials:
    return HostCredentials.from_dir(host_folder(stack, "acme"))


async def test_over_nats_a_host_runs_replays_conflicts_and_waits_past_a_decision(
    acme: HostCredentials, crm: httpx.Client, payments: httpx.Client
) -> None:
    assert acme.nats is not None and acme.nats.user == "host-acme"
    async with (
        await NatsClient.from_credentials(acme, "alice@acme.example") as host,
        await NatsClient.from_credentials(acme, "ops@acme.example", roles=["approver"]) as ops,
    ):
        run = await host.start("crm-assistant", INPUT)
        assert run.last is not None and run.last.status == "succeeded"
        assert (await run.result()) == run.last
        [action] = run.last.actions
        assert len(notes_for(crm, f"acme:{action.operation_id}")) == 1

        key = f"op-{uuid.uuid4().hex[:12]}"
        first = await host.submit_command("crm-assistant", key, "crm.note.create", NOTE)
        again = await host.submit_command("crm-assistant", key, "crm.note.create", NOTE)
        assert (first.status, again.status) == ("succeeded", "succeeded")
        assert again.operation_id == first.operation_id
        other = {**NOTE, "body": "Another note"}
        conflict = await host.submit_command("crm-assistant", key, "crm.note.create", other)
        assert conflict.status == "conflict" and conflict.error is not None
        assert len(notes_for(crm, f"acme:{first.operation_id}")) == 1

        asked = await host.start("billing-assistant", INPUT)
        waiting = asked.last
        assert waiting is not None and waiting.status == "awaiting_human", waiting
        assert waiting.pending_id is not None and waiting.proposal is not None
        assert waiting.pending_id in [d.pending_id for d in (await ops.pending()).decisions]
        decided = await ops.decide(
            waiting.pending_id, "once", proposal_id=waiting.proposal.proposal_id
        )
        assert decided.accepted, decided
        final = await asked.wait()  # news only: never the awaiting_human result again
        assert final.status == "succeeded" and final.version > waiting.version, final
        [charge] = final.actions
        assert len(charges_for(payments, charge.operation_id)) == 1


async def test_the_hosts_connection_cannot_read_writs_internal_subjects(
    acme: HostCredentials,
) -> None:
    async with await NatsClient.from_credentials(acme, "alice@acme.example") as host:
        internal = await host._nc.subscribe("writ.int.>")
        with anyio.fail_after(10):
            while not host._bus.violations:
                await anyio.sleep(0.05)
        assert 'subscription to "writ.int.>"' in host._bus.violations[-1].lower()
        result = await host.run("crm-assistant", INPUT)  # a run crosses writ.int.> ...
        assert result.status == "succeeded"
        with pytest.raises(TimeoutError):  # ... and none of it reaches the host
            await internal.next_msg(timeout=0.5)


async def test_a_wrong_login_says_so_at_once(acme: HostCredentials) -> None:
    assert acme.nats is not None
    started = time.monotonic()
    with pytest.raises(PermissionDenied) as foreign_inbox:
        # Not the host's inbox prefix: its replies could never arrive.
        await NatsClient.connect(
            acme.nats.url,
            acme.issuer,
            "alice@acme.example",
            user=acme.nats.user,
            password=acme.nats.password,
            inbox_prefix="_INBOX",
        )
    assert "permissions violation" in str(foreign_inbox.value)
    with pytest.raises(AuthenticationError):
        await NatsClient.connect(
            acme.nats.url, acme.issuer, "alice@acme.example", user="host-acme", password="no"
        )
    assert time.monotonic() - started < 10  # the cause, not a timeout


async def test_a_subject_the_server_refuses_is_permission_denied_not_a_timeout(
    acme: HostCredentials,
) -> None:
    async with await NatsClient.from_credentials(acme, "alice@acme.example") as host:
        # The same connection asking for another tenant's read: NATS refuses the subject.
        stranger = NatsClient(host._bus, StaticToken("not-a-token", tenant="globex"), "mallory")
        started = time.monotonic()
        with pytest.raises(PermissionDenied) as refused:
            await stranger.get_run("run-1")
        assert 'publish to "writ.api.globex.run"' in str(refused.value).lower()
        assert time.monotonic() - started < 10  # the read waits 30 s for an answer
        assert (await host.run("crm-assistant", INPUT)).status == "succeeded"  # still usable


async def test_over_http_a_host_runs_replays_conflicts_and_waits_past_a_decision(
    acme: HostCredentials, crm: httpx.Client, payments: httpx.Client
) -> None:
    async with (
        Client.from_credentials(acme, "alice@acme.example") as host,
        Client.from_credentials(acme, "ops@acme.example", roles=["approver"]) as ops,
    ):
        request_id = f"sdk-{uuid.uuid4().hex[:12]}"
        run = await host.start("crm-assistant", INPUT, request_id=request_id)
        same = await host.start("crm-assistant", INPUT, request_id=request_id)
        assert same.run_id == run.run_id
        with pytest.raises(Conflict) as refused:
            await host.start("crm-assistant", "another input", request_id=request_id)
        assert (refused.value.code, refused.value.status) == ("CONFLICT", 409)
        result = await run.result()
        assert result.status == "succeeded" and result.version >= 1
        # A token the host minted elsewhere, sent as it is.
        minted = StaticToken(acme.issuer.token("alice@acme.example"), tenant="acme")
        async with Client(acme.api_url or "", minted, "alice@acme.example") as plain:
            assert (await plain.get_run(run.run_id)).version == result.version
        [action] = result.actions
        assert len(notes_for(crm, f"acme:{action.operation_id}")) == 1

        key = f"op-{uuid.uuid4().hex[:12]}"
        first = await host.submit_command("crm-assistant", key, "crm.note.create", NOTE)
        again = await host.submit_command("crm-assistant", key, "crm.note.create", NOTE)
        assert (first.status, again.operation_id) == ("succeeded", first.operation_id)
        other = {**NOTE, "body": "Another note"}
        conflict = await host.submit_command("crm-assistant", key, "crm.note.create", other)
        assert conflict.status == "conflict" and conflict.error is not None
        assert len(notes_for(crm, f"acme:{first.operation_id}")) == 1

        asked = await host.start("billing-assistant", INPUT)
        waiting = await asked.wait()
        assert waiting.status == "awaiting_human", waiting
        assert waiting.pending_id is not None and waiting.proposal is not None
        decided = await ops.decide(
            waiting.pending_id, "once", proposal_id=waiting.proposal.proposal_id
        )
        assert decided.accepted, decided
        final = await asked.wait()
        assert final.status == "succeeded" and final.version > waiting.version, final
        [charge] = final.actions
        assert len(charges_for(payments, charge.operation_id)) == 1


def test_the_sync_client_streams_a_runs_timeline(acme: HostCredentials) -> None:
    with SyncClient.from_credentials(acme, "alice@acme.example") as host:
        run = host.start("crm-assistant", INPUT)
        result = run.result()
        assert result.status == "succeeded"
        timeline = list(host.events(run.run_id))
        assert isinstance(timeline[-1], RunResult) and timeline[-1].run_id == run.run_id
        steps = [e for e in timeline[:-1] if isinstance(e, StepRecorded)]
        assert steps and [s.seq for s in steps] == list(range(len(steps)))
        # Leaving early closes the stream on the client's own loop.
        for event in host.events(run.run_id):
            assert isinstance(event, StepRecorded)
            break


async def test_a_handle_cancels_a_waiting_run_and_waits_for_that_news(
    acme: HostCredentials,
) -> None:
    async with (
        Client.from_credentials(acme, "alice@acme.example") as http,
        await NatsClient.from_credentials(acme, "alice@acme.example") as nats,
    ):
        for handle in (
            await http.start("billing-assistant", INPUT),
            await nats.start("billing-assistant", INPUT),
        ):
            waiting = handle.last or await handle.wait()
            assert waiting.status == "awaiting_human", waiting
            await handle.cancel()
            cancelled = await handle.wait()  # not the awaiting_human result it already had
            assert cancelled.status == "cancelled" and cancelled.version > waiting.version
            assert await handle.result() == cancelled


async def test_pending_decisions_and_proposals_page_by_cursor_on_both_doors(
    stack: Stack, acme: HostCredentials
) -> None:
    """Three runs wait for a person: three pending decisions and three proposals of one
    requester. Pages of two take two pages on each door, every item once, the same items."""
    requester = f"pager-{uuid.uuid4().hex[:8]}@acme.example"
    async with (
        Client.from_credentials(acme, requester) as host,
        Client.from_credentials(acme, "ops@acme.example", roles=["approver"]) as http,
        await NatsClient.from_credentials(acme, "ops@acme.example", roles=["approver"]) as nats,
    ):
        asked = [await host.run("billing-assistant", INPUT) for _ in range(3)]
        assert {r.status for r in asked} == {"awaiting_human"}, asked
        pending_ids = {r.pending_id for r in asked}
        proposal_ids = {r.proposal.proposal_id for r in asked if r.proposal is not None}
        assert len(pending_ids) == len(proposal_ids) == 3
        for ops in (http, nats):
            first = await ops.pending(limit=2, requester=requester)
            assert first.total == 3 and len(first.decisions) == 2, first
            assert first.next_cursor is not None
            rest = await ops.pending(limit=2, cursor=first.next_cursor, requester=requester)
            assert len(rest.decisions) == 1 and rest.next_cursor is None, rest
            assert {d.pending_id for d in [*first.decisions, *rest.decisions]} == pending_ids
            pages = ops.iter_pending(page_size=2, requester=requester)
            walked = [d.pending_id async for d in pages]
            assert len(walked) == len(set(walked)) and set(walked) == pending_ids

            page = await ops.proposals(limit=2, requester=requester)
            assert page.total == 3 and len(page.proposals) == 2 and page.next_cursor, page
            last = await ops.proposals(limit=2, cursor=page.next_cursor, requester=requester)
            assert len(last.proposals) == 1 and last.next_cursor is None, last
            seen = [p.proposal_id for p in [*page.proposals, *last.proposals]]
            assert set(seen) == proposal_ids and len(seen) == 3
        # Another tenant's host pages its own tenant alone, whatever cursor it is handed, and
        # its connection cannot ask acme's reads at all.
        globex = HostCredentials.from_dir(host_folder(stack, "globex"))
        async with await NatsClient.from_credentials(
            globex, "ops@globex.example", roles=["approver"]
        ) as stranger:
            theirs = await stranger.pending(limit=2, cursor=first.next_cursor, requester=requester)
            assert theirs.decisions == [] and theirs.total == 0, theirs
            listed = await stranger.proposals(limit=500, cursor=page.next_cursor)
            assert not proposal_ids & {p.proposal_id for p in listed.proposals}
            forged = NatsClient(stranger._bus, acme.issuer, "ops@acme.example", roles=["approver"])
            with pytest.raises(PermissionDenied):
                await forged.pending(limit=2)
        # Every proposal of the tenant, whatever ran before, each once, on both doors alike.
        everything = [p.proposal_id async for p in http.iter_proposals(page_size=2)]
        over_nats = [p.proposal_id async for p in nats.iter_proposals(page_size=2)]
        assert len(everything) == len(set(everything)) and proposal_ids <= set(everything)
        assert sorted(over_nats) == sorted(everything)
