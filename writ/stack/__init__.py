"""A whole Writ deployment on one machine: infrastructure, database, secrets, six processes.

`writ run` uses it for the demo and the end-to-end tests use it to drive real processes. Each
service process gets an environment built from nothing, holding only its own settings (the CRM
credential's path is given to the dispatcher and to no one else) and, under `writ run`, the
user's `OTEL_*` and `WRIT_*` settings (`Stack.inherit`). Its tenants are the registered ones
(`config/tenant-keys.json`), onboarded and retired live by `writ tenant add|remove`
(`_onboarding.py`); each tenant's host is given a credentials folder (`hosts/<tenant>/`).
"""

from writ.stack._stack import JOURNALS, NOT_INHERITED, SERVICES, Stack
from writ.stack._tokens import AUDIENCE, POLICY_KEY_ID, mint_token

__all__ = [
    "AUDIENCE",
    "JOURNALS",
    "NOT_INHERITED",
    "POLICY_KEY_ID",
    "SERVICES",
    "Stack",
    "mint_token",
]
