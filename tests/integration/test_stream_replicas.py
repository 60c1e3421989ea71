"""WRIT_STREAM_REPLICAS reaches the declaration of Writ's streams (3 on a JetStream cluster)."""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import pytest
from nats.js.errors import APIError

from libs.embedded import EmbeddedNats
from libs.runtime import serve
from libs.settings import BaseSettings, load_settings

pytestmark = pytest.mark.anyio


async def _main(rt: Any, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    task_status.started()


async def test_a_single_server_refuses_three_replicas(private_nats: EmbeddedNats) -> None:
    settings = load_settings(BaseSettings, {"WRIT_NATS_URL": private_nats.url,
                                            "WRIT_STREAM_REPLICAS": "3"})
    assert settings.stream_replicas == 3
    # One nats-server cannot hold three replicas: that it refuses shows the number reached
    # the stream declaration (a cluster of three accepts it).
    with pytest.raises(APIError) as refused:
        await serve("replicas", settings, _main, description="test")
    assert refused.value.err_code == 10074, refused.value  # replicas > 1 not supported


async def test_the_idempotency_bucket_takes_the_replicas_setting_too(
        private_nats: EmbeddedNats) -> None:
    """Found by the soak's cluster topology: the HTTP door's Idempotency-Key bucket was one
    replica on a three-node cluster (nats-py's default for KV), whatever the setting said."""
    import nats

    from services.ingress.http._idempotency import BUCKET, Idempotency

    nc = await nats.connect(private_nats.url)
    try:
        js = nc.jetstream()
        with contextlib.suppress(Exception):
            await js.delete_key_value(BUCKET)
        with pytest.raises(APIError) as refused:
            await Idempotency.open(js, replicas=3)
        assert refused.value.err_code == 10074, refused.value
        await Idempotency.open(js)  # one replica: what a single server holds
        assert (await js.stream_info(f"KV_{BUCKET}")).config.num_replicas == 1
    finally:
        await nc.close()


async def test_the_console_bucket_takes_the_replicas_setting_too(
        private_nats: EmbeddedNats) -> None:
    """Found by the 60-minute cluster soak: the approval console's session bucket was one
    replica on a three-node cluster (streams 11 at [1, 3] replicas), so losing its node
    would sign every approver out and forget which sign-in links were used."""
    import nats

    from services.ingress.console._session import BUCKET, Sessions

    nc = await nats.connect(private_nats.url)
    try:
        js = nc.jetstream()
        with contextlib.suppress(Exception):
            await js.delete_key_value(BUCKET)
        with pytest.raises(APIError) as refused:
            await Sessions.open(js, None, replicas=3)  # type: ignore[arg-type]
        assert refused.value.err_code == 10074, refused.value
        await Sessions.open(js, None)  # type: ignore[arg-type]
        assert (await js.stream_info(f"KV_{BUCKET}")).config.num_replicas == 1
    finally:
        await nc.close()
