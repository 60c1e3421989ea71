"""Writ's host SDK: sign host tokens (`Issuer`), then drive Writ over HTTP (`Client`,
`SyncClient`) or NATS (`NatsClient`) with the same methods and the same types as the services
(`schemas/`). Errors are `WritError`s carrying Writ's stable `code`."""

from schemas.api import RunAccepted, RunView
from schemas.host import ApprovalResult, CommandResult, DecisionResult, ReviewResult, RunResult
from writ_client._http import Client, SyncClient, new_key
from writ_client._nats import NatsClient
from writ_client._session import Session, SyncSession
from writ_client.errors import WritError
from writ_client.issuer import Issuer

__all__ = [
    "ApprovalResult",
    "Client",
    "CommandResult",
    "DecisionResult",
    "Issuer",
    "NatsClient",
    "ReviewResult",
    "RunAccepted",
    "RunResult",
    "RunView",
    "Session",
    "SyncClient",
    "SyncSession",
    "WritError",
    "new_key",
]
