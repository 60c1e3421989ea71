"""The bus: connection, streams and consumers as code (created by libs/provision.py only),
and typed publishing."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, TypeVar

import anyio
import msgspec
import nats
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, BadRequestError, NoStreamResponseError

from libs.errors import RetryableError
from libs.natsauth import inbox_prefix
from libs.telemetry import inject_context
from schemas.subjects import STREAMS, StreamSpec

__all__ = [
    "ELECTION_PATIENCE_S",
    "OUTAGE_LIMIT_S",
    "ConsumerSpec",
    "BusUnavailable",
    "connect",
    "ensure_consumer",
    "ensure_streams",
    "in_election",
    "publish",
    "publish_now",
    "until_answered",
]

T = TypeVar("T")
log = logging.getLogger("writ.bus")

_ENCODER = msgspec.json.Encoder()


# How long a delivery that fails because a dependency is away (a Writ service, NATS,
# PostgreSQL) keeps being retried, counted from when the message was stored: 15 minutes.
OUTAGE_LIMIT_S: Final = 900.0

# How long a publish or a JetStream API call keeps retrying an election (a stream or consumer
# leader being chosen: no responders, a 503, a 409 "in process") before it gives up with
# `BusUnavailable`. A three-node cluster elects in a few seconds; a node killed with the
# leader on it takes its peers' election timeout and more on a loaded machine.
ELECTION_PATIENCE_S: Final = 30.0


class BusUnavailable(RetryableError):
    """JetStream gave no definite answer (an election outlasted the patience): try again
    later. A `RetryableError`, so a delivery waits it out instead of spending its retries."""


def in_election(exc: BaseException, *, idempotent: bool = True) -> bool:
    """Whether `exc` is JetStream between leaders rather than an answer: no responders (no
    stream or consumer leader listening), a 503, a 409 "duplicate message id is in process"
    (the first publish of that id is not settled yet), or no reply in time when repeating the
    call is harmless (`idempotent`: a publish with a message id, a read)."""
    if isinstance(exc, (NoStreamResponseError, NoRespondersError)):
        return True
    if isinstance(exc, APIError):
        # Some subclasses (a key-value store's `KeyWrongLastSequenceError`) set no code.
        code = getattr(exc, "code", None)
        if code == 503:
            return True
        return code == 409 and "in process" in (getattr(exc, "description", None) or "")
    return idempotent and isinstance(exc, (NatsTimeoutError, TimeoutError))


async def until_answered(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    idempotent: bool = True,
    patience_s: float = ELECTION_PATIENCE_S,
) -> T:
    """`call()`, again with backoff (50 ms doubling to 1 s, jittered) while it meets an
    election, until it answers or `patience_s` has passed.

    Raises:
        BusUnavailable: still no definite answer after `patience_s`.
    """
    deadline = time.monotonic() + patience_s
    delay = 0.05
    tries = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            if not in_election(exc, idempotent=idempotent):
                raise
            tries += 1
            if time.monotonic() + delay > deadline:
                raise BusUnavailable(f"{what}: no answer after {tries} tries: {exc!r}") from exc
            if tries == 1 or tries % 10 == 0:
                log.info("%s met an election (try %d), retrying: %r", what, tries, exc)
        await anyio.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, 1.0)


class ConsumerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A durable pull consumer: a service's inbox. Its `ack_wait` is the lease's clock.

    `max_deliver` bounds the deliveries of a poison message (one whose handler fails for any
    other reason); a delivery waiting out an outage is retried until it is `outage_limit_s`
    old (and at least `max_deliver` times). `run_actor` enforces both: JetStream itself
    redelivers without a limit, so nothing is ever left undelivered and not dead-lettered.
    """

    stream: str
    durable: str
    filter_subjects: tuple[str, ...]
    ack_wait_s: float = 30.0
    max_deliver: int = 10
    max_ack_pending: int = 1000
    outage_limit_s: float = OUTAGE_LIMIT_S
    # A retried delivery waits 0.25 s, doubling, up to this (`WRIT_RETRY_BACKOFF_MAX_S`).
    backoff_max_s: float = 30.0
    # Deliver only what is stored after the consumer is created (the shadow evaluation's copy).
    deliver_new: bool = False


async def connect(url: str, *, name: str, user: str = "", password: str = "") -> Client:
    """Connect to NATS, reconnecting forever: a service outlives a NATS restart.

    As `user` (libs/natsauth.py), its replies arrive under its own inbox prefix, the only
    inboxes its permissions let it read.
    """
    credentials: dict[str, str] = {}
    if user:
        credentials = {"user": user, "password": password, "inbox_prefix": inbox_prefix(user)}
    return await nats.connect(
        url,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=5,
        allow_reconnect=True,
        **credentials,
    )


async def ensure_streams(
    js: JetStreamContext,
    specs: Sequence[StreamSpec] = STREAMS,
    *,
    replicas: int = 1,
    duplicate_window_s: float = 0.0,
) -> None:
    """Create or update Writ's streams (idempotent): provisioning's (libs/provision.py), as
    the `provision` identity; no service holds the permission."""
    for spec in specs:
        config = StreamConfig(
            name=spec.name,
            subjects=list(spec.subjects),
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=spec.max_age_s,
            discard=DiscardPolicy.OLD,
            duplicate_window=duplicate_window_s or spec.duplicate_window_s,
            num_replicas=replicas,
        )
        if spec.append_only:
            config.deny_delete, config.deny_purge, config.allow_rollup_hdrs = True, True, False
        try:
            await js.add_stream(config)
        except BadRequestError as exc:
            if exc.err_code != 10058:  # stream name already in use with a different config
                raise
            await js.update_stream(config)


async def ensure_consumer(
    js: JetStreamContext,
    spec: ConsumerSpec,
    *,
    patience_s: float = ELECTION_PATIENCE_S,
    start_seq: int | None = None,
) -> None:
    """Create or update a durable pull consumer (idempotent; retried through an election):
    provisioning's, like streams. `start_seq`: a new consumer delivers from that stream
    sequence on (an existing one keeps where it is)."""
    policy = DeliverPolicy.NEW if spec.deliver_new else DeliverPolicy.ALL
    config = ConsumerConfig(
        durable_name=spec.durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE if start_seq is not None else policy,
        opt_start_seq=start_seq,
        ack_wait=spec.ack_wait_s,
        max_deliver=-1,
        max_ack_pending=spec.max_ack_pending,
        filter_subjects=list(spec.filter_subjects),
    )
    await until_answered(
        lambda: js.add_consumer(spec.stream, config),
        what=f"binding consumer {spec.durable}",
        patience_s=patience_s,
    )


async def publish(
    js: JetStreamContext,
    subject: str,
    message: msgspec.Struct,
    *,
    msg_id: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
) -> int:
    """Publish a schema message with the current trace context; returns its stream sequence.

    `msg_id` becomes `Nats-Msg-Id`, so a re-publish inside the stream's duplicate window is
    dropped by the server instead of delivered twice.

    A publish that meets an election is sent again (`until_answered`): certainly not stored
    when nobody answered, and deduplicated by `msg_id` when it may have been (a timeout is
    retried only with a `msg_id`). `timeout` bounds each try.

    Raises:
        BusUnavailable: no definite answer within `ELECTION_PATIENCE_S`.
    """
    hdrs = inject_context(dict(headers or {}))
    if msg_id is not None:
        hdrs["Nats-Msg-Id"] = msg_id
    payload = _ENCODER.encode(message)
    ack = await until_answered(
        lambda: js.publish(subject, payload, headers=hdrs, timeout=timeout),
        what=f"publish to {subject}",
        idempotent=msg_id is not None,
    )
    return int(ack.seq)


async def publish_now(
    nc: Client, subject: str, message: msgspec.Struct, *, msg_id: str | None = None
) -> None:
    """Publish without waiting for the stream's acknowledgement: for events nothing depends on.

    The message is still stored if a stream covers the subject, and `msg_id` still dedupes,
    but a lost one is not retried.
    """
    hdrs = inject_context({})
    if msg_id is not None:
        hdrs["Nats-Msg-Id"] = msg_id
    await nc.publish(subject, _ENCODER.encode(message), headers=hdrs)
