"""Federation reads: what an `mcp:` read through Writ adds over calling the host's MCP tool
directly (p50 / p99), one read at a time.

Direct: the official SDK opens a session with the fake host (`fakes/host/`) and calls
`ticket.get`, as retrieval itself does for each read. Through Writ: a `ReadCapability` on
`writ.int.retrieval.read`, so the same session and call plus retrieval's checks (registration,
the classified schema, the breaker, the listing — recorded by governance whenever it is taken,
every 30 s by default), governance's `decide` and the bounded result.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
import nats

from schemas import subjects
from schemas.retrieval import ReadCapability, ReadRefused, ReadResult
from services.retrieval.mcp.client import McpClient, McpSession
from services.retrieval.mcp.servers import ServerConfig
from writ import mcp

if TYPE_CHECKING:
    from bench.phases import Bench

__all__ = ["mcp_read"]

READS = 200


def _ms(samples: list[float], q: int) -> float:
    return round(statistics.quantiles(samples, n=100, method="inclusive")[q - 1] * 1000, 2)


async def _timed(op: Callable[[], Awaitable[bool]], n: int) -> list[float]:
    for _ in range(max(n // 10, 5)):  # warm-up
        await op()
    took = []
    for _ in range(n):
        started = time.perf_counter()
        if not await op():
            raise RuntimeError("a read failed")
        took.append(time.perf_counter() - started)
    return took


async def mcp_read(bench: Bench) -> None:
    """p50/p99 of the direct MCP call and of the same read through Writ, and the difference."""
    from bench.phases import _s

    r, data, stack = bench.report, bench.report.data, bench.stack
    r.section("Federation: an mcp: read through Writ vs the host's MCP tool called directly")
    listing = await mcp.list_server(stack.nats_url, "acme", "helpdesk", quiet=True)
    if not listing.ok:
        raise RuntimeError(f"the host's MCP server: {listing.error}")
    await mcp.classify(
        stack.nats_url, "acme", "helpdesk", "ticket.get", "read", "bench", quiet=True
    )
    server = ServerConfig(
        url=f"{stack.host_url}/mcp", credential_file=str(stack.secrets / "host-mcp.token")
    )
    client = McpClient()

    async def direct() -> bool:
        async def call(session: McpSession) -> Any:
            return await session.call_tool("ticket.get", {"ticket_id": "T-1001"})

        return not (await client.session(server, call)).is_error

    nc = await nats.connect(stack.nats_url, name="bench-mcp")
    decoder = msgspec.json.Decoder(ReadResult | ReadRefused)

    async def through_writ() -> bool:
        ask = ReadCapability(
            tenant="acme",
            run_id=f"bench-{uuid.uuid4().hex[:12]}",
            principal="bench@acme.example",
            agent="helpdesk-reader",
            tool="mcp:helpdesk/ticket.get",
            arguments={"ticket_id": "T-1001"},
        )
        reply = await nc.request(subjects.READ, msgspec.json.encode(ask), timeout=30)
        return isinstance(decoder.decode(reply.data), ReadResult)

    n = max(int(READS * _s(1.0)), 20)
    try:
        plain = await _timed(direct, n)
        writ = await _timed(through_writ, n)
    finally:
        await nc.close()
    figures = {
        "reads": n,
        "direct_p50_ms": _ms(plain, 50),
        "direct_p99_ms": _ms(plain, 99),
        "writ_p50_ms": _ms(writ, 50),
        "writ_p99_ms": _ms(writ, 99),
    }
    figures["added_p50_ms"] = round(figures["writ_p50_ms"] - figures["direct_p50_ms"], 2)
    figures["added_p99_ms"] = round(figures["writ_p99_ms"] - figures["direct_p99_ms"], 2)
    data["mcp_read"] = figures
    r.line(
        "direct MCP call",
        f"p50 {figures['direct_p50_ms']} ms, "
        f"p99 {figures['direct_p99_ms']} ms ({n} reads, one at a time)",
    )
    r.line("through Writ", f"p50 {figures['writ_p50_ms']} ms, p99 {figures['writ_p99_ms']} ms")
    r.line("added by Writ", f"p50 {figures['added_p50_ms']} ms, p99 {figures['added_p99_ms']} ms")
