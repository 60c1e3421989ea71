"""A tenant's run requests have a consumer of their own on a real nats-server: a burst of
commands stored before a run request does not delay the run's start (it is registered while
most of the burst still waits), and a deployment whose one ingress consumer took everything
is provisioned into two without a request lost or delivered from the stream's start again."""

from __future__ import annotations

import time

import anyio
import anyio.abc
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nats.aio.client import Client
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry

from libs.bus import ConsumerSpec, ensure_consumer, ensure_streams
from libs.provision import RUNS_DURABLE, provision_bus
from libs.runtime import Runtime
from libs.telemetry import make_tracer_provider
from schemas import subjects
from schemas.governance import RegisterRun
from schemas.host import RunRequest, SubmitCommand
from schemas.retrieval import EvidenceFound, SearchEvidence
from services.ingress.logic import TenantKey
from services.ingress.service import IngressService
from writ.stack import mint_token

pytestmark = pytest.mark.anyio

ISSUER = "https://idp.acme.example"
_KEY = Ed25519PrivateKey.generate()
PRIVATE = _KEY.private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
)
KEYS = {
    "acme": TenantKey(
        issuer=ISSUER,
        public_key=_KEY.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode(),
    )
}
BURST = 1500


def _token() -> str:
    return mint_token(PRIVATE, issuer=ISSUER, tenant="acme", principal="ops@acme", ttl_s=600)


async def _service(nc: Client, tg: anyio.abc.TaskGroup) -> None:
    rt = Runtime(
        name="ingress",
        nc=nc,
        js=nc.jetstream(),
        registry=CollectorRegistry(),
        tracer_provider=make_tracer_provider("ingress"),
    )
    svc = IngressService(rt=rt, keys=KEYS, audience="writ", max_request_bytes=64 * 1024)
    await tg.start(svc.run)


async def test_a_burst_of_commands_does_not_delay_a_runs_start(
    private_nc: Client, unique: str
) -> None:
    nc = private_nc
    js = nc.jetstream()
    await provision_bus(js, ["acme"])
    token = _token()
    # The burst is stored first, the run request after all of it, before ingress starts.
    for n in range(BURST):
        command = SubmitCommand(
            request_id=f"cmd-{unique}-{n}",
            token=token,
            agent="crm-assistant",
            operation_key=f"op-{unique}-{n}",
            action="crm.note.create",
            arguments={"customer_id": "ACME-42", "body": f"note {n}"},
        )
        await js.publish(
            subjects.command_request("acme"),
            msgspec.json.encode(command),
            headers={"Nats-Msg-Id": command.request_id},
        )
    request = RunRequest(
        request_id=f"run-{unique}", token=token, agent="crm-assistant", input="Note a call."
    )
    await js.publish(
        subjects.request("acme"),
        msgspec.json.encode(request),
        headers={"Nats-Msg-Id": request.request_id},
    )

    registered = anyio.Event()
    waiting_then: list[int] = []

    async def governance(msg: Msg) -> None:
        run = msgspec.json.decode(msg.data, type=RegisterRun)
        if not registered.is_set():  # how much of the burst was still to handle then
            info = await js.consumer_info(subjects.in_stream("acme"), "ingress")
            waiting_then.append(info.num_pending + info.num_ack_pending)
            registered.set()
        assert run.tenant == "acme"
        await msg.respond(b"{}")

    async def retrieval(msg: Msg) -> None:
        search = msgspec.json.decode(msg.data, type=SearchEvidence)
        await msg.respond(msgspec.json.encode(EvidenceFound(run_id=search.run_id, evidence=[])))

    register_sub = await nc.subscribe(subjects.REGISTER_RUN, cb=governance)
    search_sub = await nc.subscribe(subjects.SEARCH, cb=retrieval)
    async with anyio.create_task_group() as tg:
        started = time.monotonic()
        await _service(nc, tg)
        with anyio.fail_after(30):
            await registered.wait()
        took = time.monotonic() - started
        # The run started while most of the burst stored before it still waited.
        assert waiting_then[0] > BURST // 2, (waiting_then, took)
        # And the burst is handled all the same, each command handed on to admission.
        with anyio.fail_after(120):
            while True:
                info = await js.consumer_info(subjects.in_stream("acme"), "ingress")
                if info.num_pending + info.num_ack_pending == 0:
                    break
                await anyio.sleep(0.2)
        handed = await js.stream_info("WRIT_INT", subjects_filter=subjects.proposal("acme"))
        assert (handed.state.subjects or {}).get(subjects.proposal("acme")) == BURST
        tg.cancel_scope.cancel()
    await register_sub.unsubscribe()
    await search_sub.unsubscribe()
    print(f"run registered {took:.2f}s after ingress started, {waiting_then[0]} commands waiting")


async def test_one_consumer_for_everything_is_split_from_what_it_settled(
    private_nc: Client, unique: str
) -> None:
    # A deployment provisioned with one consumer of every host message: three run requests
    # stored, the first two settled. Provisioned again, the runs consumer starts at the third.
    js = private_nc.jetstream()
    tenant = f"t{unique}"
    await provision_bus(js, [])

    await ensure_streams(js, subjects.tenant_streams(tenant))
    stream = subjects.in_stream(tenant)
    await ensure_consumer(
        js,
        ConsumerSpec(
            stream=stream, durable="ingress", filter_subjects=subjects.host_subjects(tenant)
        ),
    )
    for n in range(3):
        await js.publish(subjects.request(tenant), b"{}", headers={"Nats-Msg-Id": f"r{n}"})
    await js.publish(subjects.command_request(tenant), b"{}", headers={"Nats-Msg-Id": "c0"})
    sub = await js.pull_subscribe_bind("ingress", stream=stream)
    for msg in await sub.fetch(2, timeout=5):
        await msg.ack_sync()

    await provision_bus(js, [tenant])

    runs = await js.consumer_info(stream, RUNS_DURABLE)
    assert runs.config.filter_subjects == [subjects.request(tenant)] or (
        runs.config.filter_subject == subjects.request(tenant)
    )
    assert runs.num_pending == 1  # the third request, not the two settled ones
    [third] = await (await js.pull_subscribe_bind(RUNS_DURABLE, stream=stream)).fetch(1, timeout=5)
    assert third.headers is not None and third.headers["Nats-Msg-Id"] == "r2"
    others = await js.consumer_info(stream, "ingress")
    assert subjects.request(tenant) not in (others.config.filter_subjects or [])
    assert others.num_pending == 1  # the command, still its
    # Provisioned once more, nothing moves: the runs consumer keeps where it is.
    await provision_bus(js, [tenant])
    assert (await js.consumer_info(stream, RUNS_DURABLE)).num_ack_pending == 1
