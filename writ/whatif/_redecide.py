"""A candidate policy ruled over journaled decisions: what would have flipped. Pure, no I/O.

Each decision governance journaled keeps the call and the facts it was ruled on
(services/governance/recorded.py). Here each is ruled twice with governance's own pure
`decide`: once on the facts as recorded (the baseline) and once with the candidate
substituted for the part it changes (org policy, fine rules, amount thresholds). A decision
whose baseline does not give the verdict that was journaled (a refusal made outside `decide`,
such as an `mcp:` tool whose digest changed, or one journaled before facts were recorded) is
not ruled again: it is listed as not re-decidable, never guessed at.

An amount threshold raises a call on an amount above it (in its currency, read from the
proposal's frozen arguments) to at least its verdict. A person's answer to that very call
stands for an `ask` threshold (the person was asked), not for a `deny` one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal

import msgspec

from schemas.base import Family
from services.governance.logic import Facts, Rule, Ruling, decide
from services.governance.recorded import RecordedCall, RecordedFacts, facts_of_record

__all__ = [
    "REPORT_SCHEMA",
    "Amount",
    "Candidate",
    "Flip",
    "JournaledDecision",
    "Report",
    "Threshold",
    "ThresholdEffect",
    "redecide",
    "render",
    "report_digest",
    "whatif",
]

REPORT_SCHEMA: Final = "writ-policy-whatif/1"
MAX_CANDIDATE_BYTES: Final = 256 * 1024
_ORDER: Final = {"allow": 0, "ask": 1, "deny": 2}
_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class CandidateRule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A fine rule of the candidate, as `logic.Rule`."""

    tool: _Name
    effect: Literal["allow", "deny"]
    arg_prefix: Annotated[str, msgspec.Meta(max_length=512)] | None = None
    agent: _Name | None = None


class Threshold(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Calls of `tool` on more than `above_cents` of `currency` are at least `verdict`."""

    tool: _Name
    currency: Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{3}(?!\n)$")]
    above_cents: Annotated[int, msgspec.Meta(ge=0, le=100_000_000_000)]
    verdict: Literal["ask", "deny"]


class Candidate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A candidate policy. Each part left out (None) is taken as recorded."""

    version: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    refused_tools: Annotated[list[_Name], msgspec.Meta(max_length=1000)] | None = None
    refused_connectors: Annotated[list[_Name], msgspec.Meta(max_length=1000)] | None = None
    refused_families: Annotated[list[Family], msgspec.Meta(max_length=5)] | None = None
    developer_mode: bool | None = None
    rules: Annotated[list[CandidateRule], msgspec.Meta(max_length=4096)] | None = None
    thresholds: Annotated[list[Threshold], msgspec.Meta(max_length=256)] = []

    def substituted(self, facts: Facts) -> Facts:
        """`facts` with this candidate's parts in place of the recorded ones."""
        changes: dict[str, Any] = {}
        if self.refused_tools is not None:
            changes["refused_tools"] = frozenset(self.refused_tools)
        if self.refused_connectors is not None:
            changes["refused_connectors"] = frozenset(self.refused_connectors)
        if self.refused_families is not None:
            changes["refused_families"] = frozenset(self.refused_families)
        if self.developer_mode is not None:
            changes["developer_mode"] = self.developer_mode
        if self.rules is not None:
            changes["rules"] = tuple(
                Rule(tool=r.tool, effect=r.effect, arg_prefix=r.arg_prefix, agent=r.agent)
                for r in self.rules
            )
        return msgspec.structs.replace(facts, **changes) if changes else facts


class JournaledDecision(msgspec.Struct, frozen=True, kw_only=True):
    """A `decision` row of governance's journal, as far as ruling it again needs."""

    decision_id: str
    run_id: str
    agent: str
    tool: str
    family: str
    first_argument: str = ""
    verdict: str
    line: int
    policy_version: str
    proposal_id: str | None = None
    approval_id: str | None = None  # a dispatcher's re-check: the answer it stood on
    # Absent from rows journaled before the facts were: such a row cannot be ruled again.
    call: RecordedCall | None = None
    facts: RecordedFacts | None = None


class Amount(msgspec.Struct, frozen=True, kw_only=True):
    """What a proposal's frozen arguments say it moves, and the operation it is."""

    operation: str
    amount_cents: int
    currency: str


class Flip(msgspec.Struct, frozen=True, kw_only=True):
    """A decision the candidate would have ruled otherwise."""

    decision_id: str
    run_id: str
    tool: str
    operation: str | None
    amount_cents: int | None
    currency: str | None
    before: str
    after: str
    line_before: int
    line_after: int
    reason_after: str


class ThresholdEffect(msgspec.Struct, frozen=True, kw_only=True):
    """What one of the candidate's thresholds did over the window: the decisions it covers
    (of its tool, on an amount above it in its currency), how many it raises, and why the
    others stay as they were (each distinct reason once: a call already ruled at least the
    threshold's verdict says why it was, such as money being asked every time)."""

    tool: str
    verdict: str
    above_cents: int
    currency: str
    covered: int
    raised: int
    unchanged_because: list[str]


@dataclass(slots=True)
class _Tally:
    """A threshold's `ThresholdEffect` as the window is read."""

    covered: int = 0
    raised: int = 0
    why: list[str] = field(default_factory=list)

    def count(self, unchanged_because: str | None) -> None:
        self.covered += 1
        if unchanged_because is None:
            self.raised += 1
        elif unchanged_because not in self.why and len(self.why) < 16:
            self.why.append(unchanged_because)


class Report(msgspec.Struct, frozen=True, kw_only=True):
    """What the candidate would have changed over one tenant's window."""

    schema: str = REPORT_SCHEMA
    tenant: str
    candidate: str
    candidate_digest: str
    since: str
    until: str
    decisions: int
    redecided: int
    flips: list[Flip]
    approvals_not_needed: list[Flip]
    not_redecidable: list[str]
    # Per threshold of the candidate: an `ask` threshold over calls that are asked already
    # (money is) flips nothing, and the report says so and why rather than staying silent.
    thresholds: list[ThresholdEffect] = []
    # Decisions of the window whose payload (or whose proposal's arguments) expired under the
    # retention policy: not evaluable, counted in `decisions`, never guessed at.
    not_evaluable: list[str] = []


def _ruled(d: JournaledDecision, candidate: Candidate | None) -> Ruling:
    assert d.call is not None
    call, recorded = facts_of_record(
        tool=d.tool,
        family=d.family,
        agent=d.agent,
        first_argument=d.first_argument,
        call=d.call,
        facts=d.facts,
    )
    if candidate is not None and recorded is not None:
        recorded = candidate.substituted(recorded)
    return decide(call, recorded)


def _covers(t: Threshold, d: JournaledDecision, amount: Amount | None) -> bool:
    return (
        amount is not None
        and t.tool == d.tool
        and t.currency == amount.currency
        and amount.amount_cents > t.above_cents
    )


def _unchanged_because(t: Threshold, d: JournaledDecision, ruling: Ruling) -> str | None:
    """Why `t` leaves a call it covers as `ruling` ruled it; None if it raises it."""
    if _ORDER[t.verdict] <= _ORDER[ruling.verdict]:
        return f"already {ruling.verdict}: {ruling.reason}"
    if t.verdict == "ask" and d.facts is not None and d.facts.approved:
        return "a person was asked and approved this very call"
    return None


def _raised(
    ruling: Ruling, d: JournaledDecision, amount: Amount | None, candidate: Candidate
) -> Ruling:
    """The ruling raised by the candidate's thresholds that cover the call's amount."""
    for t in candidate.thresholds:
        if not _covers(t, d, amount) or _unchanged_because(t, d, ruling) is not None:
            continue
        assert amount is not None
        ruling = Ruling(
            verdict=t.verdict,
            line=ruling.line,
            reason=f"{t.tool} above {t.above_cents} cents {t.currency}: {t.verdict}",
        )
    return ruling


def redecide(
    d: JournaledDecision, candidate: Candidate, amount: Amount | None
) -> tuple[Ruling, Ruling] | None:
    """(baseline, candidate's) rulings of a journaled decision; None if it cannot be ruled
    again (no facts recorded, or the baseline does not give the journaled verdict)."""
    if d.call is None:
        return None
    baseline = _ruled(d, None)
    if baseline.verdict != d.verdict or baseline.line != d.line:
        return None
    return baseline, _raised(_ruled(d, candidate), d, amount, candidate)


def whatif(
    *,
    tenant: str,
    candidate: Candidate,
    candidate_digest: str,
    since: str,
    until: str,
    decisions: list[JournaledDecision],
    amounts: dict[str, Amount],
    not_evaluable: Sequence[str] = (),
) -> Report:
    """The report of `candidate` over `decisions` (journal order); `amounts` by decision id;
    `not_evaluable` the window's decisions whose payloads expired (`journaled_window`)."""
    flips: list[Flip] = []
    unclear: list[str] = []
    redecided = 0
    effects = [_Tally() for _ in candidate.thresholds]
    for d in decisions:
        amount = amounts.get(d.decision_id)
        ruled = redecide(d, candidate, amount)
        if ruled is None:
            why = "facts not recorded" if d.call is None else "journaled verdict not reproduced"
            unclear.append(f"{d.decision_id}: {why}")
            continue
        redecided += 1
        before, after = ruled
        for i, t in enumerate(candidate.thresholds):
            if _covers(t, d, amount):
                effects[i].count(_unchanged_because(t, d, _ruled(d, candidate)))
        if before.verdict == after.verdict:
            continue
        flips.append(
            Flip(
                decision_id=d.decision_id,
                run_id=d.run_id,
                tool=d.tool,
                operation=None if amount is None else amount.operation,
                amount_cents=None if amount is None else amount.amount_cents,
                currency=None if amount is None else amount.currency,
                before=before.verdict,
                after=after.verdict,
                line_before=before.line,
                line_after=after.line,
                reason_after=after.reason,
            )
        )
    return Report(
        tenant=tenant,
        candidate=candidate.version,
        candidate_digest=candidate_digest,
        since=since,
        until=until,
        decisions=len(decisions) + len(not_evaluable),
        redecided=redecided,
        not_evaluable=list(not_evaluable),
        flips=flips,
        approvals_not_needed=[f for f in flips if f.before == "ask" and f.after == "allow"],
        not_redecidable=unclear,
        thresholds=[
            ThresholdEffect(
                tool=t.tool,
                verdict=t.verdict,
                above_cents=t.above_cents,
                currency=t.currency,
                covered=tally.covered,
                raised=tally.raised,
                unchanged_because=tally.why,
            )
            for t, tally in zip(candidate.thresholds, effects, strict=True)
        ],
    )


def report_digest(report: Report) -> str:
    """sha256 of the report's canonical JSON: what the journal records and its sealer signs."""
    return hashlib.sha256(msgspec.json.encode(report, order="sorted")).hexdigest()


def _money(f: Flip) -> str:
    if f.amount_cents is None:
        return ""
    return f" {f.amount_cents // 100}.{f.amount_cents % 100:02d} {f.currency}"


def render(report: Report) -> str:
    """The report as a terminal reads it: one line per flip."""
    lines = [
        f"{report.candidate} over {report.tenant} {report.since} .. {report.until}: "
        f"{report.redecided} of {report.decisions} decisions ruled again, "
        f"{len(report.flips)} would flip, {len(report.approvals_not_needed)} approvals "
        "not needed"
    ]
    lines += [
        f"  {f.before} -> {f.after}  {f.tool}{_money(f)}  operation {f.operation or '-'}  "
        f"run {f.run_id}  decision {f.decision_id}"
        for f in report.flips
    ]
    for t in report.thresholds:
        cents = f"{t.above_cents // 100}.{t.above_cents % 100:02d} {t.currency}"
        lines.append(
            f"  threshold {t.tool} above {cents} -> {t.verdict}: {t.covered} decisions "
            f"covered, {t.raised} raised"
            + ("" if t.raised or not t.covered else "; the candidate changes nothing for them")
        )
        lines += [f"    unchanged: {why}" for why in t.unchanged_because]
    lines += [f"  not ruled again: {n}" for n in report.not_redecidable]
    if report.not_evaluable:
        lines.append(f"  {len(report.not_evaluable)} decision(s) not evaluable: payload expired")
        lines += [f"    not evaluable: {n}" for n in report.not_evaluable]
    return "\n".join(lines)
