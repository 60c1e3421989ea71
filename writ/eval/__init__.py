"""`writ eval`: score a candidate model on a versioned set of decision points before it ships
(docs/design.md §12).

The set (`_case.py`) is built from journaled runs — each decision point's model input rebuilt
as the planner builds it and checked against the journaled digest — and hand-written cases,
versioned by content digest, tenant-scoped, stored AES-GCM encrypted. A run (`_run.py`, step
mode) asks each case of the candidate k times; each answer is judged (`_score.py`) by what a
typed decision and its contract say: the capability, the arguments after the contract's
`resolve`, the runtime's checks, governance's pure `decide` with the case's policy, scope
widening, refusals and escalations. The report (`_report.py`) aggregates, gates (exit 0 pass,
1 regression, 2 incomplete) and renders as a table, JSON and JUnit XML; its cost is bounded in
absolute tokens or relative to a baseline report's (`_cost.py`).

The evaluation cannot write: it has no bus connection, no dispatcher, no connector credential;
its HTTP client reaches the candidate's base URL only (`_guard.py`).
"""

from writ.eval._case import (
    CaseError,
    EvalCase,
    EvalSet,
    Expected,
    cases_from_run,
    load_case_file,
    make_set,
    open_set,
    seal_set,
)
from writ.eval._cost import CostComparison, CostLimit, parse_cost_limit
from writ.eval._guard import AllowList, EgressRefused
from writ.eval._report import (
    REPORT_SCHEMA,
    Report,
    junit_xml,
    mcnemar_exact,
    render,
    report_digest,
    summarize,
)
from writ.eval._run import (
    CandidateConfig,
    candidate_provider,
    load_candidate,
    run_rollout,
    run_step,
)
from writ.eval._score import Judged, Sample, judge

__all__ = [
    "REPORT_SCHEMA",
    "AllowList",
    "CandidateConfig",
    "CaseError",
    "CostComparison",
    "CostLimit",
    "EgressRefused",
    "EvalCase",
    "EvalSet",
    "Expected",
    "Judged",
    "Report",
    "Sample",
    "candidate_provider",
    "cases_from_run",
    "judge",
    "junit_xml",
    "load_candidate",
    "load_case_file",
    "make_set",
    "mcnemar_exact",
    "open_set",
    "parse_cost_limit",
    "render",
    "report_digest",
    "run_rollout",
    "run_step",
    "seal_set",
    "summarize",
]
