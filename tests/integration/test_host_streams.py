"""Each tenant's own host and result streams, on a real server."""

from __future__ import annotations

from pathlib import Path

import nats
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js.api import StreamConfig

from libs.bus import ensure_streams
from libs.embedded import EmbeddedNats
from schemas import subjects
from writ.stack import Stack

pytestmark = pytest.mark.anyio


async def test_one_tenants_message_id_is_not_anothers_duplicate(private_nc: Client) -> None:
    js = private_nc.jetstream()
    await ensure_streams(js, [*subjects.tenant_streams("t-one"), *subjects.tenant_streams("t-two")])
    first = await js.publish(subjects.request("t-one"), b"{}", headers={"Nats-Msg-Id": "X"})
    other = await js.publish(subjects.request("t-two"), b"{}", headers={"Nats-Msg-Id": "X"})
    again = await js.publish(subjects.request("t-one"), b"{}", headers={"Nats-Msg-Id": "X"})
    assert (bool(first.duplicate), bool(other.duplicate), again.duplicate) == (False, False, True)
    assert (first.stream, other.stream) == ("WRIT_IN_t-one", "WRIT_IN_t-two")


async def test_only_known_kinds_of_known_tenants_are_stored(private_nc: Client) -> None:
    js = private_nc.jetstream()
    await ensure_streams(js, subjects.tenant_streams("t-one"))
    for subject in (
        "writ.in.requests.t-one.more",
        "writ.in.other.t-one",
        "writ.in.requests.t-nobody",
        "writ.out.results.t-nobody",
    ):
        with pytest.raises((nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError)):
            await js.publish(subject, b"{}", timeout=2)


async def test_an_old_deployments_shared_host_streams_are_retired(
    private_nats: EmbeddedNats, private_nc: Client, tmp_path: Path
) -> None:
    js = private_nc.jetstream()
    for name in ("t-one", "t-two"):
        for spec in subjects.tenant_streams(name):
            try:
                await js.delete_stream(spec.name)
            except nats.js.errors.NotFoundError:
                pass
    await js.add_stream(StreamConfig(name="WRIT_IN", subjects=["writ.in.>"]))
    await js.add_stream(StreamConfig(name="WRIT_OUT", subjects=["writ.out.>"]))
    stack = Stack(tmp_path, nats_url=private_nats.url, admin_dsn="postgresql://unused")
    await stack._retire_shared_host_streams()  # noqa: SLF001 - the step `provision` runs first
    names = {info.config.name for info in await js.streams_info()}
    assert not names & {"WRIT_IN", "WRIT_OUT"}
    await ensure_streams(js, subjects.tenant_streams("t-one"))  # no overlap any more
