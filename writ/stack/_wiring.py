"""What the deployment itself gives each service process: its NATS user and password file,
its database role, its secrets and keys, and the wiring only it needs (the simulated
providers' addresses for the dispatcher, the agents for the planner)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final

from libs.db import role_name, with_database
from libs.natsauth import JOURNALED, seal_user
from writ import receipt_keys

if TYPE_CHECKING:
    from writ.stack._stack import Stack

__all__ = ["DEMO", "WITH_DATABASE", "wiring"]

WITH_DATABASE: Final = ("retrieval", "planner", "governance", "admission", "dispatcher")
DEMO: Final = Path(__file__).resolve().parent.parent / "demo"


def wiring(stack: Stack, name: str) -> dict[str, str]:
    """The variables the deployment sets for service `name` (above the user's own)."""
    env = {
        "WRIT_NATS_URL": stack._nats_url or "",
        "WRIT_INSTANCE": f"{name}-0",
        "WRIT_METRICS_PORT": "0",
        "WRIT_METRICS_PORT_FILE": str(stack.home / f"{name}.metrics-port"),
    }
    if stack.embedded_nats is not None:
        # Each service connects as itself, held by the server to its own subjects.
        env["WRIT_NATS_USER"] = name
        env["WRIT_NATS_PASSWORD_FILE"] = str(stack.secrets / f"nats-{name}.password")
        if name in JOURNALED:  # its sealer connects again, as its own user
            env["WRIT_SEAL_NATS_PASSWORD_FILE"] = str(
                stack.secrets / f"nats-{seal_user(name)}.password"
            )
    if name in WITH_DATABASE:
        env["WRIT_DATABASE_URL"] = with_database(
            stack.admin_dsn, stack.database, user=role_name(stack.database, name), password=""
        )
        env["WRIT_DATABASE_PASSWORD_FILE"] = str(stack.secrets / f"pg-{name}.password")
        env["WRIT_JOURNAL_SIGNING_KEY_FILE"] = str(stack.secrets / f"journal-{name}-signing.json")
        env["WRIT_JOURNAL_DATA_KEYS_FILE"] = str(stack.secrets / f"journal-{name}-data.json")
    if name == "admission":  # the approval receipts' signing key is admission's alone
        env["WRIT_RECEIPT_SIGNING_KEY_FILE"] = str(stack.secrets / receipt_keys.SIGNING)
    if name == "ingress":
        env["WRIT_RECEIPT_KEYS_FILE"] = str(stack.config / receipt_keys.PUBLIC)
        env["WRIT_TENANT_KEYS_FILE"] = str(stack.config / "tenant-keys.json")
        env["WRIT_AGENTS_DIR"] = str(DEMO / "agents")  # names only: UNKNOWN_AGENT
        env["WRIT_HTTP_PORT"] = str(stack.http_port)
        env["WRIT_HTTP_PORT_FILE"] = str(stack.home / "ingress.http-port")
        env["WRIT_OPERATORS_KEY_FILE"] = str(stack.config / "operators-key.pem")
    if name == "governance":
        env["WRIT_POLICY_DIR"] = str(stack.policies)
        env["WRIT_POLICY_KEYS_FILE"] = str(stack.config / "policy-keys.json")
    if name == "planner":
        env["WRIT_DECISIONS_FILE"] = str(stack.decisions_file)
        env["WRIT_AGENTS_DIR"] = str(DEMO / "agents")
    if name == "retrieval":
        env["WRIT_MCP_SERVERS_FILE"] = str(stack.config / "mcp-servers.json")
    if name == "dispatcher":
        if stack.host_url:
            env["WRIT_HOST_URL"] = stack.host_url
            env["WRIT_HOST_TOKEN_FILE"] = str(stack.secrets / "host-rest.token")
        env["WRIT_CRM_URL"] = stack.crm_url
        env["WRIT_CRM_TOKEN_FILE"] = str(stack.secrets / "crm.token")
        env["WRIT_PAYMENTS_URL"] = stack.payments_url
        env["WRIT_PAYMENTS_TOKEN_FILE"] = str(stack.secrets / "payments.token")
    return env
