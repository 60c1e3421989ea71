"""Cost relative to a baseline: a candidate's provider calls, tokens and steps over the
baseline report's on the same set version, per case and in total. Pure, no I/O.

Costs are compared per pass over the set (a report's sums divided by its k), so a candidate
sampled k = 3 times is compared with a baseline sampled once on what one pass costs. A case's
cost is what its samples cost (a rollout that never reached a case costs nothing there); a
step is one judged decision point. A limit `tokens=1.5` says the candidate may cost at most
1.5 times the baseline; above it warns, or fails the gate if the limit says `fail`. Where the
baseline cost nothing and the candidate something, the ratio is infinite; where both cost
nothing there is no ratio and nothing to exceed.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Final, Literal, cast

import msgspec

if TYPE_CHECKING:
    from writ.eval._report import CaseResult, Report

__all__ = ["METRICS", "CostComparison", "CostLimit", "Finding", "compare_cost", "parse_cost_limit"]

Metric = Literal["calls", "tokens", "steps"]
METRICS: Final = ("calls", "tokens", "steps")
_LIMIT: Final = re.compile(r"^(calls|tokens|steps)=([0-9]+(?:\.[0-9]+)?)(?::(warn|fail))?$")


class CostLimit(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """At most `ratio` times the baseline's `metric`, over the whole set (`total`) or on any one
    case (`case`); above it the gate warns, or fails when `fails`."""

    metric: Metric
    ratio: float
    scope: Literal["total", "case"] = "total"
    fails: bool = False


def parse_cost_limit(text: str, *, scope: Literal["total", "case"]) -> CostLimit:
    """`METRIC=RATIO[:warn|:fail]` (e.g. `tokens=1.5:fail`) as a limit.

    Raises:
        ValueError: not of that form, or a ratio that is not positive.
    """
    match = _LIMIT.match(text.strip())
    if match is None:
        raise ValueError(
            f"a cost limit is METRIC=RATIO[:warn|:fail] with METRIC one of "
            f"{', '.join(METRICS)}, not {text!r}"
        )
    ratio = float(match.group(2))
    if ratio <= 0:
        raise ValueError(f"a cost ratio must be above 0, not {ratio}")
    return CostLimit(
        metric=cast(Metric, match.group(1)),  # _LIMIT matches only METRICS
        ratio=ratio,
        scope=scope,
        fails=match.group(3) == "fail",
    )


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One limit exceeded: where (a case id, or "" for the whole set), by how much."""

    case_id: str
    metric: str
    ratio: float | None  # None: the baseline cost nothing there, the candidate something
    limit: float
    fails: bool
    message: str


class CostComparison(msgspec.Struct, frozen=True, kw_only=True):
    """What one pass over the set cost the candidate and the baseline, their ratios, and the
    limits exceeded."""

    candidate: dict[str, float]
    baseline: dict[str, float]
    # None: no finite ratio (the baseline cost nothing; `candidate` says whether it did).
    ratios: dict[str, float | None]
    limits: list[CostLimit]
    findings: list[Finding]


def _cost(results: list[CaseResult], k: int) -> dict[str, float]:
    return {
        "calls": sum(s.calls for r in results for s in r.samples) / k,
        "tokens": sum(s.tokens for r in results for s in r.samples) / k,
        "steps": sum(len(r.judged) for r in results) / k,
    }


def _ratio(candidate: float, baseline: float) -> float | None:
    if baseline == 0:
        return None if candidate == 0 else math.inf
    return candidate / baseline


def _finite(ratio: float | None) -> float | None:
    return None if ratio is None or math.isinf(ratio) else ratio


def _text(ratio: float) -> str:
    return "inf" if math.isinf(ratio) else f"{ratio:.2f}"


def compare_cost(
    results: list[CaseResult], k: int, baseline: Report, limits: list[CostLimit]
) -> CostComparison:
    """The candidate's cost over the baseline's, and each limit it exceeds (per case: every
    case of either report)."""
    mine, theirs = _cost(results, k), _cost(baseline.cases, baseline.k)
    ratios = {m: _ratio(mine[m], theirs[m]) for m in METRICS}
    findings = []
    for limit in limits:
        if limit.scope == "total":
            ratio = ratios[limit.metric]
            if ratio is not None and ratio > limit.ratio:
                findings.append(
                    Finding(
                        case_id="",
                        metric=limit.metric,
                        ratio=_finite(ratio),
                        limit=limit.ratio,
                        fails=limit.fails,
                        message=(
                            f"cost: {limit.metric} {mine[limit.metric]:g} per pass, "
                            f"{_text(ratio)}x the baseline's {theirs[limit.metric]:g} "
                            f"(limit {limit.ratio:g}x)"
                        ),
                    )
                )
            continue
        base = {r.case_id: _cost([r], baseline.k) for r in baseline.cases}
        now = {r.case_id: _cost([r], k) for r in results}
        for case_id in sorted(set(base) | set(now)):
            a = now.get(case_id, dict.fromkeys(METRICS, 0.0))[limit.metric]
            b = base.get(case_id, dict.fromkeys(METRICS, 0.0))[limit.metric]
            ratio = _ratio(a, b)
            if ratio is not None and ratio > limit.ratio:
                findings.append(
                    Finding(
                        case_id=case_id,
                        metric=limit.metric,
                        ratio=_finite(ratio),
                        limit=limit.ratio,
                        fails=limit.fails,
                        message=(
                            f"cost of {case_id}: {limit.metric} {a:g} per pass, {_text(ratio)}x "
                            f"the baseline's {b:g} (limit {limit.ratio:g}x)"
                        ),
                    )
                )
    return CostComparison(
        candidate=mine,
        baseline=theirs,
        ratios={m: _finite(r) for m, r in ratios.items()},
        limits=list(limits),
        findings=findings,
    )
