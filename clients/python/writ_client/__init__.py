"""Writ's host SDK: connect with a host's credentials (`HostCredentials`), sign host tokens
(`Issuer`), then drive Writ over HTTP (`Client`, `SyncClient`) or NATS (`NatsClient`) with the
same methods and the same types. A run started with `start` is a `RunHandle`. Refusals raise a
`WritError` subclass carrying Writ's stable `code` and whether a retry may help (`retryable`)."""

from writ_client._handle import RunHandle
from writ_client._http import Client
from writ_client._keys import new_key
from writ_client._nats import NatsClient
from writ_client._session import Session, SyncSession
from writ_client._sync import SyncClient, SyncRunHandle
from writ_client._wire.api import RunAccepted, RunView
from writ_client._wire.governance import PendingDecision, PendingDecisions, RunBudget
from writ_client._wire.host import (
    ApprovalResult,
    CommandResult,
    DecisionResult,
    ReviewResult,
    RunResult,
)
from writ_client._wire.planner import ReplayReport, StepRecorded
from writ_client._wire.reads import ProposalDetail, Proposals
from writ_client._wire.sessions import SessionList, SessionSummary, SessionView
from writ_client.credentials import HostCredentials, NatsLogin
from writ_client.errors import (
    AuthenticationError,
    Conflict,
    InvalidRequest,
    InvalidResponse,
    NotFound,
    PermissionDenied,
    Refused,
    Timeout,
    Unavailable,
    WritError,
)
from writ_client.issuer import Issuer, StaticToken, Tokens

__all__ = [
    "ApprovalResult",
    "AuthenticationError",
    "Client",
    "CommandResult",
    "Conflict",
    "DecisionResult",
    "HostCredentials",
    "InvalidRequest",
    "InvalidResponse",
    "Issuer",
    "NatsClient",
    "NatsLogin",
    "NotFound",
    "PendingDecision",
    "PendingDecisions",
    "PermissionDenied",
    "ProposalDetail",
    "Proposals",
    "Refused",
    "ReplayReport",
    "ReviewResult",
    "RunAccepted",
    "RunBudget",
    "RunHandle",
    "RunResult",
    "RunView",
    "Session",
    "SessionList",
    "SessionSummary",
    "SessionView",
    "StaticToken",
    "StepRecorded",
    "SyncClient",
    "SyncRunHandle",
    "SyncSession",
    "Timeout",
    "Tokens",
    "Unavailable",
    "WritError",
    "new_key",
]
