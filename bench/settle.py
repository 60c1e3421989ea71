"""Waiting for the deployment to go idle between measurements."""

from __future__ import annotations

import time

import anyio
from nats.aio.client import Client

__all__ = ["settle"]


async def settle(nc: Client, *, timeout: float = 60.0) -> dict[str, object]:
    """Wait until no Writ consumer has messages pending or awaiting an ack.

    A closed loop ends when its own operations have completed, but a service may still hold a
    backlog the bench does not wait for (admission and the planner also consume every
    outcome): that work would otherwise be charged to the next measurement. Returns how long
    it took, and what was still pending if the timeout came first.
    """
    js = nc.jetstream()
    started = time.monotonic()
    busy: dict[str, int] = {}
    while time.monotonic() - started < timeout:
        busy = {}
        for stream in await js.streams_info():
            if not stream.config.name or not stream.config.name.startswith("WRIT_"):
                continue
            for consumer in await js.consumers_info(stream.config.name):
                waiting = (consumer.num_pending or 0) + (consumer.num_ack_pending or 0)
                if waiting:
                    busy[f"{stream.config.name}/{consumer.name}"] = waiting
        if not busy:
            break
        await anyio.sleep(0.2)
    return {"seconds": round(time.monotonic() - started, 2), "still_pending": busy}
