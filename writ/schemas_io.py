"""The committed JSON Schemas of every message on the bus (`make schemas` writes them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import msgspec

from schemas.admission import (
    CommandAdmitted,
    DispatchCommand,
    PlanFactsRecorded,
    ProposalRefused,
    RecordPlanFacts,
)
from schemas.control import CancelRun, RunCancelRequested
from schemas.dispatcher import (
    CommandOutcome,
    FactsRead,
    ListUnknown,
    ReadFacts,
    Reconcile,
    Reconciled,
    UnknownCommands,
)
from schemas.governance import (
    AnswerDecision,
    BudgetRefused,
    BudgetReserved,
    BudgetSettled,
    DecideBatch,
    DecideRequest,
    Decision,
    DecisionAnswered,
    Decisions,
    ListPending,
    PendingDecisions,
    RegisterRun,
    RegisterTurn,
    ReserveBudget,
    RunRegistered,
    SettleBudget,
)
from schemas.host import (
    ApprovalResult,
    ApproveProposal,
    CommandResult,
    DecisionResult,
    HumanDecision,
    ReviewDecision,
    ReviewResult,
    RunRequest,
    RunResult,
    SubmitCommand,
)
from schemas.host_reads import HostRead
from schemas.ingress import ProposalAnswer
from schemas.journal import JournalCheckpoint
from schemas.mcp import (
    ClassifyTool,
    DescribeTools,
    ListingRecorded,
    ListServer,
    RecordListing,
    ServerListing,
    ToolClassified,
    ToolDescriptions,
)
from schemas.planner import (
    BranchChanged,
    ProposeCommand,
    ReplayReport,
    ReplayRun,
    ReviewAnswer,
    ReviewTaken,
    StepRecorded,
)
from schemas.reads import (
    GetCommand,
    GetProposal,
    GetRun,
    GetRunEvents,
    ListProposals,
    VerifyJournal,
)
from schemas.retrieval import (
    EvidenceFound,
    EvidenceGathered,
    ReadCapability,
    ReadRefused,
    ReadResult,
    SearchEvidence,
)
from schemas.sessions import TurnCancelling

__all__ = ["MESSAGES", "check_schemas", "render", "write_schemas"]

MESSAGES: Final = (
    RunRequest,
    RunResult,
    SubmitCommand,
    CommandResult,
    SearchEvidence,
    EvidenceFound,
    EvidenceGathered,
    ProposeCommand,
    DecideRequest,
    Decision,
    DecideBatch,
    Decisions,
    CommandAdmitted,
    ProposalRefused,
    DispatchCommand,
    CommandOutcome,
    ListUnknown,
    UnknownCommands,
    Reconcile,
    Reconciled,
    HumanDecision,
    DecisionResult,
    RegisterRun,
    RegisterTurn,
    RunRegistered,
    AnswerDecision,
    DecisionAnswered,
    ListPending,
    PendingDecisions,
    ApproveProposal,
    ApprovalResult,
    ProposalAnswer,
    ReadFacts,
    FactsRead,
    RecordPlanFacts,
    PlanFactsRecorded,
    ReplayRun,
    ReplayReport,
    ReserveBudget,
    BudgetReserved,
    BudgetRefused,
    SettleBudget,
    BudgetSettled,
    ReviewAnswer,
    ReviewTaken,
    ReviewDecision,
    ReviewResult,
    ReadCapability,
    ReadResult,
    ReadRefused,
    StepRecorded,
    BranchChanged,
    JournalCheckpoint,
    CancelRun,
    RunCancelRequested,
    GetRun,
    GetCommand,
    ListProposals,
    GetProposal,
    GetRunEvents,
    VerifyJournal,
    HostRead,
    RecordListing,
    ListingRecorded,
    ListServer,
    ServerListing,
    ClassifyTool,
    ToolClassified,
    DescribeTools,
    ToolDescriptions,
    TurnCancelling,
)
FOLDER: Final = Path(__file__).resolve().parent.parent / "schemas" / "json"


def render(message: type) -> str:
    """The JSON Schema of one message type, as committed."""
    return json.dumps(msgspec.json.schema(message), indent=2, sort_keys=True) + "\n"


def write_schemas(folder: Path = FOLDER) -> list[Path]:
    """Write every message's schema; returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for message in MESSAGES:
        path = folder / f"{message.__name__}.json"
        path.write_text(render(message))
        written.append(path)
    return written


def check_schemas(folder: Path = FOLDER) -> list[str]:
    """How the committed schemas differ from the code (empty when they agree)."""
    drift = []
    expected = {f"{m.__name__}.json": render(m) for m in MESSAGES}
    for name, text in expected.items():
        path = folder / name
        if not path.exists():
            drift.append(f"{path} is missing: run `make schemas`")
        elif path.read_text() != text:
            drift.append(f"{path} differs from the code: run `make schemas`")
    for path in folder.glob("*.json") if folder.exists() else ():
        if path.name not in expected:
            drift.append(f"{path} has no message type any more: delete it")
    return drift
