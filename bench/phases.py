"""The measurements of one bench run, in order, against one deployment."""

from __future__ import annotations

import os
import re
from typing import Any

import asyncpg
import nats
from nats.aio.client import Client

from bench.ceilings import admission_ceiling, ceiling_twin, jetstream_ceiling
from bench.commands import CommandPath
from bench.decide import MANY_RULES_AGENT, DecideLoad, decide_logic, seed_rules, seed_rules_naming
from bench.measure import closed_loop, open_loop
from bench.observe import Counters, Processes, Window
from bench.raw import RAW_CONNS, raw_ceiling
from bench.report import BenchReport, cpu_ms_per_op, sample_dict
from bench.runs import run_phase
from bench.settle import settle
from writ.stack import Stack

__all__ = ["Bench", "BenchError"]

SCALE = float(os.environ.get("BENCH_SCALE", "1.0"))
COMMAND_LEVELS = (32, 128, 512)
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
RUN_CONCURRENCY = 32
DECIDE_CONCURRENCY = 64
ADMIT_CONCURRENCY = 16
JS_PUBLISHERS = 256
JS_BATCH = 256
RULES = 10_000
RULES_NOOP_SHARE = 0.1
MANY_RULES = 1_000  # decide logic over rules that all name its call (arguments unmatched)


class BenchError(Exception):
    """A measurement could not be made (nothing succeeded, a service died)."""


def _s(seconds: float) -> float:
    return seconds * SCALE


class Bench:
    """The measurements of one run, in order, against one deployment."""

    def __init__(self, stack: Stack, report: BenchReport) -> None:
        self.stack, self.report = stack, report
        self.ports: dict[str, int] = {}
        self.twin: Stack | None = None  # the admission ceiling's database (`prepare`)

    def alive(self) -> None:
        """Raise if a process of the deployment has exited: its figures would mean nothing."""
        for name, proc in self.stack.procs.items():
            if proc.poll() is not None:
                raise BenchError(
                    f"{name} exited with {proc.returncode}:\n" + self.stack.log_tail(name, 1500)
                )

    async def settle(self, nc: Client, before: str) -> None:
        """Let the services finish the previous measurement's backlog before the next one."""
        settled = await settle(nc)
        self.report.data.setdefault("settle", {})[before] = settled
        if settled["still_pending"]:
            self.report.line("  (not idle after 60 s)", str(settled["still_pending"]))
        elif float(str(settled["seconds"])) > 2:
            self.report.line(f"  (services took {settled['seconds']} s to go idle)", "")

    def window(self, database: Stack | None = None) -> Window:
        """A watcher of every process this bench started (services known once started);
        transactions are counted in `database`'s database (the deployment's by default)."""
        services = {proc.pid: name for name, proc in self.stack.procs.items()}
        return Window(
            Processes(services=services, database=self.stack.database),
            self.ports,
            Counters(
                database_dsn=(database or self.stack).database_dsn, nats_url=self.stack.nats_url
            ),
        )

    async def versions(self) -> None:
        """What the figures were measured on."""
        nc = await nats.connect(self.stack.nats_url)
        version = nc.connected_server_version
        await nc.close()
        conn = await asyncpg.connect(self.stack.database_dsn)
        try:
            pg = await conn.fetchval("SHOW server_version")
            fsync = await conn.fetchval("SHOW fsync")
            commit = await conn.fetchval("SHOW synchronous_commit")
        finally:
            await conn.close()
        data = self.report.data
        data.update(
            nats_server_version=f"{version.major}.{version.minor}.{version.patch}",
            postgres_version=pg,
            postgres_fsync=fsync,
            postgres_synchronous_commit=commit,
        )
        self.report.line(
            "infrastructure",
            f"nats-server {data['nats_server_version']} "
            f"(JetStream sync_interval: always), PostgreSQL {pg} "
            f"(fsync={fsync}, synchronous_commit={commit})",
        )

    async def prepare(self) -> None:
        """Before the services start: the twin database the admission ceiling runs in."""
        self.twin = await ceiling_twin(self.stack)

    async def _admission(
        self,
        label: str,
        *,
        concurrency: int = ADMIT_CONCURRENCY,
        journal: bool = True,
        notify: bool = True,
        duration_s: float = 8.0,
    ) -> dict[str, Any]:
        """One pass of the admission transaction alone (in the twin database)."""
        assert self.twin is not None
        watch = self.window(self.twin)
        sample = await admission_ceiling(
            self.twin,
            concurrency=concurrency,
            warmup_s=_s(2),
            duration_s=_s(duration_s),
            journal=journal,
            notify=notify,
            watcher=watch,
        )
        self.report.sample(label, sample, "tx/s ")
        self.report.usage(watch.report(), per=(sample.completed, "admit"))
        return {
            **sample_dict(sample),
            "concurrency": concurrency,
            "journal": journal,
            "notify": notify,
            "usage": watch.report(),
        }

    async def _raw(self) -> dict[str, Any]:
        """One pass of the shared raw admission statement (`bench/raw.py`), in the twin."""
        assert self.twin is not None
        found = await raw_ceiling(self.twin.database_dsn, seconds=_s(5))
        rate = found.get("raw_admission_tx_per_s")
        self.report.line(
            f"raw admission statement ({RAW_CONNS} conns, raw_ceiling.py)",
            f"{rate:9,.1f} tx/s" if rate else f"not measured: {found.get('error')}",
        )
        return found

    async def _jetstream(self) -> dict[str, Any]:
        """One pass of JetStream alone: publish, pull, ack."""
        r = self.report
        watch = self.window()
        published, consumed = await jetstream_ceiling(
            self.stack.nats_url,
            publishers=JS_PUBLISHERS,
            batch=JS_BATCH,
            warmup_s=_s(2),
            duration_s=_s(8),
            watcher=watch,
        )
        r.line(
            f"JetStream publish ({JS_PUBLISHERS} acks outstanding)",
            f"{published.rate:9,.1f} msg/s  PubAck p50 {published.latency_ms(50):.1f} ms, "
            f"p99 {published.latency_ms(99):.1f} ms",
        )
        r.line(f"JetStream end to end (pull {JS_BATCH}, ack each)", f"{consumed.rate:9,.1f} msg/s")
        r.usage(watch.report())
        return {
            "per_s": round(consumed.rate, 1),
            "consumed": consumed.completed,
            "published_per_s": round(published.rate, 1),
            "published": published.completed,
            "publish_ack_p50_ms": round(published.latency_ms(50), 2),
            "publish_ack_p99_ms": round(published.latency_ms(99), 2),
            "publishers": JS_PUBLISHERS,
            "fetch_batch": JS_BATCH,
            "usage": watch.report(),
        }

    async def _commands(
        self,
        path: CommandPath,
        nc: Client,
        concurrency: int,
        *,
        key: str,
        warmup_s: float = 3.0,
        duration_s: float = 10.0,
    ) -> dict[str, Any]:
        """One closed-loop pass of the command path."""
        path.states, path.problem = {}, ""
        await self.settle(nc, key)
        self.alive()
        watch = self.window()
        sample = await closed_loop(
            path.one,
            concurrency=concurrency,
            warmup_s=_s(warmup_s),
            duration_s=_s(duration_s),
            watcher=watch,
        )
        self.report.sample(f"command path, closed loop C={concurrency}", sample, "cmd/s")
        self.report.usage(watch.report(), per=(sample.completed, "command"))
        await self.settle(nc, f"{key}_after")  # its backlog is not charged to the next pass
        return {
            "concurrency": concurrency,
            **sample_dict(sample),
            "states": path.states,
            "problem": path.problem,
            "usage": watch.report(),
            "cpu_ms_per_command": cpu_ms_per_op(watch.report(), sample.rate),
        }

    async def command_path(self) -> None:
        """The command path and its ceilings, measured in alternating passes.

        Both ceilings and the command path are measured `ROUNDS` times, one after the other in
        each round, so each sees the machine as the others do (a machine may be shared, and the
        admission ceiling has moved 2x between runs). The ratio takes the best pass of each:
        the best ceiling is the least flattering one. Each round also measures the admission
        transaction without its NOTIFY and with 4 connections: diagnostics, never the ceiling.
        """
        r, data = self.report, self.report.data
        r.section(
            "Command path: host writ.noop command -> admitted -> relayed -> dispatched -> outcome"
        )
        self.alive()
        nc = await nats.connect(self.stack.nats_url, name="bench-commands")
        path = CommandPath(nc)
        await path.start()
        try:
            # Unloaded: one command at a time, traced stage by stage (also warms the services).
            await path.trace_stages()
            await self.settle(nc, "e2e_unloaded")
            watch = self.window()
            single = await closed_loop(
                path.one, concurrency=1, warmup_s=_s(1), duration_s=_s(4), watcher=watch
            )
            data["e2e_unloaded"] = {
                **sample_dict(single),
                "stages": path.stage_report(single),
                "usage": watch.report(),
            }
            r.sample("one at a time (C=1)", single, "cmd/s")
            if single.completed == 0:
                raise BenchError(
                    f"no writ.noop command succeeded: {path.states}; first problem: {path.problem}"
                )
            self._stages(path.stage_report(single))
            await path.untrace()  # throughput passes run untraced: tracing costs bench CPU

            # Which concurrency the passes use: a short sweep, not counted in the ratio.
            sweep = [
                await self._commands(path, nc, c, key=f"e2e_sweep_c{c}", warmup_s=2, duration_s=6)
                for c in COMMAND_LEVELS
            ]
            data["e2e_sweep"] = sweep
            concurrency = max(sweep, key=lambda level: level["per_s"] or 0.0)["concurrency"]
            data["e2e_concurrency"] = concurrency

            rounds = []
            for index in range(ROUNDS):
                r.section(f"Round {index + 1} of {ROUNDS}: the ceilings, then the command path")
                passes: dict[str, Any] = {}
                await self.settle(nc, f"round{index + 1}")
                passes["admission"] = await self._admission(
                    f"admission transaction, journaled ({ADMIT_CONCURRENCY} conns)"
                )
                if index == 0:  # the audit journal's cost, side by side
                    passes["admission_nojournal"] = await self._admission(
                        f"  the same, no journal row ({ADMIT_CONCURRENCY} conns)", journal=False
                    )
                passes["admission_nonotify"] = await self._admission(
                    f"  diagnostic: no NOTIFY ({ADMIT_CONCURRENCY} conns)",
                    notify=False,
                    duration_s=6,
                )
                passes["admission_4conns"] = await self._admission(
                    "  diagnostic: 4 conns", concurrency=4, duration_s=6
                )
                passes["raw"] = await self._raw()
                passes["jetstream"] = await self._jetstream()
                passes["commands"] = await self._commands(
                    path, nc, concurrency, key=f"e2e_round{index + 1}"
                )
                slower = min(passes["admission"]["per_s"] or 0.0, passes["jetstream"]["per_s"])
                passes["ratio"] = (
                    round((passes["commands"]["per_s"] or 0.0) / slower, 3) if slower else None
                )
                r.line(f"round {index + 1}: command path / slower ceiling", f"{passes['ratio']}")
                raw = passes["raw"].get("raw_admission_tx_per_s")
                passes["ratio_raw"] = (
                    round((passes["commands"]["per_s"] or 0.0) / raw, 3) if raw else None
                )
                r.line(f"round {index + 1}: command path / raw ceiling", f"{passes['ratio_raw']}")
                rounds.append(passes)
            data["rounds"] = rounds
            best = max((p["commands"] for p in rounds), key=lambda c: c["per_s"] or 0.0)
            if not best["per_s"]:
                raise BenchError(
                    f"no command succeeded under load: {best['states']}; "
                    f"first problem: {best['problem']}"
                )
            data["e2e_levels"] = [best]
            data["e2e_commands_per_s"] = best["per_s"]
            data["ceiling_admission_tx_per_s"] = max(p["admission"]["per_s"] or 0.0 for p in rounds)
            data["ceiling_jetstream_msgs_per_s"] = max(p["jetstream"]["per_s"] for p in rounds)
            raws = [
                p["raw"]["raw_admission_tx_per_s"]
                for p in rounds
                if p["raw"].get("raw_admission_tx_per_s")
            ]
            data["ceiling_raw_admission_tx_per_s"] = max(raws) if raws else None
            data["ceiling_admission_tx_nojournal_per_s"] = rounds[0]["admission_nojournal"]["per_s"]
            if rounds[0]["admission_nojournal"]["per_s"]:
                data["journal_cost"] = round(
                    1
                    - (rounds[0]["admission"]["per_s"] or 0.0)
                    / rounds[0]["admission_nojournal"]["per_s"],
                    3,
                )
            data["ceiling_admission_nonotify_tx_per_s"] = max(
                p["admission_nonotify"]["per_s"] or 0.0 for p in rounds
            )
            data["ceiling_admission_4conns_tx_per_s"] = max(
                p["admission_4conns"]["per_s"] or 0.0 for p in rounds
            )

            rate = best["per_s"] / 2
            r.section("Latency at half the best rate")
            await path.trace_stages()
            path.states, path.problem = {}, ""
            await self.settle(nc, "e2e_open_loop")
            watch = self.window()
            paced = await open_loop(
                path.one, rate=rate, warmup_s=_s(2), duration_s=_s(10), watcher=watch
            )
            stages = path.stage_report(paced)
            data["e2e_p50_ms"] = round(paced.latency_ms(50), 1)
            data["e2e_p99_ms"] = round(paced.latency_ms(99), 1)
            data["e2e_open_loop"] = {
                **sample_dict(paced),
                "offered_per_s": round(rate, 1),
                "pacer_late_max_ms": round(paced.late_s * 1000, 1),
                "states": path.states,
                "stages": stages,
                "usage": watch.report(),
            }
            r.sample(f"open loop at {rate:.1f}/s (half the best)", paced, "cmd/s")
            self._stages(stages)
            r.usage(watch.report(), per=(paced.completed, "command"))
        finally:
            await path.stop()
            await nc.close()

    def _stages(self, stages: dict[str, dict[str, float]]) -> None:
        text = ", ".join(
            f"{name} {s['p50_ms']:.1f}/{s['p99_ms']:.1f}" for name, s in stages.items()
        )
        print(f"      stages, p50/p99 ms: {text}", flush=True)

    async def run_path(self) -> None:
        """Whole runs of the run path's agent (`bench/runs.py`)."""
        await run_phase(
            self,
            "run_path",
            "Run path: RunRequest -> six services, one crm.note.create -> RunResult",
            concurrency=RUN_CONCURRENCY,
            scale=SCALE,
        )

    async def full_path(self) -> None:
        """Whole runs of the demo agent's full shape, as the peers' `full` (`bench/runs.py`)."""
        await run_phase(
            self,
            "full_path",
            "Full shape: research-assistant (catalog request, governed read, note, answer, critic)",
            concurrency=RUN_CONCURRENCY,
            scale=SCALE,
        )

    async def decide(self) -> None:
        """`decide` with the rule store as provisioned, then with 10,000 fine rules."""
        r, data = self.report, self.report.data
        r.section(f"Governance decide (request/reply, {DECIDE_CONCURRENCY} outstanding)")
        self.alive()
        nc = await nats.connect(self.stack.nats_url, name="bench-decide")
        try:
            load = DecideLoad(nc)
            await self.settle(nc, "decide")
            watch = self.window()
            bare = await load.measure(
                concurrency=DECIDE_CONCURRENCY, warmup_s=_s(1), duration_s=_s(5), watcher=watch
            )
            data["decide_no_rules"] = {**sample_dict(bare), "usage": watch.report()}
            data["decide_per_s_no_rules"] = round(bare.rate, 1)
            r.sample("no fine rules", bare, "req/s")
            r.usage(watch.report(), per=(bare.completed, "decide"))

            seeded = await seed_rules(
                self.stack.database_dsn, count=RULES, noop_share=RULES_NOOP_SHARE
            )
            logic = await decide_logic(self.stack.database_dsn, duration_s=_s(2))
            data["decide_logic"] = logic
            data["decide_logic_per_s"] = logic["per_s"]
            r.line(
                f"decide logic alone ({logic['rules_in_facts']:,} rules in its facts)",
                f"{logic['per_s']:12,.1f} decisions/s in one process",
            )
            # Another agent's calls, each named by every one of those rules.
            await seed_rules_naming(self.stack.database_dsn, count=MANY_RULES)
            many = await decide_logic(
                self.stack.database_dsn, duration_s=_s(2), agent=MANY_RULES_AGENT
            )
            data["decide_logic_many_rules"] = many
            data["decide_logic_many_rules_per_s"] = many["per_s"]
            r.line(
                f"  {many['rules_in_facts']:,} rules naming the call (index built in "
                f"{many['index_ms']:.1f} ms)",
                f"{many['per_s']:12,.1f} decisions/s in one process",
            )
            load.verdicts = {}
            watch = self.window()
            sample = await load.measure(
                concurrency=DECIDE_CONCURRENCY, warmup_s=_s(2), duration_s=_s(10), watcher=watch
            )
            data["decide_per_s"] = round(sample.rate, 1)
            data["decide"] = {
                **sample_dict(sample),
                **seeded,
                "verdicts": load.verdicts,
                "concurrency": DECIDE_CONCURRENCY,
                "usage": watch.report(),
            }
            r.sample(
                f"{seeded['rules_total']:,} fine rules "
                f"({seeded['rules_writ_noop_other_agents']:,} writ.noop, other agents)",
                sample,
                "req/s",
            )
            r.usage(watch.report(), per=(sample.completed, "decide"))
        finally:
            await nc.close()

    def warnings(self) -> None:
        """Count what each service logged at WARNING or above, by message, for the report.

        One is expected on a quiet inbox: nats-py's `fetch` can raise asyncio's TimeoutError
        rather than its own, which the actor loop takes for trouble and waits 0.5 s after.
        """
        found: dict[str, dict[str, int]] = {}
        for name in self.stack.procs:
            for line in self.stack.log_tail(name, 1 << 30).splitlines():
                level = next(
                    (lv for lv in (" WARNING ", " ERROR ", " CRITICAL ") if lv in line), None
                )
                if level is None:
                    continue
                message = line.split(level, 1)[1]
                # Group messages that differ only by ids and numbers.
                key = re.sub(r"[0-9a-f-]{8,}|\d+", "#", message)[:120]
                counts = found.setdefault(name, {})
                counts[key] = counts.get(key, 0) + 1
        self.report.data["service_warnings"] = found
        if found:
            self.report.section("Warnings the services logged during the bench")
            for name, counts in found.items():
                for message, count in sorted(counts.items(), key=lambda kv: -kv[1])[:3]:
                    self.report.line(f"{name} x{count}", message)

    def conclude(self) -> None:
        """The command path against the slower of its two ceilings, and a summary."""
        r, data = self.report, self.report.data
        r.section("Summary")
        ceilings = {
            name: data[key]
            for name, key in (
                ("admission_tx", "ceiling_admission_tx_per_s"),
                ("jetstream", "ceiling_jetstream_msgs_per_s"),
            )
            if data.get(key)
        }
        if "e2e_commands_per_s" in data:
            r.line(
                "command path (best pass)",
                f"{data['e2e_commands_per_s']:,.1f} cmd/s at "
                f"C={data['e2e_concurrency']}; p50 {data.get('e2e_p50_ms')} ms, "
                f"p99 {data.get('e2e_p99_ms')} ms at half that rate",
            )
        for key, label in (("run_path", "run path"), ("full_path", "full shape")):
            if f"{key}_runs_per_s" in data:
                r.line(
                    label,
                    f"{data[f'{key}_runs_per_s']:,.1f} run/s at "
                    f"C={RUN_CONCURRENCY}; p50 {data[f'{key}_p50_ms']} ms, "
                    f"p99 {data[f'{key}_p99_ms']} ms",
                )
        if "http_run_path_runs_per_s" in data:
            half = {k: data.get(f"{k}_run_half_rate", {}) for k in ("http", "nats")}
            r.line(
                "HTTP run path (POST /runs -> wait)",
                f"{data['http_run_path_runs_per_s']:,.1f} run/s at C=32; at half that: "
                + "; ".join(
                    f"{k.upper()} p50 {v.get('p50_ms')} ms p99 {v.get('p99_ms')} ms"
                    for k, v in half.items()
                ),
            )
            r.line("GET /runs/{id}", f"{data.get('http_get_run_per_s')} req/s")
        for index, passes in enumerate(data.get("rounds", ()), 1):
            r.line(
                f"round {index}",
                f"command path {passes['commands']['per_s']} cmd/s; "
                f"admission {passes['admission']['per_s']} tx/s (no NOTIFY "
                f"{passes['admission_nonotify']['per_s']}, 4 conns "
                f"{passes['admission_4conns']['per_s']}); JetStream "
                f"{passes['jetstream']['per_s']} msg/s; ratio {passes['ratio']}",
            )
        if ceilings:
            r.line(
                f"ceilings (best of {len(data.get('rounds', ()))} passes)",
                ", ".join(f"{k} {v:,.1f}/s" for k, v in ceilings.items()),
            )
        if data.get("ceiling_raw_admission_tx_per_s") and "e2e_commands_per_s" in data:
            data["e2e_over_raw_ceiling"] = round(
                data["e2e_commands_per_s"] / data["ceiling_raw_admission_tx_per_s"], 3
            )
            r.line(
                "command path / raw admission ceiling",
                f"{data['e2e_over_raw_ceiling']:.3f} (raw "
                f"{data['ceiling_raw_admission_tx_per_s']:,.1f} tx/s, best of the rounds)",
            )
        if len(ceilings) == 2 and "e2e_commands_per_s" in data:
            slower = min(ceilings, key=lambda k: ceilings[k])
            data["slower_ceiling"] = slower
            data["e2e_over_ceiling"] = round(data["e2e_commands_per_s"] / ceilings[slower], 3)
            r.line(f"command path / slower ceiling ({slower})", f"{data['e2e_over_ceiling']:.3f}")
        best = [
            level
            for level in data.get("e2e_levels", ())
            if level["concurrency"] == data.get("e2e_concurrency")
        ]
        if best:
            r.cost("per command (at the best level)", best[0]["cpu_ms_per_command"])
        for key, label in (("run_path", "run path"), ("full_path", "full shape")):
            if key in data:
                r.cost(f"per run ({label})", data[key]["cpu_ms_per_run"])
                r.line(
                    f"{label}: CPU per run (every process); C=1 p50; p99 at half rate",
                    f"{data[f'{key}_cpu_ms_per_run']} ms; {data.get(f'{key}_c1_p50_ms')} ms; "
                    f"{data.get(f'{key}_half_rate_p99_ms')} ms",
                )
        if "decide_logic_per_s" in data:
            r.line(
                "decide logic over cached facts, one process",
                f"{data['decide_logic_per_s']:,.1f} decisions/s",
            )
        if "decide_logic_many_rules_per_s" in data:
            r.line(
                f"  the same, {MANY_RULES:,} rules naming the call",
                f"{data['decide_logic_many_rules_per_s']:,.1f} decisions/s",
            )
        if "decide_per_s" in data:
            r.line(f"decide ({RULES:,} rules)", f"{data['decide_per_s']:,.1f} req/s")
