"""The approval console (`/console/`), served by ingress: server-rendered pages for a tenant's
approvers (and auditors, for runs and the journal), built on the HTTP API (`/api/v1`) and
nothing else. A person approves a proposal by its opaque id; the page shows the frozen preview
each action contract describes (`ActionContract.describe`), never raw JSON.

Sign-in never asks for a password: a fronting identity-aware proxy sets the bearer token, or
`writ console` prints a one-time link (`_session.py`)."""

from services.ingress.console._client import ApiClient
from services.ingress.console._routes import CSP, HEADERS, console_router
from services.ingress.console._session import BUCKET, COOKIE, Sessions, Viewer

__all__ = [
    "BUCKET",
    "COOKIE",
    "CSP",
    "HEADERS",
    "ApiClient",
    "Sessions",
    "Viewer",
    "console_router",
]
