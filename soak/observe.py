"""Resources over the soak: each service instance's resident memory and open file descriptors
(from /proc), and PostgreSQL connections by role (pg_stat_activity), sampled every so often
so a leak shows as growth from the warm-up baseline to the end."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Final

import asyncpg
import httpx

from services.planner.service import pool_size
from writ.stack import Stack

RETRIEVAL_POOL: Final = 10  # libs.db.connect_pool's default, which retrieval keeps

__all__ = [
    "FD_SLACK",
    "PG_SLACK",
    "RSS_FACTOR",
    "RSS_SLACK_MB",
    "Observer",
    "dropped_requests",
    "within",
]

# The stated bounds: at the end, after everything settled, each instance's RSS is at most
# RSS_FACTOR x its warm-up value + RSS_SLACK_MB and it holds at most FD_SLACK more
# descriptors than after warm-up, plus its PostgreSQL pool's size; each role holds at most
# its pools' sizes (one pool per instance) plus PG_SLACK per instance (LISTEN and one-off
# connections): a connection outside a pool that is never closed is a leak past it. Pools
# open connections as bursts ask (after a PostgreSQL restart too), so "more than after
# warm-up" alone is no leak.
RSS_FACTOR: Final = 1.5
RSS_SLACK_MB: Final = 64.0
FD_SLACK: Final = 32
PG_SLACK: Final = 2
# Each service's pool size (its __main__'s `connect_pool(max_size=...)`).
POOL_MAX: Final = {
    "admission": 20,
    "dispatcher": 20,
    "governance": 20,
    "planner": pool_size(),
    "retrieval": RETRIEVAL_POOL,
}
# The journal's window-key pool beside it (`libs.journal.window_key_pool`, at most 2), in each
# service that keeps a journal: a full pool, its keys and the relay's LISTEN are 23
# connections of one admission, within its bound.
JOURNAL_KEY_POOL: Final = 2
JOURNALED: Final = frozenset({"admission", "dispatcher", "governance", "planner"})


def _proc(pid: int) -> tuple[float, int] | None:
    """(RSS in MiB, open descriptors) of a process, or None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024, fds
    return None


def _fd_kinds(pid: int) -> dict[str, int]:
    """What a process's descriptors are: sockets by the port they talk to (the listening port
    for a server's own socket), pipes, files; so a bound broken names what grew."""
    peers: dict[str, str] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            port = int(remote.rsplit(":", 1)[1], 16) or int(local.rsplit(":", 1)[1], 16)
            peers[inode] = f"tcp:{port}"
    kinds: dict[str, int] = {}
    links = []
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                links.append(os.readlink(fd))
            except OSError:  # closed since it was listed
                continue
    except OSError:
        return kinds
    for link in links:
        if link.startswith("socket:["):
            kind = peers.get(link[8:-1], "socket")
        elif link.startswith(("pipe:", "anon_inode:")):
            kind = link.split("[")[0]
        else:
            kind = "file"
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


class Observer:
    """Samples of every service instance and of Postgres connections."""

    def __init__(self, stack: Stack, instances: list[str]) -> None:
        self.stack, self.instances = stack, instances
        self.samples: list[dict[str, Any]] = []
        self.baseline: dict[str, Any] | None = None

    async def sample(self, label: str = "") -> dict[str, Any]:
        """One sample (kept in `samples`)."""
        procs: dict[str, dict[str, Any]] = {}
        for key in self.instances:
            proc = self.stack.procs.get(key)
            if proc is None or proc.poll() is not None:
                continue
            found = _proc(proc.pid)
            if found is not None:
                procs[key] = {
                    "rss_mb": round(found[0], 1),
                    "fds": found[1],
                    "pid": proc.pid,
                    "fd_kinds": _fd_kinds(proc.pid),
                }
        connections: dict[str, int] = {}
        try:
            conn = await asyncpg.connect(self.stack.database_dsn, timeout=5)
            try:
                for row in await conn.fetch(
                    "SELECT usename, count(*) AS n FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "GROUP BY usename"
                ):
                    connections[str(row["usename"])] = int(row["n"])
            finally:
                await conn.close()
        except (OSError, asyncpg.PostgresError) as exc:
            connections = {"error": repr(exc)[:200]}  # type: ignore[dict-item]
        sample = {
            "t": round(time.monotonic(), 1),
            "label": label,
            "processes": procs,
            "pg_connections": connections,
        }
        self.samples.append(sample)
        return sample

    async def take_baseline(self) -> None:
        self.baseline = await self.sample("warm-up")

    def settled_baseline(self, until: float) -> dict[str, Any]:
        """The warm-up baseline: each figure's highest value from the end of the warm-up
        until `until` (pools open their connections as load asks for them, so the first
        minutes under load are part of the warm-up; a leak grows after them)."""
        assert self.baseline is not None
        window = [s for s in self.samples if self.baseline["t"] <= s["t"] <= until]
        out: dict[str, Any] = {
            "t": self.baseline["t"],
            "label": "warm-up",
            "processes": {},
            "pg_connections": {},
        }
        for sample in window:
            for key, proc in sample["processes"].items():
                best = out["processes"].setdefault(key, dict(proc))
                best["rss_mb"] = max(best["rss_mb"], proc["rss_mb"])
                best["fds"] = max(best["fds"], proc["fds"])
            for role, n in sample["pg_connections"].items():
                if isinstance(n, int):
                    out["pg_connections"][role] = max(out["pg_connections"].get(role, 0), n)
        return out


def ceiling(role: str, instances: dict[str, str]) -> int | None:
    """The most connections the Postgres role `<database>_<service>` may hold."""
    service = role.rsplit("_", 1)[-1]
    if service not in POOL_MAX:
        return None
    count = sum(1 for s in instances.values() if s == service)
    keys = JOURNAL_KEY_POOL if service in JOURNALED else 0
    return count * (POOL_MAX[service] + keys + PG_SLACK) if count else None


def within(
    baseline: dict[str, Any], end: dict[str, Any], instances: dict[str, str] | None = None
) -> list[str]:
    """What grew past the stated bounds from `baseline` to `end` (empty: nothing)."""
    broken = []
    for key, start in baseline["processes"].items():
        last = end["processes"].get(key)
        if last is None:
            broken.append(f"{key} is not running at the end")
            continue
        if last["rss_mb"] > RSS_FACTOR * start["rss_mb"] + RSS_SLACK_MB:
            broken.append(
                f"{key} RSS {start['rss_mb']} MiB after warm-up, {last['rss_mb']} "
                f"at the end (bound {RSS_FACTOR}x + {RSS_SLACK_MB:.0f} MiB)"
            )
        # A pool's connections are descriptors too, opened as bursts ask (the backlog after a
        # NATS node fault asks for more than the warm-up did): up to the pool's size is no leak.
        most_fds = start["fds"] + FD_SLACK + POOL_MAX.get((instances or {}).get(key, key), 0)
        if last["fds"] > most_fds:
            before, after = start.get("fd_kinds", {}), last.get("fd_kinds", {})
            grew = sorted(
                ((n - before.get(kind, 0), kind) for kind, n in after.items()), reverse=True
            )
            what = ", ".join(f"+{d} {kind}" for d, kind in grew if d > 0)
            broken.append(
                f"{key} fds {start['fds']} after warm-up, {last['fds']} at the end "
                f"(bound {most_fds}: + {FD_SLACK} + its PostgreSQL pool): {what}"
            )
    for role, count in end["pg_connections"].items():
        most = ceiling(role, instances or {})
        if isinstance(count, int) and most is not None and count > most:
            broken.append(
                f"Postgres connections of {role}: {count} at the end, more than its "
                f"pools hold ({most})"
            )
    return broken


def dropped_requests(stack: Stack, instances: list[str]) -> dict[str, dict[str, float]]:
    """Requests each instance's endpoints dropped unhandled (`libs.runtime`: past their
    caller's deadline, or shed off a full queue), by `endpoint/reason`, since the instance
    last started: evidence of a service that fell behind, not an invariant."""
    out: dict[str, dict[str, float]] = {}
    for key in instances:
        try:
            text = httpx.get(f"http://127.0.0.1:{stack.metrics_port(key)}/metrics", timeout=5).text
        except Exception:  # noqa: BLE001 - gone or not answering: nothing to report
            continue
        for line in text.splitlines():
            if "_requests_dropped_total{" in line and not line.startswith("#"):
                labels, value = line.rsplit(" ", 1)
                fields = dict(
                    part.split("=", 1) for part in labels.split("{", 1)[1].rstrip("}").split(",")
                )
                name = f"{fields['endpoint'].strip(chr(34))}/{fields['reason'].strip(chr(34))}"
                if float(value):  # every endpoint exports both reasons from 0
                    out.setdefault(key, {})[name] = float(value)
    return out
