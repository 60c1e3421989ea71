"""WRIT_STREAM_REPLICAS reaches provisioning: every stream and bucket Writ has (3 on a
JetStream cluster)."""

from __future__ import annotations

import contextlib

import nats
import pytest
from nats.js.api import KeyValueConfig
from nats.js.errors import APIError

from libs.embedded import EmbeddedNats
from libs.provision import CONSOLE_BUCKET, IDEMPOTENCY_BUCKET, ensure_bucket, provision_bus

pytestmark = pytest.mark.anyio


async def test_a_single_server_refuses_three_replicas(private_nats: EmbeddedNats) -> None:
    nc = await nats.connect(private_nats.url)
    try:
        # One nats-server cannot hold three replicas: that it refuses shows the number reached
        # the stream declaration (a cluster of three accepts it).
        with pytest.raises(APIError) as refused:
            await provision_bus(nc.jetstream(), [], replicas=3)
        assert refused.value.err_code == 10074, refused.value  # replicas > 1 not supported
    finally:
        await nc.close()


@pytest.mark.parametrize(
    "bucket",
    [
        # The soak's cluster topology found the HTTP door's Idempotency-Key bucket at one replica
        # on a three-node cluster (nats-py's default for KV), whatever the setting said; then the
        # 60-minute cluster soak found the approval console's session bucket the same (streams 11
        # at [1, 3] replicas): losing its node would sign every approver out and forget which
        # sign-in links were used.
        IDEMPOTENCY_BUCKET,
        CONSOLE_BUCKET,
    ],
    ids=["idempotency", "console"],
)
async def test_the_buckets_take_the_replicas_setting_too(
    private_nats: EmbeddedNats, bucket: KeyValueConfig
) -> None:
    nc = await nats.connect(private_nats.url)
    try:
        js = nc.jetstream()
        with contextlib.suppress(Exception):
            await js.delete_key_value(bucket.bucket)
        with pytest.raises(APIError) as refused:
            await ensure_bucket(js, bucket, replicas=3)
        assert refused.value.err_code == 10074, refused.value
        await ensure_bucket(js, bucket, replicas=1)  # one replica: what a single server holds
        assert (await js.stream_info(f"KV_{bucket.bucket}")).config.num_replicas == 1
    finally:
        await nc.close()
