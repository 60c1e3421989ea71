"""`python -m bench.messages [runs] [agent] [in flight]`: NATS messages per run, by connection.

A count, not a timing, like `bench.statements`: the drift that moves CPU figures on a shared machine
(docs/benchmarks.md) cannot move it. It starts a deployment whose nats-server serves its
monitoring endpoint, warms it with a few runs, reads every connection's counters from `/connz`,
plays `runs` runs of `agent` (default 200 of `crm-assistant`, 32 in flight; 1 in flight shows
what a lone run costs), reads them again and prints, per service, the messages it sent to the
server (`in`: publishes, requests, replies, pull requests, acks) and the messages the server
delivered to it (`out`), per run. Every message is a loopback send and a wake-up on each side;
the server's own total is the sum of both columns.
"""

from __future__ import annotations

import collections
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx

from bench.runs import RunPath
from libs.embedded import EmbeddedNats, free_port
from writ.stack import Stack


def _factory(port: int) -> Callable[..., EmbeddedNats]:
    """Embedded nats-servers that serve their monitoring endpoint on `port`."""

    def build(data_dir: Path, **kwargs: Any) -> EmbeddedNats:
        return EmbeddedNats(data_dir, extra_conf=f'http: "127.0.0.1:{port}"\n', **kwargs)

    return build


async def _connections(client: httpx.AsyncClient, port: int) -> dict[str, tuple[int, int]]:
    """(messages in, messages out) of every open connection, summed by its name's service."""
    response = await client.get(f"http://127.0.0.1:{port}/connz", params={"limit": 1024})
    response.raise_for_status()
    found: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for conn in response.json()["connections"]:
        name = (conn.get("name") or "host (bench)").removeprefix("writ-")
        found[name][0] += conn["in_msgs"]
        found[name][1] += conn["out_msgs"]
    return {name: (sent, got) for name, (sent, got) in found.items()}


async def _count(stack: Stack, port: int, runs: int, agent: str, in_flight: int) -> str:
    host = await stack.host_connection("acme")
    path = RunPath(stack, host, agent)
    await path.start()
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            for _ in range(5):
                await path.one()
            await anyio.sleep(2)  # the warm-up's settlements and sealer rounds
            before = await _connections(client, port)
            failed = await path.many(runs, in_flight)
            await anyio.sleep(2)
            after = await _connections(client, port)
    finally:
        await path.stop()
        await host.close()
    out = [
        f"{runs} runs of {agent}, {in_flight} in flight ({failed} failed); "
        "messages per run, sent to / delivered by the server"
    ]
    total_in = total_out = 0.0
    rows = []
    for name, (sent, got) in after.items():
        was = before.get(name, (0, 0))
        d_in, d_out = (sent - was[0]) / runs, (got - was[1]) / runs
        total_in, total_out = total_in + d_in, total_out + d_out
        rows.append((d_in + d_out, name, d_in, d_out))
    for _, name, d_in, d_out in sorted(rows, reverse=True):
        out.append(f"  {name:<12} in {d_in:6.1f}  out {d_out:6.1f}")
    out.append(
        f"  {'all':<12} in {total_in:6.1f}  out {total_out:6.1f}  "
        f"(through the server: {total_in + total_out:.1f})"
    )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 200
    agent = argv[1] if len(argv) > 1 else "crm-assistant"
    in_flight = int(argv[2]) if len(argv) > 2 else 32
    port = free_port()
    stack = Stack(Path(tempfile.mkdtemp(prefix="writ-messages-")), nats_factory=_factory(port))
    try:
        stack.start_all()
        print(anyio.run(_count, stack, port, runs, agent, in_flight))
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
