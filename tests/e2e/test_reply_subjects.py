"""The bus is an authority boundary: a reply subject steers nothing, and no runtime identity
manages a stream (docs/bus.md).

A request names its reply subject, and its answer (an error, a result, JetStream's own PubAck)
is published there: named `$JS.API.STREAM.DELETE.WRIT_AUDIT`, an answer would be a request to
delete the audit record; named another tenant's result subject, a forged result. Here every
host-facing subject is sent undecodable requests as `host-acme` (its own credentials only),
and every internal request subject as a service allowed to use it (a compromised service),
each with a reply subject of every stream's delete and purge, another tenant's result subject
and internal subjects: every stream is still there, nothing was purged, and nothing stored
since is an answer. Then every service's, the evaluation's and each host's identity asks
JetStream to create, update, delete and purge every stream and to create durable consumers:
the server refuses each, and nothing changes.

The audit record is in an account of its own: no publish of a runtime identity, whatever reply
subject it names, stores anything on it (JetStream's acknowledgement is published in the
account of the stream that took the publish), and nobody but the record's administrator
touches it here: its message count is unchanged by every attack.

The subjects come from the deployment's own tables (`libs.natsauth`), so a new one is covered.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamInfo

from libs.natsauth import (
    EVAL,
    JOURNALED,
    SEAL_JS_API,
    SERVICE_SUBJECTS,
    host_imports,
    host_user,
    inbox_prefix,
    permissions,
    seal_user,
)
from schemas import subjects
from schemas.host_reads import HOST_READS, host_read
from tests.e2e.conftest import PROBE, Host
from tests.e2e.test_metrics import scrape
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

ATTACKER, VICTIM = "acme", "globex"


def _concrete(pattern: str) -> str:
    """A subject a pattern matches: each wildcard the attacker's tenant (or a read's name)."""
    tokens = pattern.split(".")
    return ".".join(ATTACKER if t == "*" else "x.y" if t == ">" else t for t in tokens)


def _matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def _host_subjects() -> list[str]:
    services, _ = host_imports(ATTACKER)
    found = []
    for _, pattern in services:
        if pattern == host_read(ATTACKER, "*"):
            found += [host_read(ATTACKER, read) for read in HOST_READS]
        else:
            found.append(_concrete(pattern).replace("x.y", subjects.result(ATTACKER)))
    return found


def _stored(subject: str) -> bool:
    """Whether a stream keeps `subject` (a publish, not a request: ingress hears results)."""
    return any(
        _matches(p, subject)
        for spec in (*subjects.STREAMS, *subjects.tenant_streams(ATTACKER))
        for p in spec.subjects
    )


def _service_requests() -> list[tuple[str, str, str]]:
    """(an internal endpoint's subject, the service serving it, a service allowed to send to
    it) for every endpoint some other service may publish to."""
    found: dict[str, tuple[str, str, str]] = {}
    for owner, (_, _, endpoints) in SERVICE_SUBJECTS.items():
        for endpoint in endpoints:
            subject = _concrete(endpoint)
            if _stored(subject):
                continue
            for sender, (_, publishes, _) in SERVICE_SUBJECTS.items():
                if sender != owner and any(_matches(p, subject) for p in publishes):
                    found.setdefault(subject, (subject, owner, sender))
                    break
    return sorted(found.values())


async def _streams(stack: Stack, host: Host) -> dict[str, StreamInfo]:
    return {str(info.config.name): info for info in await host.js.streams_info()}


def _replies(streams: dict[str, Any]) -> list[str]:
    """Where an attacker would want an answer to land."""
    found = []
    for name in streams:
        found += [f"$JS.API.STREAM.DELETE.{name}", f"$JS.API.STREAM.PURGE.{name}"]
    return [
        *found,
        f"$JS.API.STREAM.DELETE.{subjects.JOURNAL_RECORD_STREAM}",
        f"$JS.API.STREAM.PURGE.{subjects.JOURNAL_RECORD_STREAM}",
        subjects.result(VICTIM),
        subjects.proposal_answer(VICTIM),
        subjects.command(VICTIM),
        subjects.journal_checkpoints("admission"),
    ]


def _an_answer(msg: Any) -> bool:
    """A stored message that is some process's answer: a micro error, or a PubAck."""
    if (msg.headers or {}).get("Nats-Service-Error-Code"):
        return True
    try:
        body = json.loads(msg.data or b"null")
    except ValueError:
        return False
    return isinstance(body, dict) and "stream" in body and "seq" in body


async def _unharmed(host: Host, before: dict[str, StreamInfo]) -> None:
    """Every stream still there, nothing purged, and nothing stored since that is an answer."""
    after = {info.config.name: info for info in await host.js.streams_info()}
    assert set(after) >= set(before), f"streams gone: {set(before) - set(after)}"
    for name, was in before.items():
        now = after[name]
        assert now.state.first_seq == was.state.first_seq or (was.state.messages == 0), (
            f"{name} was purged"
        )
        assert now.state.messages >= was.state.messages, f"{name} lost messages"
        assert now.config.subjects == was.config.subjects, f"{name} was reconfigured"
        for seq in range(was.state.last_seq + 1, now.state.last_seq + 1):
            try:
                msg = await host.js.get_msg(name, seq)
            except nats.js.errors.NotFoundError:
                continue
            assert not _an_answer(msg), f"an answer was stored on {name}: {msg.subject}"
    for name in (subjects.in_stream(VICTIM), subjects.out_stream(VICTIM)):
        assert after[name].state.messages == before[name].state.messages


async def _settled() -> None:
    # The requests are fire-and-forget: give the services time to have answered, were they to.
    await anyio.sleep(1.5)


async def _connect(stack: Stack, user: str, seen: list[str]) -> Client:
    assert stack.embedded_nats is not None

    async def record(exc: Exception) -> None:
        seen.append(str(exc).lower())

    # Named after the probe: the session's check for services' violations leaves these out.
    return await nats.connect(
        stack.embedded_nats.url, name=PROBE, error_cb=record, **stack.nats_options(user)
    )


@pytest.fixture(autouse=True)
def _embedded(stack: Stack) -> None:
    if stack.embedded_nats is None:
        pytest.skip("a NATS server named by WRIT_TEST_NATS_URL has its own accounts")


async def _quiet(record: JetStreamContext) -> tuple[int, int]:
    """The record's (first sequence, message count) once its sealers have nothing to add."""
    found = (-1, -1)
    with anyio.fail_after(60):
        while True:
            state = (await record.stream_info(subjects.JOURNAL_RECORD_STREAM)).state
            if (state.first_seq, state.messages) == found:
                return found
            found = (state.first_seq, state.messages)
            await anyio.sleep(1.5)


async def test_no_runtime_publish_steers_an_acknowledgement_onto_the_record(
    stack: Stack, host: Host, record: JetStreamContext
) -> None:
    """Every Writ identity publishes on each stored subject it may use, with a reply subject
    of each journal's record: JetStream acknowledges each in Writ's account, where the
    record's subjects reach nothing."""
    perms = permissions([ATTACKER, VICTIM])
    sent = []
    before = await _quiet(record)
    for user in (*SERVICE_SUBJECTS, EVAL):
        seen: list[str] = []
        nc = await _connect(stack, user, seen)
        try:
            # Not the hosts' result streams: the deployment is shared, and hosts (the other
            # tests) read theirs as results only. Every other stored subject is tried.
            stored = [
                _concrete(p)
                for p in perms[user]["publish"]["allow"]  # type: ignore[index]
                if _stored(_concrete(p)) and not _concrete(p).startswith("writ.out.")
            ]
            for subject in stored:
                for journal in JOURNALED:
                    await nc.publish(
                        subject, b"not json", reply=subjects.journal_checkpoints(journal)
                    )
                    sent.append((user, subject))
            await nc.flush()
        finally:
            await nc.close()
        assert not seen, (user, seen)  # each publish was the identity's to make
    assert {u for u, s in sent if s.startswith("writ.int.")} >= {"planner", "ingress"}
    await _settled()
    assert await _quiet(record) == before


@pytest.mark.parametrize("subject", _host_subjects())
async def test_a_hosts_reply_subject_steers_nothing(stack: Stack, host: Host, subject: str) -> None:
    before = await _streams(stack, host)
    nc = await stack.host_connection(ATTACKER)
    try:
        for reply in _replies(before):
            await nc.publish(subject, b"not json", reply=reply)
        await nc.flush()
        await _settled()
    finally:
        await nc.close()
    await _unharmed(host, before)


@pytest.mark.parametrize(("subject", "owner", "sender"), _service_requests(), ids=lambda v: str(v))
async def test_a_services_reply_subject_steers_nothing(
    stack: Stack, host: Host, subject: str, owner: str, sender: str
) -> None:
    before = await _streams(stack, host)
    dropped_before = await _dropped(stack, owner)
    seen: list[str] = []
    nc = await _connect(stack, sender, seen)
    try:
        replies = _replies(before)
        for reply in replies:
            await nc.publish(subject, b"not json", reply=reply)
        await nc.flush()
        await _settled()
    finally:
        await nc.close()
    assert not seen, seen  # the sender may send there: what stops it is the answerer
    await _unharmed(host, before)
    # The endpoint refused each of them in code too, before any work, and counted it (an
    # endpoint that is a subscription only answers nothing and counts nothing).
    if subject != _concrete(subjects.admitted("*")):
        assert await _dropped(stack, owner) - dropped_before >= len(replies)


async def _dropped(stack: Stack, service: str) -> float:
    samples = await scrape(stack, service)
    return sum(
        s.value
        for s in samples.get("writ_requests_dropped_total", [])
        if s.labels.get("service") == service and s.labels.get("reason") == "reply"
    )


def _management(stream: str, config: dict[str, Any]) -> list[tuple[str, bytes]]:
    """Every call that creates, changes or removes a stream or a durable consumer of it."""
    hijack = {**config, "subjects": [*config.get("subjects", []), "writ.eval.steer"]}
    durable = {
        "stream_name": stream,
        "config": {
            "durable_name": "steer",
            "deliver_subject": subjects.proposal_answer(VICTIM),
            "ack_policy": "none",
        },
    }
    return [
        (f"$JS.API.STREAM.CREATE.{stream}X", json.dumps({**config, "name": f"{stream}X"}).encode()),
        (f"$JS.API.STREAM.UPDATE.{stream}", json.dumps(hijack).encode()),
        (f"$JS.API.STREAM.DELETE.{stream}", b""),
        (f"$JS.API.STREAM.PURGE.{stream}", b""),
        (f"$JS.API.STREAM.MSG.DELETE.{stream}", b'{"seq": 1}'),
        (f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.steer", json.dumps(durable).encode()),
        (f"$JS.API.CONSUMER.CREATE.{stream}.steer", json.dumps(durable).encode()),
        (f"$JS.API.CONSUMER.DELETE.{stream}.{next(iter(SERVICE_SUBJECTS))}", b""),
    ]


_RUNTIME = [
    *SERVICE_SUBJECTS,
    EVAL,
    host_user(ATTACKER),
    host_user(VICTIM),
    *(seal_user(s) for s in JOURNALED),
]


@pytest.mark.parametrize("user", _RUNTIME)
async def test_no_runtime_identity_manages_a_stream(
    stack: Stack, host: Host, record: JetStreamContext, user: str
) -> None:
    before = await _streams(stack, host)
    consumers = {name: len(await host.js.consumers_info(name)) for name in before}
    record_before = await record.stream_info(subjects.JOURNAL_RECORD_STREAM)
    audit = record_before.config.as_dict()
    seen: list[str] = []
    nc = await _connect(stack, user, seen)
    calls = [
        call for name, info in before.items() for call in _management(name, info.config.as_dict())
    ]
    # The record's management, as Writ's API and as the one a sealer reaches the record by.
    for subject, body in _management(subjects.JOURNAL_RECORD_STREAM, audit):
        calls += [(subject, body), (subject.replace("$JS.API", SEAL_JS_API, 1), body)]
    try:
        for subject, body in calls:
            await nc.publish(subject, body, reply=f"{inbox_prefix(user)}.steer")
        await nc.flush()
        with anyio.fail_after(20):
            # The server refused each, and said so (nats-py lowercases its error line).
            while missing := [s for s, _ in calls if not any(f'"{s.lower()}"' in e for e in seen)]:
                await anyio.sleep(0.1)
    except TimeoutError:
        pytest.fail(f"{user} was not refused: {missing[:5]}")
    finally:
        await nc.close()
    await _unharmed(host, before)
    assert {name: len(await host.js.consumers_info(name)) for name in before} == consumers
    assert not [n for n in await _streams(stack, host) if n.endswith("X")]
    # The record: still there, nothing purged or removed, its configuration as it was (its
    # sealers may have appended meanwhile), no consumer made.
    record_after = await record.stream_info(subjects.JOURNAL_RECORD_STREAM)
    assert record_after.state.first_seq == record_before.state.first_seq
    assert record_after.state.messages >= record_before.state.messages
    assert record_after.config == record_before.config
    assert len(await record.consumers_info(subjects.JOURNAL_RECORD_STREAM)) == 0
