"""`writ policy whatif`: a candidate policy ruled over a tenant's journaled decisions, with
governance's pure `decide` and the facts as recorded; nothing dispatched, nothing written but
the report (`_redecide.py`), whose digest can be sealed into the journal (`cli.py`)."""

from writ.whatif._redecide import (
    REPORT_SCHEMA,
    Amount,
    Candidate,
    Flip,
    JournaledDecision,
    Report,
    Threshold,
    ThresholdEffect,
    redecide,
    render,
    report_digest,
    whatif,
)

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
