"""The accounts of libs/natsauth.py on a real nats-server: a host's reply subjects resolve in
its own account, a JetStream PubAck goes back there, and a tenant added later is one more
account applied by a reload (SIGHUP), without restarting the server or its clients."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import nats
import pytest
from nats.aio.client import Client

from libs.embedded import EmbeddedNats
from libs.journal import JetStreamRecord, SigningKey
from libs.journal._record import first_prev_head, signed_checkpoint
from libs.natsauth import (
    ADMIN,
    AUDIT_ADMIN,
    EVAL,
    HOST_JS_API,
    JOURNALED,
    PROVISION,
    PROVISION_AUDIT,
    SEAL_JS_API,
    SERVICE_SUBJECTS,
    auth_config,
    ensure_passwords,
    host_user,
    inbox_prefix,
    permissions,
    seal_user,
)
from libs.provision import provision_bus, provision_record
from schemas import subjects

pytestmark = pytest.mark.anyio


class Server:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tenants = ["acme", "globex"]
        self.nats = EmbeddedNats(folder / "nats", auth=self.auth())

    def auth(self) -> str:
        return auth_config(ensure_passwords(self.folder, self.tenants), self.tenants)

    async def connect(self, user: str, **options: object) -> Client:
        password = (self.folder / f"nats-{user}.password").read_text().strip()
        return await nats.connect(
            self.nats.url,
            user=user,
            password=password,
            inbox_prefix=inbox_prefix(user),
            **options,
        )


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    s = Server(tmp_path)
    s.nats.start()
    provisioner = await s.connect(PROVISION)
    await provision_bus(provisioner.jetstream(), s.tenants)
    await provisioner.close()
    provisioner = await s.connect(PROVISION_AUDIT)
    await provision_record(provisioner.jetstream())
    await provisioner.close()
    try:
        yield s
    finally:
        s.nats.stop()


async def _counts(admin: Client) -> dict[str, tuple[int, int]]:
    return {
        str(i.config.name): (i.state.first_seq, i.state.messages)
        for i in await admin.jetstream().streams_info()
    }


async def test_a_hosts_reply_subject_resolves_in_its_own_account(server: Server) -> None:
    admin = await server.connect(ADMIN)
    js = admin.jetstream()
    await js.publish(subjects.result("globex"), b"globex's result")
    host = await server.connect(host_user("acme"))
    try:
        before = await _counts(admin)
        # JetStream stores the host's message and sends its PubAck to the reply subject: back
        # through the import, to the host's account, where these subjects are nothing.
        for reply in (
            "$JS.API.STREAM.DELETE.WRIT_AUDIT",
            f"$JS.API.STREAM.PURGE.{subjects.out_stream('globex')}",
            subjects.journal_checkpoints("admission"),
            subjects.result("globex"),
        ):
            await host.publish(subjects.request("acme"), b"not json", reply=reply)
        await host.flush()
        await anyio.sleep(0.5)
        after = await _counts(admin)
        assert (
            after.pop(subjects.in_stream("acme"))[1]
            == before.pop(subjects.in_stream("acme"))[1] + 4
        )
        assert after == before
        # Its own JetStream acknowledgements still reach it.
        ack = await host.jetstream().publish(subjects.request("acme"), b"{}")
        assert ack.stream == subjects.in_stream("acme")
        # Writ's JetStream API is not the host's: nothing answers it there.
        with pytest.raises((nats.errors.NoRespondersError, nats.errors.TimeoutError)):
            await host.request("$JS.API.STREAM.DELETE.WRIT_AUDIT", b"", timeout=1)
        auditor = await server.connect(AUDIT_ADMIN)
        assert (await _counts(auditor))["WRIT_AUDIT"] == (0, 0)
        await auditor.close()
    finally:
        await host.close()
        await admin.close()


def _concrete(subject: str) -> str:
    return subject.replace(".*", ".acme").replace(".>", ".x")


async def test_no_runtime_identity_can_steer_anything_onto_the_record(server: Server) -> None:
    """A JetStream acknowledgement goes where the publish's reply subject says, in the
    account of the stream: a runtime identity's publish, on any subject it may use, with a
    reply naming a journal's record subject, stores nothing on the record. Only a journal's
    sealer, from its own account, appends there; it reads its record back, and cannot reach
    another journal's subject, even through the replies it is sent."""
    auditor = await server.connect(AUDIT_ADMIN)
    record = JetStreamRecord(auditor.jetstream())
    perms = permissions(server.tenants)
    published = 0
    for name in (*SERVICE_SUBJECTS, EVAL):
        nc = await server.connect(name)
        try:
            allowed = [
                _concrete(s)
                for s in perms[name]["publish"]["allow"]  # type: ignore[index]
                if s.startswith("writ.")
            ]
            for subject in allowed:
                for service in JOURNALED:
                    await nc.publish(
                        subject, b"not json", reply=subjects.journal_checkpoints(service)
                    )
                    published += 1
            await nc.flush()
        finally:
            await nc.close()
    assert published > 100
    await anyio.sleep(0.5)
    assert (await auditor.jetstream().stream_info("WRIT_AUDIT")).state.messages == 0

    # Each sealer appends on top of its own last checkpoint and reads it back.
    for service in JOURNALED:
        sealer = await server.connect(seal_user(service))
        own = JetStreamRecord(sealer.jetstream(prefix=SEAL_JS_API))
        try:
            signing = SigningKey.generate(f"{service}-1")
            checkpoint = signed_checkpoint(
                signing,
                service=service,
                seq=1,
                prev_seq=0,
                head=b"\x01" * 32,
                prev_head=bytes.fromhex(first_prev_head(service)),
                signed_at=1,
            )
            at = await own.append(checkpoint, after=0)
            assert await own.last(service) == (at, checkpoint)
            # Its record's acknowledgement and reads, steered to another journal's subject,
            # go nowhere: that subject is not imported into its account.
            for other in JOURNALED:
                if other == service:
                    continue
                await sealer.publish(
                    subjects.journal_checkpoints(service),
                    b"",
                    reply=subjects.journal_checkpoints(other),
                    headers={"Nats-Expected-Last-Subject-Sequence": "0"},  # refused: no junk
                )
                await sealer.publish(
                    f"{SEAL_JS_API}.STREAM.MSG.GET.WRIT_AUDIT",
                    b'{"seq":1}',
                    reply=subjects.journal_checkpoints(other),
                )
                await sealer.publish(subjects.journal_checkpoints(other), b"not mine")
            await sealer.flush()
            # Nor can it manage the record: only its reads are imported.
            with pytest.raises((nats.errors.NoRespondersError, nats.errors.TimeoutError)):
                await sealer.request(f"{SEAL_JS_API}.STREAM.PURGE.WRIT_AUDIT", b"", timeout=1)
        finally:
            await sealer.close()
    await anyio.sleep(0.5)
    for service in JOURNALED:
        scan = await record.scan(service)
        assert [c.service for c in scan.checkpoints] == [service]
        assert scan.junk == []
    assert (await auditor.jetstream().stream_info("WRIT_AUDIT")).state.messages == 4
    await auditor.close()


async def test_a_host_reads_its_own_stream_by_sequence_and_no_other(server: Server) -> None:
    admin = await server.connect(ADMIN)
    await admin.jetstream().publish(subjects.result("acme"), b"acme's result")
    await admin.jetstream().publish(subjects.result("globex"), b"globex's result")
    host = await server.connect(host_user("acme"))
    try:
        js = host.jetstream(prefix=HOST_JS_API)
        info = await js.stream_info(subjects.out_stream("acme"))
        assert (await js.get_msg(subjects.out_stream("acme"), info.state.last_seq)).data == (
            b"acme's result"
        )
        with pytest.raises((nats.errors.NoRespondersError, nats.errors.TimeoutError)):
            await host.request(
                f"{HOST_JS_API}.STREAM.MSG.GET.{subjects.out_stream('globex')}",
                b'{"seq":1}',
                timeout=1,
            )
    finally:
        await host.close()
        await admin.close()


async def test_a_tenant_added_later_is_one_more_account_applied_by_a_reload(
    server: Server,
) -> None:
    admin = await server.connect(ADMIN)
    acme = await server.connect(host_user("acme"))
    results = await acme.subscribe(subjects.result("acme"))
    try:
        server.tenants.append("initech")
        server.nats.reload(server.auth())
        provisioner = await server.connect(PROVISION)
        await provision_bus(provisioner.jetstream(), server.tenants)
        await provisioner.close()
        initech = await server.connect(host_user("initech"))
        try:
            ack = await initech.jetstream().publish(subjects.request("initech"), b"{}")
            assert ack.stream == subjects.in_stream("initech")
        finally:
            await initech.close()
        # The connections made before the reload go on, their imports intact.
        await admin.publish(subjects.result("acme"), b"after the reload")
        assert (await results.next_msg(timeout=5)).data == b"after the reload"
    finally:
        await acme.close()
        await admin.close()


def test_writ_nats_provision_makes_every_stream_consumer_and_bucket(tmp_path: Path) -> None:
    tenants = ["acme"]
    server = EmbeddedNats(
        tmp_path / "nats", auth=auth_config(ensure_passwords(tmp_path, tenants), tenants)
    )
    server.start()
    try:

        def provision(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "writ.cli", "nats", "provision", *args],
                env={
                    **os.environ,
                    "WRIT_NATS_URL": server.url,
                    "WRIT_NATS_PASSWORD_FILE": str(tmp_path / f"nats-{PROVISION}.password"),
                    "WRIT_AUDIT_NATS_PASSWORD_FILE": str(
                        tmp_path / f"nats-{PROVISION_AUDIT}.password"
                    ),
                },
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        done = provision("--tenant", "acme", "--lease-s", "7")
        assert done.returncode == 0, done.stderr
        again = provision("--tenant", "acme", "--lease-s", "7")  # idempotent
        assert again.returncode == 0, again.stderr

        async def check() -> None:
            admin = await nats.connect(
                server.url,
                user=ADMIN,
                password=(tmp_path / f"nats-{ADMIN}.password").read_text().strip(),
            )
            try:
                js = admin.jetstream()
                names = {i.config.name for i in await js.streams_info()}
                assert {s.name for s in subjects.STREAMS} <= names
                assert {subjects.in_stream("acme"), subjects.out_stream("acme")} <= names
                assert {"KV_WRIT_IDEMPOTENCY", "KV_WRIT_CONSOLE", "KV_WRIT_OWNERS"} <= names
                dispatcher = await js.consumer_info("WRIT_CMD", "dispatcher")
                assert dispatcher.config.ack_wait == 7
                assert "WRIT_AUDIT" not in names  # in its own account
            finally:
                await admin.close()
            auditor = await nats.connect(
                server.url,
                user=AUDIT_ADMIN,
                password=(tmp_path / f"nats-{AUDIT_ADMIN}.password").read_text().strip(),
            )
            try:
                info = await auditor.jetstream().stream_info("WRIT_AUDIT")
                assert info.config.deny_purge and info.config.deny_delete
            finally:
                await auditor.close()

        anyio.run(check)
        # Any other identity is refused: a service's password does not provision.
        planner = tmp_path / "nats-planner.password"
        refused = subprocess.run(
            [sys.executable, "-m", "writ.cli", "nats", "provision", "--user", "planner"],
            env={
                **os.environ,
                "WRIT_NATS_URL": server.url,
                "WRIT_NATS_PASSWORD_FILE": str(planner),
                "WRIT_AUDIT_NATS_PASSWORD_FILE": str(planner),
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode != 0
    finally:
        server.stop()
