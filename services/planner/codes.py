"""The error codes a run's status change carries (`StatusEntry.error_code`, the host's
`RunResult.error.code`) that the service sets and the replay expects in the same places."""

from __future__ import annotations

from typing import Final

__all__ = ["BUDGET_CODE", "EXPIRED_CODE", "REFUSAL_CODES", "REVIEW_CODE"]

REVIEW_CODE: Final = "HUMAN_REVIEW"
BUDGET_CODE: Final = "BUDGET_EXHAUSTED"
# A run still open when its input's window key was destroyed: it cannot be driven on.
EXPIRED_CODE: Final = "PAYLOAD_EXPIRED"
REFUSAL_CODES: Final = {
    "deny": "DENIED",
    "invalid": "INVALID_PROPOSAL",
    "conflict": "CONFLICT",
    "rejected": "REJECTED",
    # An approver sent the proposal back: the reason is what the agent must revise.
    "revise": "REVISION_ASKED",
}
