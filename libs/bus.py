"""The bus: connection, streams and consumers as code (created by libs/provision.py only),
and typed publishing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec
import nats
from nats.aio.client import Client
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
from nats.js.errors import BadRequestError

from libs.natsauth import inbox_prefix
from libs.telemetry import inject_context
from schemas.subjects import STREAMS, StreamSpec

__all__ = [
    "OUTAGE_LIMIT_S",
    "ConsumerSpec",
    "connect",
    "ensure_consumer",
    "ensure_streams",
    "publish",
    "publish_now",
]

_ENCODER = msgspec.json.Encoder()


# How long a delivery that fails because a dependency is away (a Writ service, NATS,
# PostgreSQL) keeps being retried, counted from when the message was stored: 15 minutes.
OUTAGE_LIMIT_S: Final = 900.0


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


async def ensure_consumer(js: JetStreamContext, spec: ConsumerSpec) -> None:
    """Create or update a durable pull consumer (idempotent): provisioning's, like streams."""
    config = ConsumerConfig(
        durable_name=spec.durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.NEW if spec.deliver_new else DeliverPolicy.ALL,
        ack_wait=spec.ack_wait_s,
        max_deliver=-1,
        max_ack_pending=spec.max_ack_pending,
        filter_subjects=list(spec.filter_subjects),
    )
    await js.add_consumer(spec.stream, config)


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
    """
    hdrs = inject_context(dict(headers or {}))
    if msg_id is not None:
        hdrs["Nats-Msg-Id"] = msg_id
    ack = await js.publish(subject, _ENCODER.encode(message), headers=hdrs, timeout=timeout)
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
