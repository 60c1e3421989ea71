"""Provisioning the bus: every stream, durable consumer and key-value bucket Writ uses.

Streams, consumers, buckets and their limits are created and changed here and nowhere else:
by `writ nats provision` (which `writ run` and the local `Stack` run before any service
starts, and the chart's migration Job runs with `writ migrate`), connected as the NATS user
`provision`, an identity used for nothing else (libs/natsauth.py). No service and no host
may create, update, delete or purge a stream, nor create a durable consumer: a service binds
to the consumer provisioned for it (`libs.actor.run_actor`) and opens the buckets it uses as
they are.

Idempotent: run again, it creates what is missing and updates what differs (a new tenant's
streams and ingress's consumer on them, a changed limit). The audit record's deny-delete and
deny-purge are set here, and the server refuses any update that lifts them. The record lives
in an account of its own (`AUDIT`, libs/natsauth.py): `provision_record` creates it there,
connected as that account's provisioning identity (`provision-audit`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Final

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from libs.bus import (
    ELECTION_PATIENCE_S,
    ConsumerSpec,
    ensure_consumer,
    ensure_streams,
    until_answered,
)
from libs.natsauth import INGRESS_RUNS
from schemas import subjects

__all__ = [
    "CONSOLE_BUCKET",
    "EVAL_DURABLE",
    "IDEMPOTENCY_BUCKET",
    "OWNERS_BUCKET",
    "RUNS_DURABLE",
    "BUCKETS",
    "ConsumerMissing",
    "bind_bucket",
    "bind_consumer",
    "consumers",
    "ensure_bucket",
    "host_consumers",
    "provision_bus",
    "provision_record",
    "provision_tenant",
    "retire_tenant",
]

# The HTTP door's `Idempotency-Key` bucket: the first answer under each key, for 24 hours.
IDEMPOTENCY_BUCKET: Final = KeyValueConfig(
    bucket="WRIT_IDEMPOTENCY",
    history=1,
    ttl=24 * 3600.0,
    max_value_size=256 * 1024,
    description="HTTP Idempotency-Key: fingerprint and first answer",
)
# The approval console's sessions and used sign-in links; entries outlive the longest token
# (an hour) a little.
CONSOLE_BUCKET: Final = KeyValueConfig(
    bucket="WRIT_CONSOLE",
    history=1,
    ttl=3600.0 + 300,
    max_value_size=16 * 1024,
    description="The approval console's sessions and used sign-in links",
)
# Who first used each request id and operation key, per tenant (`services/ingress/_owners.py`):
# kept as long as the runs and commands those ids name, so without an expiry (a tenant retired
# keeps them too: its runs stay, and a tenant added again under its name must not reach them).
OWNERS_BUCKET: Final = KeyValueConfig(
    bucket="WRIT_OWNERS",
    history=1,
    max_value_size=1024,
    description="The first principal of each request id and operation key",
)
BUCKETS: Final = (IDEMPOTENCY_BUCKET, CONSOLE_BUCKET, OWNERS_BUCKET)
# The shadow evaluation's copy of the runs that start (`writ eval shadow`).
EVAL_DURABLE: Final = "eval"
# Ingress's consumer of the runs a tenant's host asks for (`writ.in.requests.<tenant>`), beside
# its `ingress` consumer of everything else the host sends (`host_consumers`).
RUNS_DURABLE: Final = INGRESS_RUNS


class ConsumerMissing(RuntimeError):
    """A durable consumer or bucket a process binds to was never provisioned."""


def host_consumers(tenant: str) -> tuple[ConsumerSpec, ConsumerSpec]:
    """Ingress's two durable consumers on one tenant's host stream: its commands, decisions,
    approvals and reviews (`ingress`), and its run requests (`RUNS_DURABLE`). Apart, each has
    its own acknowledgements pending and its own fetch loop, so a burst of commands never
    queues a run's start behind it, nor a burst of runs a command."""
    runs = subjects.request(tenant)
    return (
        ConsumerSpec(
            stream=subjects.in_stream(tenant),
            durable="ingress",
            filter_subjects=tuple(s for s in subjects.host_subjects(tenant) if s != runs),
        ),
        ConsumerSpec(
            stream=subjects.in_stream(tenant), durable=RUNS_DURABLE, filter_subjects=(runs,)
        ),
    )


def consumers(tenants: Iterable[str], *, dispatcher_lease_s: float = 30.0) -> list[ConsumerSpec]:
    """Every durable consumer of a deployment: each service's inbox, ingress's two on each
    tenant's host stream (`host_consumers`), and the shadow evaluation's. The dispatcher's
    `ack_wait` is its lease's clock (`WRIT_LEASE_S` of the dispatcher)."""
    found = [
        ConsumerSpec(stream="WRIT_INT", durable="planner", filter_subjects=subjects.PLANNER_IN),
        ConsumerSpec(
            stream="WRIT_INT", durable="governance", filter_subjects=subjects.GOVERNANCE_IN
        ),
        ConsumerSpec(stream="WRIT_INT", durable="admission", filter_subjects=subjects.ADMISSION_IN),
        ConsumerSpec(
            stream="WRIT_CMD",
            durable="dispatcher",
            filter_subjects=subjects.DISPATCH_IN,
            ack_wait_s=dispatcher_lease_s,
            max_deliver=50,
        ),
        ConsumerSpec(
            stream="WRIT_INT",
            durable=EVAL_DURABLE,
            filter_subjects=subjects.inbox(EVAL_DURABLE),
            deliver_new=True,
        ),
    ]
    for tenant in tenants:
        found.extend(host_consumers(tenant))
    return found


async def bind_consumer(
    js: JetStreamContext, spec: ConsumerSpec, *, patience_s: float = ELECTION_PATIENCE_S
) -> None:
    """Check that `spec`'s durable consumer exists; a process never creates one. An election
    answers nothing definite yet, so it is waited out for up to `patience_s`.

    Raises:
        ConsumerMissing: it was not provisioned (`writ nats provision`).
        BusUnavailable: no definite answer within `patience_s`.
    """
    try:
        await until_answered(
            lambda: js.consumer_info(spec.stream, spec.durable),
            what=f"binding consumer {spec.durable}",
            patience_s=patience_s,
        )
    except NotFoundError as exc:
        raise ConsumerMissing(
            f"consumer {spec.durable} on stream {spec.stream} does not exist: "
            "provision the bus first (writ nats provision)"
        ) from exc


async def bind_bucket(js: JetStreamContext, bucket: str) -> KeyValue:
    """A provisioned key-value bucket, opened as it is.

    Raises:
        ConsumerMissing: it was not provisioned (`writ nats provision`).
    """
    try:
        return await js.key_value(bucket)
    except BucketNotFoundError as exc:
        raise ConsumerMissing(
            f"bucket {bucket} does not exist: provision the bus first (writ nats provision)"
        ) from exc


async def ensure_bucket(js: JetStreamContext, config: KeyValueConfig, *, replicas: int) -> None:
    """Create a key-value bucket at `replicas`, or leave it as it is if it exists."""
    try:
        await js.key_value(config.bucket)
    except BucketNotFoundError:
        await js.create_key_value(dataclasses.replace(config, replicas=replicas))


async def provision_record(js: JetStreamContext, *, replicas: int = 1) -> None:
    """Create or update the audit record (`WRIT_AUDIT`, append-only): `js` is the
    record's account's (`AUDIT`; on a server without authentication, the only account)."""
    await ensure_streams(js, [subjects.JOURNAL_RECORD], replicas=replicas)


async def provision_bus(
    js: JetStreamContext,
    tenants: Iterable[str],
    *,
    replicas: int = 1,
    duplicate_window_s: float = 0.0,
    dispatcher_lease_s: float = 30.0,
) -> None:
    """Create or update every stream, durable consumer and bucket of a deployment."""
    tenants = tuple(tenants)
    await ensure_streams(
        js, subjects.STREAMS, replicas=replicas, duplicate_window_s=duplicate_window_s
    )
    await ensure_streams(
        js,
        [spec for tenant in tenants for spec in subjects.tenant_streams(tenant)],
        replicas=replicas,
    )
    # Each runs consumer before the `ingress` consumer beside it stops taking requests.
    specs = consumers(tenants, dispatcher_lease_s=dispatcher_lease_s)
    for spec in sorted(specs, key=lambda s: s.durable != RUNS_DURABLE):
        if spec.durable == RUNS_DURABLE:
            await _ensure_runs_consumer(js, spec)
        else:
            await ensure_consumer(js, spec)
    for bucket in BUCKETS:
        await ensure_bucket(js, bucket, replicas=replicas)


async def provision_tenant(
    js: JetStreamContext, tenant: str, *, replicas: int | None = None
) -> None:
    """Create (or update) one tenant's streams and ingress's consumer on them, on a running
    deployment (`writ tenant add`). `replicas` defaults to those of Writ's own streams."""
    if replicas is None:
        info = await js.stream_info(subjects.STREAMS[0].name)
        replicas = info.config.num_replicas or 1
    await ensure_streams(js, subjects.tenant_streams(tenant), replicas=replicas)
    others, runs = host_consumers(tenant)
    await _ensure_runs_consumer(js, runs)
    await ensure_consumer(js, others)


async def _ensure_runs_consumer(js: JetStreamContext, spec: ConsumerSpec) -> None:
    """Create or update ingress's runs consumer on a tenant's host stream. Made where ingress's
    one consumer took every host message until now, it starts past what that one settled (its
    ack floor): the requests it had delivered and not settled are delivered here again
    (starting a run is idempotent on its request id), and none is lost or started twice.
    Made first, before `ingress` stops taking requests, so no request falls between them."""
    start: int | None = None
    try:
        made = await js.consumer_info(spec.stream, spec.durable)
    except NotFoundError:
        try:
            before = await js.consumer_info(spec.stream, "ingress")
        except NotFoundError:
            pass
        else:
            took = [*(before.config.filter_subjects or []), before.config.filter_subject]
            if spec.filter_subjects[0] in took:
                start = before.ack_floor.stream_seq + 1
    else:  # made so already: where it started cannot change
        start = made.config.opt_start_seq
    await ensure_consumer(js, spec, start_seq=start)


async def retire_tenant(js: JetStreamContext, tenant: str) -> list[str]:
    """Delete one tenant's streams (ingress's consumer with them), what they held included
    (`writ tenant remove`); the names of those that existed."""
    deleted = []
    for spec in subjects.tenant_streams(tenant):
        try:
            await js.delete_stream(spec.name)
        except NotFoundError:
            continue
        deleted.append(spec.name)
    return deleted
