"""The SDK's NATS requests and the operator commands carry their `Writ-Deadline`:
the endpoints drop a request past it, so a caller who gave up costs nothing; without the header
it never expired.
Against a real nats-server, answered by a responder that records what it received."""

from __future__ import annotations

import time

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from nats.aio.client import Client
from nats.aio.msg import Msg

from libs.deadline import HEADER, expired
from libs.embedded import EmbeddedNats
from schemas import subjects
from schemas.dispatcher import UnknownCommands
from schemas.host_reads import host_read
from writ.operator import list_unknown
from writ_client import Issuer, NatsClient, WritError

pytestmark = pytest.mark.anyio


def _issuer() -> Issuer:
    pem = Ed25519PrivateKey.generate().private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )
    return Issuer(tenant="acme", issuer="https://acme.example/host", private_key_pem=pem)


async def test_a_read_and_a_session_operation_carry_the_sdks_deadline(
    private_nats: EmbeddedNats, private_nc: Client
) -> None:
    received: dict[str, dict[str, str]] = {}

    async def refuse(msg: Msg) -> None:
        received[msg.subject] = dict(msg.headers or {})
        await private_nc.publish(
            msg.reply,
            b"",
            headers={
                "Nats-Service-Error-Code": "404",
                "Nats-Service-Error": "NOT_FOUND: nothing here",
            },
        )

    await private_nc.subscribe(host_read("acme", ">"), cb=refuse)
    await private_nc.flush()
    client = await NatsClient.connect(private_nats.url, _issuer(), "alice@acme.example")
    try:
        before = time.time()
        with pytest.raises(WritError):
            await client.get_run("run-1")
        with pytest.raises(WritError):
            await client.open_session("chat-assistant")
    finally:
        await client.aclose()
    assert set(received) == {host_read("acme", "run"), "writ.api.acme.session"}, received
    for headers in received.values():
        deadline = float(headers[HEADER])
        # About the 30 s the SDK waits: not expired now, expired once it has given up.
        assert before + 25 < deadline < time.time() + 31
        assert not expired(headers) and expired(headers, now=deadline + 0.01)


async def test_an_operator_command_carries_its_deadline(
    private_nats: EmbeddedNats, private_nc: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    received: list[dict[str, str]] = []

    async def answer(msg: Msg) -> None:
        received.append(dict(msg.headers or {}))
        await private_nc.publish(msg.reply, msgspec.json.encode(UnknownCommands(commands=[])))

    await private_nc.subscribe(subjects.UNKNOWN_LIST, cb=answer)
    await private_nc.flush()
    before = time.time()
    assert await list_unknown(private_nats.url, "acme") == 0
    assert "no unknown commands for acme" in capsys.readouterr().out
    (headers,) = received
    assert before + 4 < float(headers[HEADER]) < time.time() + 6  # `writ reconcile`'s 5 s
