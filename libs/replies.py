"""Where a Writ process may answer: the requester's inbox, nowhere else.

A request names its reply subject, and whoever answers publishes there. Named by an attacker,
a reply subject turns the answer into a publish of the answerer's: an error sent to
`$JS.API.STREAM.DELETE.<stream>` is a request to delete that stream, one sent to another
tenant's result subject is a forged result. So a request whose reply subject is not an inbox
is dropped unanswered and counted (`writ_requests_dropped_total{service, reason="reply"}`),
before any work. The bus enforces the same (libs/natsauth.py): services may publish replies on
inboxes only, and a host's reply subjects resolve in its own account.

An inbox is `_INBOX.<...>` (every Writ identity's replies arrive under `_INBOX.<user>`), or
`_R_.<...>`: the reply subject NATS gives a request that came through a service import (a
host's, from its own account), which routes the answer back to that account only.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["INBOX_PREFIXES", "reply_allowed"]

INBOX_PREFIXES: Final = ("_INBOX.", "_R_.")
# Tokens of letters, digits, `_`, `-` and `.`-separated; no wildcard, no space, no `$`.
_TOKENS: Final = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+")


def reply_allowed(reply: str) -> bool:
    """Whether a request's reply subject is an inbox an answer may go to. No reply subject at
    all is allowed: nothing will be published for it."""
    if not reply:
        return True
    return reply.startswith(INBOX_PREFIXES) and _TOKENS.fullmatch(reply) is not None
