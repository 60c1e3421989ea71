"""A starved consumer is seen: `writ_consumer_stalled_seconds` rises, readiness says so, and the
actor loop binds its consumer again; deliveries end the stall (libs/stall.py).

The consumer is starved the way an operator (or a consumer leader that went away) would: it is
paused on the server, so pulls bring nothing while messages wait. The test uses `run_actor`'s
own bed (tests/integration/test_actor.py): a stream and a durable of its own on a real server.
"""

from __future__ import annotations

import pytest

from libs.actor import Delivery
from libs.health import Health
from tests.integration.test_actor import Bed, Note, bed, eventually, running

pytestmark = pytest.mark.anyio

__all__ = ["bed"]  # the fixture, imported to be used here


def stalled_seconds(b: Bed) -> float:
    value = b.registry.get_sample_value(
        "writ_consumer_stalled_seconds", {"service": f"t{b.unique}", "consumer": b.durable}
    )
    assert value is not None, "the stall gauge is exported from the start"
    return value


async def test_a_starved_consumer_is_reported_stalled_until_it_delivers(bed: Bed) -> None:
    handled: list[int] = []

    async def handler(d: Delivery[Note]) -> None:
        handled.append(d.message.n)

    health = Health(every_s=0.2)
    async with running(bed, handler, health=health, lag_every_s=0.2, stall_after_s=1.0):
        assert stalled_seconds(bed) == 0.0
        await bed.publish(1)
        await eventually(lambda: handled == [1])

        await bed.js.pause_consumer(bed.stream, bed.durable, "2099-01-01T00:00:00Z")
        await bed.publish(2)
        await bed.publish(3)
        # Two messages wait and none comes: the gauge rises, readiness names the consumer.
        await eventually(lambda: stalled_seconds(bed) >= 1.0, timeout=30)
        ok, checks = health.ready()
        assert not ok
        assert "stalled" in checks.get(f"consumer {bed.durable}", ""), checks
        assert handled == [1]

        await bed.js.resume_consumer(bed.stream, bed.durable)
        await eventually(lambda: sorted(handled) == [1, 2, 3], timeout=30)
        # Delivering again ends the stall: the gauge back to 0, readiness no longer names it.
        await eventually(lambda: stalled_seconds(bed) == 0.0, timeout=30)
        await eventually(lambda: f"consumer {bed.durable}" not in health.ready()[1], timeout=30)
