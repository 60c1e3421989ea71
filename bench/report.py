"""Printing figures as they are measured, and collecting them for the JSON file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench.measure import Measurement

__all__ = ["BenchReport", "cpu_ms_per_op", "sample_dict"]


def _round(value: float, digits: int = 1) -> float | None:
    return None if math.isnan(value) else round(value, digits)


def sample_dict(sample: Measurement) -> dict[str, Any]:
    """The JSON form of a sample: counts, rate, latency percentiles."""
    return {
        "per_s": _round(sample.rate),
        "completed": sample.completed,
        "failed": sample.failed,
        "seconds": round(sample.seconds, 2),
        "p50_ms": _round(sample.latency_ms(50)),
        "p99_ms": _round(sample.latency_ms(99)),
        "max_ms": _round(sample.latency_ms(100)),
    }


def cpu_ms_per_op(usage: dict[str, Any], rate: float) -> dict[str, float]:
    """CPU milliseconds each process spent per completed operation, and their total."""
    if not usage or rate <= 0:
        return {}
    per_op = {name: round(pct * 10 / rate, 2) for name, pct in usage["cpu_pct"].items()}
    return {"total": round(usage["cpu_total_pct"] * 10 / rate, 2), **per_op}


class BenchReport:
    """Figures printed readably as they come, and kept for `write()`."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def section(self, title: str) -> None:
        """A heading."""
        print(f"\n{title}", flush=True)

    def line(self, label: str, text: str) -> None:
        """One figure."""
        print(f"  {label:<46} {text}", flush=True)

    def sample(self, label: str, sample: Measurement, unit: str) -> None:
        """A rate with its latency percentiles."""
        self.line(
            label,
            f"{sample.rate:9,.1f} {unit}   p50 {sample.latency_ms(50):7.1f} ms   "
            f"p99 {sample.latency_ms(99):7.1f} ms   "
            f"(n={sample.completed}, failed={sample.failed})",
        )

    def usage(
        self, usage: dict[str, Any], *, top: int = 9, per: tuple[int, str] | None = None
    ) -> None:
        """The busiest processes, each consumer's handler time and, given `per` (operations
        completed, their name), the transactions and stream messages each one cost."""
        if not usage:
            return
        cpu = ", ".join(f"{name} {pct:.0f}" for name, pct in list(usage["cpu_pct"].items())[:top])
        machine = usage["machine"]
        print(
            f"      CPU, % of one core (total {usage['cpu_total_pct']:.0f} of "
            f"{100 * self.data.get('cpu_count', 1)}): {cpu}",
            flush=True,
        )
        print(
            f"      machine: busy {machine['busy_pct']:.0f}% (other processes "
            f"{usage['others_pct']:.0f}% of a core), iowait {machine['iowait_pct']:.0f}%, "
            f"steal {machine['steal_pct']:.0f}%, idle {machine['idle_pct']:.0f}%",
            flush=True,
        )
        handlers = sorted(usage["handlers"].items(), key=lambda kv: -kv[1]["busy"])
        if handlers:
            text = ", ".join(
                f"{key} {h['per_s']:.0f}/s x {h['mean_ms']:.1f} ms = {h['busy']:.2f}"
                for key, h in handlers
            )
            print(f"      handlers (rate x mean = busy): {text}", flush=True)
        counts = usage.get("counts", {})
        if per is not None and per[0] > 0 and counts:
            done, name = per
            streams = (
                ", ".join(
                    f"{k[3:]} {v / done:.2f}"
                    for k, v in counts.items()
                    if k.startswith("js:") and v
                )
                or "none"
            )
            print(
                f"      per {name}: {counts.get('pg_transactions', 0) / done:.1f} Postgres "
                f"transactions; JetStream messages stored: {streams}",
                flush=True,
            )

    def cost(self, label: str, per_op: dict[str, float], *, top: int = 10) -> None:
        """CPU time per operation, by process."""
        if per_op:
            parts = [f"{k} {v:.2f}" for k, v in per_op.items() if k != "total"][:top]
            self.line(label, f"{per_op['total']:.1f} ms of CPU: " + ", ".join(parts))

    def write(self, path: Path) -> None:
        """Write every figure as JSON."""
        path.write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n")
