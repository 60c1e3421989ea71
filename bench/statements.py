"""`python -m bench.statements [runs] [agent] [in flight]`: Postgres statements per run, by role.

A count, not a timing: it does not drift with the machine (docs/benchmarks.md), so it says
whether a change removed round trips even where CPU figures cannot. It starts a deployment,
warms it with a few runs, turns on `log_statement=all` (with the role in each line's prefix),
plays `runs` runs of `agent` (default 300 of `crm-assistant`, 32 in flight) and prints each
role's statements per run, most frequent first (BEGIN and COMMIT included: each is a round
trip). The sealers' statements are in their service's role and fall per run as the load rises.
"""

from __future__ import annotations

import collections
import re
import sys
import tempfile
from pathlib import Path

import anyio
import asyncpg

from bench.runs import RunPath
from writ.stack import Stack

_LINE = re.compile(r"^(\w*)\|LOG:  (?:statement|execute [^:]*): (.*)")


async def _count(stack: Stack, runs: int, agent: str, in_flight: int) -> str:
    assert stack.embedded_pg is not None
    host = await stack.host_connection("acme")
    path = RunPath(stack, host, agent)
    await path.start()
    admin = await asyncpg.connect(stack.admin_dsn)
    log = stack.embedded_pg.data_dir / "postgres.log"
    try:
        for _ in range(5):
            await path.one()
        await admin.execute("ALTER SYSTEM SET log_statement = 'all'")
        await admin.execute("ALTER SYSTEM SET log_line_prefix = '%u|'")
        await admin.execute("SELECT pg_reload_conf()")
        await anyio.sleep(1)
        start = log.stat().st_size
        failed = await path.many(runs, in_flight)
        await anyio.sleep(2)  # the runs' settlements and the sealers' rounds after them
        await admin.execute("ALTER SYSTEM RESET log_statement")
        await admin.execute("ALTER SYSTEM RESET log_line_prefix")
        await admin.execute("SELECT pg_reload_conf()")
        text = log.read_bytes()[start:].decode(errors="replace")
    finally:
        await admin.close()
        await path.stop()
        await host.close()
    by_role: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in text.splitlines():
        if (m := _LINE.match(line)) is not None:
            by_role[m[1]][m[2][:100] or "(a statement on several lines)"] += 1
    out = [f"{runs} runs of {agent}, {in_flight} in flight ({failed} failed)"]
    total = 0.0
    for role, statements in sorted(by_role.items(), key=lambda kv: -kv[1].total()):
        if role == "postgres":
            continue  # this script's own
        total += statements.total() / runs
        out.append(f"{role}: {statements.total() / runs:.1f} statements per run")
        out.extend(
            f"  {n / runs:5.1f}  {sql}" for sql, n in statements.most_common(12) if n / runs >= 0.05
        )
    out.append(f"all services: {total:.1f} statements per run")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 300
    agent = argv[1] if len(argv) > 1 else "crm-assistant"
    in_flight = int(argv[2]) if len(argv) > 2 else 32
    stack = Stack(Path(tempfile.mkdtemp(prefix="writ-statements-")))
    try:
        stack.start_all()
        print(anyio.run(_count, stack, runs, agent, in_flight))
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
