"""Tenants are isolated on the bus by NATS itself.

Each cross-tenant read and write a hostile host tried is refused by the server: the host
connects with its own tenant's credentials, as the deployment generated them, and the server
answers a permissions violation; nothing reaches the other tenant or Writ's internals.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import anyio
import msgspec
import nats
import nats.errors
import pytest
from nats.aio.client import Client

from schemas import subjects
from schemas.admission import PlannedStep, RecordPlanFacts
from schemas.host import RunResult
from schemas.retrieval import ReadCapability
from tests.e2e.conftest import PROBE, Host, service_violations
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


class Violations:
    """The permission violations the server reported to one connection."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def record(self, exc: Exception) -> None:
        self.seen.append(str(exc))

    async def refused(self, kind: str, subject: str) -> None:
        """Until the server has refused `kind` (publish | subscription) on `subject`."""
        with anyio.fail_after(10):
            # nats-py lowercases the server's error line.
            while not any(
                "permissions violation" in s and kind in s and f'"{subject.lower()}"' in s.lower()
                for s in self.seen
            ):
                await anyio.sleep(0.05)


@pytest.fixture
async def acme(stack: Stack) -> AsyncIterator[tuple[Client, Violations]]:
    if stack.embedded_nats is None:
        pytest.skip("a NATS server named by WRIT_TEST_NATS_URL has its own permissions")
    violations = Violations()
    nc = await stack.host_connection("acme", error_cb=violations.record)
    yield nc, violations
    await nc.close()


async def _nothing_arrives(sub: nats.aio.subscription.Subscription) -> None:
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=0.5)


async def test_a_host_cannot_read_another_tenants_results(acme, host: Host) -> None:
    nc, violations = acme
    # globex's host has a result on its stream, for sure.
    request = host.request(tenant="globex", principal="bob@globex.example", token="not-a-jwt")
    await host.publish(request, tenant="globex", msg_id=request.request_id)
    assert (await host.wait_result(request.request_id, tenant="globex")).status == "rejected"

    sub = await nc.subscribe(subjects.result("globex"))
    await violations.refused("subscription", subjects.result("globex"))
    await _nothing_arrives(sub)
    wide = await nc.subscribe("writ.out.>")
    await violations.refused("subscription", "writ.out.>")
    await _nothing_arrives(wide)
    # Nor through JetStream: a consumer on globex's stream is never created.
    with pytest.raises(
        (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.Error)
    ):
        await nc.jetstream().subscribe(
            subjects.result("globex"), stream=subjects.out_stream("globex"), ordered_consumer=True
        )
    await violations.refused("publish", f"$JS.API.CONSUMER.CREATE.{subjects.out_stream('globex')}")
    # Nor the replies meant for others.
    inboxes = await nc.subscribe("_INBOX.>")
    await violations.refused("subscription", "_INBOX.>")
    await _nothing_arrives(inboxes)


async def test_a_host_reads_its_own_results_and_events(acme, host: Host) -> None:
    nc, violations = acme
    events = await nc.subscribe(subjects.planner_progress("acme"))
    run = host.request()
    await host.publish(run, msg_id=run.request_id)
    assert (await host.wait_result(run.request_id)).status == "succeeded"
    assert await events.next_msg(timeout=10)
    assert not [s for s in violations.seen if "permissions violation" in s]


async def test_a_host_cannot_call_internal_endpoints(acme) -> None:
    nc, violations = acme
    ask = ReadCapability(
        tenant="globex",
        run_id="r",
        tool="documents.search",
        arguments={"query": "invoice", "limit": 3},
        principal="bob",
        agent="crm-assistant",
    )
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await nc.request(subjects.READ, msgspec.json.encode(ask), timeout=1)
    await violations.refused("publish", subjects.READ)
    # Nor have admission read facts into its record, as a plan being proposed does.
    keep = RecordPlanFacts(
        tenant="acme",
        run_id="r",
        steps=[
            PlannedStep(
                step=0,
                capability="payment.refund",
                request={"payment_id": "pay_7781", "line_id": "L2"},
            )
        ],
    )
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await nc.request(subjects.PLAN_FACTS, msgspec.json.encode(keep), timeout=1)
    await violations.refused("publish", subjects.PLAN_FACTS)
    for subject in (
        "writ.int.>",
        "writ.cmd.>",
        "writ.events.planner.>",
        subjects.planner_progress("globex"),
    ):
        sub = await nc.subscribe(subject)
        await violations.refused("subscription", subject)
        await _nothing_arrives(sub)


async def test_a_host_cannot_publish_for_another_tenant(acme, host: Host) -> None:
    nc, violations = acme
    stream = subjects.in_stream("globex")
    before = (await host.js.stream_info(stream)).state.messages
    request = host.request(tenant="acme")
    for subject in (
        subjects.request("globex"),
        subjects.command("acme"),
        subjects.proposal("acme"),
        subjects.request("acme") + ".more",
    ):
        await nc.publish(subject, msgspec.json.encode(request))
        await violations.refused("publish", subject)
    await nc.flush()
    assert (await host.js.stream_info(stream)).state.messages == before


async def test_one_tenants_request_ids_never_collide_with_anothers(host: Host) -> None:
    # Defect 4: the same Nats-Msg-Id from two tenants is two requests, not a duplicate.
    shared = f"req-{uuid.uuid4().hex[:12]}"
    acme = host.request(request_id=shared)
    await host.publish(acme, msg_id=shared)
    globex = host.request(
        tenant="globex", principal="bob@globex.example", request_id=shared, token="not-a-jwt"
    )
    await host.publish(globex, tenant="globex", msg_id=shared)
    assert (await host.wait_result(shared, tenant="globex")).status == "rejected"
    assert (await host.wait_result(shared)).status == "succeeded"


async def test_nothing_is_stored_for_unknown_tenants_or_deeper_subjects(host: Host) -> None:
    # Defect 11, even for the administrator: no stream holds these subjects.
    request = msgspec.json.encode(host.request())
    for subject in (
        "writ.in.requests.nobody",
        subjects.request("acme") + ".more",
        "writ.in.other.acme",
        "writ.out.results.nobody",
    ):
        with pytest.raises((nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError)):
            await host.js.publish(subject, request, timeout=2)
    names = [name async for name in _stream_names(host)]
    assert not [n for n in names if "nobody" in n]


async def _stream_names(host: Host):
    for info in await host.js.streams_info():
        yield info.config.name


async def test_services_run_within_their_permissions(host: Host, stack: Stack) -> None:
    """Every service ran restricted, and none was refused anything it needed."""
    if stack.embedded_nats is None:
        pytest.skip("a NATS server named by WRIT_TEST_NATS_URL has its own permissions")
    run = host.request()
    await host.publish(run, msg_id=run.request_id)
    result = await host.wait_result(run.request_id)
    assert isinstance(result, RunResult) and result.status == "succeeded"
    # A service cannot do what another does: retrieval cannot put a command on the bus, nor
    # start a run (it reads untrusted content: who a run is for never passes through it).
    violations = Violations()
    retrieval = await nats.connect(
        stack.embedded_nats.url, error_cb=violations.record, **stack.nats_options("retrieval")
    )
    try:
        await retrieval.publish(subjects.command(PROBE), b"{}")
        await violations.refused("publish", subjects.command(PROBE))
        await retrieval.publish(subjects.evidence(PROBE), b"{}")
        await violations.refused("publish", subjects.evidence(PROBE))
    finally:
        await retrieval.close()
    # The server logs each violation: that one, and no other by any service (the session's
    # teardown checks the same once every e2e test has run).
    with anyio.fail_after(10):
        while not service_violations(stack, probes=True):
            await anyio.sleep(0.1)
    assert service_violations(stack) == []
