"""Where time goes during a window: CPU per process (from /proc) and handler time (/metrics)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import nats
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Counters", "Processes", "Window"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")
# Titles of Postgres's own processes, as opposed to client backends.
_PG_AUX = (
    "checkpointer",
    "walwriter",
    "background",
    "autovacuum",
    "logical",
    "walsummarizer",
    "io",
    "startup",
    "archiver",
    "wal",
)


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, own CPU ticks, CPU ticks of its exited and reaped children), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces or parentheses: fields start after its last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def _machine() -> list[int]:
    """The machine's CPU ticks by state: user nice system idle iowait irq softirq steal."""
    return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def _machine_percent(before: list[int], after: list[int]) -> dict[str, float]:
    """Share of all cores' time: busy, iowait, steal (taken by other guests), idle."""
    delta = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(delta) or 1
    user, nice, system, idle, iowait, irq, softirq, steal = delta
    return {
        "busy_pct": round(100 * (user + nice + system + irq + softirq) / total, 1),
        "iowait_pct": round(100 * iowait / total, 1),
        "steal_pct": round(100 * steal / total, 1),
        "idle_pct": round(100 * idle / total, 1),
    }


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


class Processes:
    """Names every process this bench started: itself, each service, NATS, Postgres by role."""

    def __init__(self, *, services: dict[int, str], database: str) -> None:
        self._services = services
        self._role_prefix = f"{database}_"

    def _label(self, pid: int) -> str:
        # Not cached: Postgres backends come and go, and a pid may be reused by another role.
        if pid == os.getpid():
            return "bench"
        if pid in self._services:
            return self._services[pid]
        return self._classify(_cmdline(pid))

    def _classify(self, cmdline: str) -> str:
        if "-m bench." in cmdline:
            return cmdline.split("-m ", 1)[1].split()[0]  # a helper process of the bench
        if "nats-server" in cmdline:
            return "nats-server"
        if cmdline.startswith("postgres: "):
            words = cmdline[len("postgres: ") :].split()
            # A client backend's title is "postgres: <user> <database> <host(port)> <activity>".
            if len(words) >= 3 and words[0] not in _PG_AUX and "(" in words[2]:
                user = words[0]
                if user.startswith(self._role_prefix):
                    return f"pg:{user[len(self._role_prefix) :]}"
                return "pg:admin" if user == "postgres" else f"pg:{user}"
            return "pg:server"
        if "postgres" in cmdline:
            return "pg:server"  # the postmaster
        return "other"

    def snapshot(self) -> dict[int, tuple[str, int, int]]:
        """(label, own ticks, reaped children's ticks) of this process and its descendants."""
        parents: dict[int, int] = {}
        ticks: dict[int, tuple[int, int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                found = _stat(int(entry))
                if found is not None:
                    parents[int(entry)] = found[0]
                    ticks[int(entry)] = found[1:]
        children: dict[int, list[int]] = {}
        for pid, parent in parents.items():
            children.setdefault(parent, []).append(pid)
        result: dict[int, tuple[str, int, int]] = {}
        todo = [os.getpid()]
        while todo:
            pid = todo.pop()
            result[pid] = (self._label(pid), *ticks[pid])
            todo.extend(children.get(pid, ()))
        return result

    @staticmethod
    def cpu_percent(
        before: dict[int, tuple[str, int, int]],
        after: dict[int, tuple[str, int, int]],
        seconds: float,
    ) -> dict[str, float]:
        """Percent of one core used by each label between two snapshots, busiest first.

        A process that exits inside the window takes its ticks with it; its parent's count of
        reaped children's ticks gets them back, under "<parent>:exited" ("pg:exited" for the
        postmaster's: autovacuum workers and backends whose connection closed).
        """
        used: dict[str, int] = {}
        for pid, (label, own, reaped) in after.items():
            # A process born inside the window spent all its ticks inside it.
            own0, reaped0 = before[pid][1:] if pid in before else (0, 0)
            used[label] = used.get(label, 0) + own - own0
            if reaped > reaped0:
                # For the postmaster: autovacuum workers and closed connections.
                gone = "pg:exited" if label == "pg:server" else f"{label}:exited"
                used[gone] = used.get(gone, 0) + reaped - reaped0
        pct = {label: 100.0 * t / _CLK_TCK / seconds for label, t in used.items()}
        return dict(sorted(pct.items(), key=lambda kv: -kv[1]))


async def _scrape(
    client: httpx.AsyncClient, ports: dict[str, int]
) -> dict[str, tuple[float, float]]:
    """(count, sum of seconds) of each service's handler histogram, keyed service/consumer."""
    found: dict[str, tuple[float, float]] = {}
    for service, port in ports.items():
        try:
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        except httpx.HTTPError:
            continue
        for family in text_string_to_metric_families(text):
            if family.name != "writ_handler_seconds":
                continue
            parts: dict[str, dict[str, float]] = {}
            for sample in family.samples:
                kind = sample.name.rsplit("_", 1)[-1]
                if sample.labels.get("service") != service:
                    continue
                if kind in ("count", "sum"):
                    parts.setdefault(sample.labels["consumer"], {})[kind] = sample.value
            for consumer, values in parts.items():
                found[f"{service}/{consumer}"] = (values.get("count", 0.0), values.get("sum", 0.0))
    return found


class Counters:
    """Work done deployment-wide: Postgres transactions, messages stored in each Writ stream."""

    def __init__(self, *, database_dsn: str, nats_url: str) -> None:
        self._dsn, self._nats_url = database_dsn, nats_url

    async def read(self) -> dict[str, int]:
        """The counters now.

        Postgres backends publish their statistics at most once a second (every ten when idle),
        so transaction counts over a window are right to within about a second's worth.
        """
        conn = await asyncpg.connect(self._dsn)
        try:
            found = {
                "pg_transactions": int(
                    await conn.fetchval(
                        "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                        "WHERE datname = current_database()"
                    )
                )
            }
        finally:
            await conn.close()
        nc = await nats.connect(self._nats_url, name="bench-counters")
        try:
            for stream in await nc.jetstream().streams_info():
                name = stream.config.name or ""
                if name.startswith("WRIT_"):
                    found[f"js:{name}"] = int(stream.state.last_seq)
        finally:
            await nc.close()
        return found


class Window:
    """CPU of each process and handler time of each service between `begin()` and `end()`."""

    def __init__(
        self,
        processes: Processes,
        metrics_ports: dict[str, int] | None = None,
        counters: Counters | None = None,
    ) -> None:
        self._processes = processes
        self._ports = metrics_ports or {}
        self._counters = counters
        self._counts_before: dict[str, int] = {}
        self._counts_after: dict[str, int] = {}
        self._client = httpx.AsyncClient(timeout=5)
        self._started = self._ended = 0.0
        self._cpu_before: dict[int, tuple[str, int, int]] = {}
        self._cpu_after: dict[int, tuple[str, int, int]] = {}
        self._machine_before: list[int] = []
        self._machine_after: list[int] = []
        self._handlers_before: dict[str, tuple[float, float]] = {}
        self._handlers_after: dict[str, tuple[float, float]] = {}

    async def begin(self) -> None:
        """Take the first readings."""
        self._handlers_before = await _scrape(self._client, self._ports)
        if self._counters is not None:
            self._counts_before = await self._counters.read()
        self._cpu_before = self._processes.snapshot()
        self._machine_before = _machine()
        self._started = time.monotonic()

    async def end(self) -> None:
        """Take the last readings."""
        self._cpu_after = self._processes.snapshot()
        self._machine_after = _machine()
        self._ended = time.monotonic()
        self._handlers_after = await _scrape(self._client, self._ports)
        if self._counters is not None:
            self._counts_after = await self._counters.read()
        await self._client.aclose()

    def report(self) -> dict[str, Any]:
        """CPU percent of one core by process, and per consumer: handled/s, mean ms, busy.

        `busy` is handler-seconds per second: how many handlers were running on average. The
        governance `decide` endpoint handles one request at a time, so its busy near 1.0 means
        saturated; an actor's ceiling is its concurrency (16).
        """
        seconds = self._ended - self._started
        if seconds <= 0:
            return {}
        handlers = {}
        for key, (count, total) in self._handlers_after.items():
            count0, total0 = self._handlers_before.get(key, (0.0, 0.0))
            if count - count0 > 0:
                handlers[key] = {
                    "per_s": round((count - count0) / seconds, 1),
                    "mean_ms": round(1000 * (total - total0) / (count - count0), 2),
                    "busy": round((total - total0) / seconds, 2),
                }
        cpu = Processes.cpu_percent(self._cpu_before, self._cpu_after, seconds)
        machine = _machine_percent(self._machine_before, self._machine_after)
        processes: dict[str, int] = {}
        for label, *_ in self._cpu_after.values():
            processes[label] = processes.get(label, 0) + 1
        return {
            "seconds": round(seconds, 2),
            "cpu_pct": {k: round(v, 1) for k, v in cpu.items() if v >= 0.5},
            "processes": processes,  # how many processes each label adds up
            "cpu_total_pct": round(sum(cpu.values()), 1),
            "machine": machine,
            # CPU the machine spent on processes that are not this bench's (its neighbours):
            # what makes figures on a shared machine move from one run to the next.
            "others_pct": round(
                max(machine["busy_pct"] * (os.cpu_count() or 1) - sum(cpu.values()), 0.0), 1
            ),
            "handlers": handlers,
            "counts": {k: v - self._counts_before.get(k, 0) for k, v in self._counts_after.items()},
        }
