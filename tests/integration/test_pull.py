"""`Puller` against a real nats-server: each pull request on its own reply subject, so a request
left behind (or a late status of one) never holds a message nor ends the fetch under way.

The orphan is made by hand, as nats-py's `fetch` leaves one: a lingering request (no
`no_wait`) on the puller's inbox, and a 408 for an earlier request arriving late.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig

from libs.pull import Puller, PullError

pytestmark = pytest.mark.anyio


@pytest.fixture
async def puller(nc: Client, unique: str) -> AsyncIterator[Puller]:
    js = nc.jetstream()
    await js.add_stream(name=f"P_{unique}", subjects=[f"p.{unique}.>"])
    await js.add_consumer(
        f"P_{unique}",
        ConsumerConfig(
            durable_name="d", ack_policy=AckPolicy.EXPLICIT, filter_subject=f"p.{unique}.a"
        ),
    )
    puller = Puller(nc, f"P_{unique}", "d")
    await puller.start()
    yield puller
    await puller.stop()
    await js.delete_stream(f"P_{unique}")


async def _publish_soon(nc: Client, subject: str, data: bytes, delay: float = 0.2) -> None:
    await anyio.sleep(delay)
    await nc.jetstream().publish(subject, data)


async def test_a_message_taken_by_a_request_left_behind_is_handed_over_at_once(
    nc: Client, puller: Puller, unique: str
) -> None:
    # A lingering request (no no_wait, 30 s) left on the puller's inbox: the server gives it
    # the next message and does not end it. nats-py's fetch would wait for the rest of its
    # batch until that request expired; the puller returns the message with its own 404 / 408
    # or a moment after (fail_after: far longer than that, far shorter than either expiry).
    orphan = {"batch": 64, "expires": 30_000_000_000}
    await nc.publish(
        f"$JS.API.CONSUMER.MSG.NEXT.P_{unique}.d",
        json.dumps(orphan).encode(),
        reply=f"{puller._prefix}.orphan",
    )
    await nc.flush()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_publish_soon, nc, f"p.{unique}.a", b"one")
        with anyio.fail_after(5):
            msgs = await puller.fetch(64, timeout=20)
    assert [m.data for m in msgs] == [b"one"]
    await msgs[0].ack_sync()
    # The orphan still stands: the next message goes to it, and the next fetch takes it.
    async with anyio.create_task_group() as tg:
        tg.start_soon(_publish_soon, nc, f"p.{unique}.a", b"two")
        with anyio.fail_after(5):
            msgs = await puller.fetch(64, timeout=20)
    assert [m.data for m in msgs] == [b"two"]
    assert msgs[0].metadata.num_delivered == 1


async def test_a_late_status_of_an_earlier_request_does_not_end_this_fetch(
    nc: Client, puller: Puller, unique: str
) -> None:
    with anyio.fail_after(5):
        assert await puller.fetch(8, timeout=0.3) == []  # request 1 ends with its 408
    async with anyio.create_task_group() as tg:
        # Request 2 is waiting when a 408 comes for request 1 (as a late one does): ignored.
        async def late_status() -> None:
            await anyio.sleep(0.1)
            await nc.publish(
                f"{puller._prefix}.1",
                b"",
                headers={"Status": "408", "Description": "Request Timeout"},
            )

        tg.start_soon(late_status)
        tg.start_soon(_publish_soon, nc, f"p.{unique}.a", b"after", 0.4)
        with anyio.fail_after(5):
            msgs = await puller.fetch(8, timeout=10)
    assert [m.data for m in msgs] == [b"after"]


async def test_a_delivery_whose_headers_say_status_is_still_a_delivery(
    nc: Client, puller: Puller, unique: str
) -> None:
    # A publisher's headers travel with the message: one saying "Status: 404" must not pass
    # for the server's end of the request (it would be dropped, unacked, forever).
    await nc.jetstream().publish(f"p.{unique}.a", b"tricky", headers={"Status": "404"})
    with anyio.fail_after(5):
        msgs = await puller.fetch(8, timeout=5)
    assert [m.data for m in msgs] == [b"tricky"]


async def test_messages_already_waiting_come_in_one_batch_bounded_by_its_size(
    nc: Client, puller: Puller, unique: str
) -> None:
    js = nc.jetstream()
    for i in range(5):
        await js.publish(f"p.{unique}.a", str(i).encode())
    await js.publish(f"p.{unique}.b", b"not this consumer's")
    first = await puller.fetch(3, timeout=5)
    rest = await puller.fetch(10, timeout=5)
    assert [m.data for m in first] == [b"0", b"1", b"2"]
    assert [m.data for m in rest] == [b"3", b"4"]
    assert await puller.fetch(10, timeout=0.3) == []  # nothing left: its 408, no error


async def test_an_idle_fetch_ends_empty_and_a_refused_request_raises(
    nc: Client, puller: Puller, unique: str
) -> None:
    assert await puller.fetch(4, timeout=0.3) == []
    await nc.jetstream().delete_consumer(f"P_{unique}", "d")
    # No consumer answers the request any more: the server says so (503), and the actor
    # loop, seeing an error, waits before asking again instead of asking in a tight loop.
    with pytest.raises(PullError, match="503"), anyio.fail_after(5):
        await puller.fetch(4, timeout=0.5)
