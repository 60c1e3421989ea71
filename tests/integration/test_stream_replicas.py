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
    settings = load_settings(
        BaseSettings, {"WRIT_NATS_URL": private_nats.url, "WRIT_STREAM_REPLICAS": "3"}
    )
    assert settings.stream_replicas == 3
    # One nats-server cannot hold three replicas: that it refuses shows the number reached
    # the stream declaration (a cluster of three accepts it).
    with pytest.raises(APIError) as refused:
        await serve("replicas", settings, _main, description="test")
    assert refused.value.err_code == 10074, refused.value  # replicas > 1 not supported


def _idempotency(js: Any, replicas: int) -> Any:
    from services.ingress.http._idempotency import Idempotency

    return Idempotency.open(js, replicas=replicas)


def _console(js: Any, replicas: int) -> Any:
    from services.ingress.console._session import Sessions

    return Sessions.open(js, None, replicas=replicas)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bucket", "open_"),
    [
        # The soak's cluster topology found the HTTP door's Idempotency-Key bucket at one replica
        # on a three-node cluster (nats-py's default for KV), whatever the setting said; then the
        # 60-minute cluster soak found the approval console's session bucket the same (streams 11
        # at [1, 3] replicas): losing its node would sign every approver out and forget which
        # sign-in links were used.
        ("WRIT_IDEMPOTENCY", _idempotency),
        ("WRIT_CONSOLE", _console),
    ],
    ids=["idempotency", "console"],
)
async def test_the_buckets_take_the_replicas_setting_too(
    private_nats: EmbeddedNats, bucket: str, open_: Any
) -> None:
    import nats

    nc = await nats.connect(private_nats.url)
    try:
        js = nc.jetstream()
        with contextlib.suppress(Exception):
            await js.delete_key_value(bucket)
        with pytest.raises(APIError) as refused:
            await open_(js, 3)
        assert refused.value.err_code == 10074, refused.value
        await open_(js, 1)  # one replica: what a single server holds
        assert (await js.stream_info(f"KV_{bucket}")).config.num_replicas == 1
    finally:
        await nc.close()
