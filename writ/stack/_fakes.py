"""The fakes `make run` and the tests start beside Writ: the CRM, the payment provider and the
host product (its MCP server and REST API), each a real HTTP server on loopback, spawned and
watched as the stack's own processes, each told the approval receipts' public keys so that it
refuses a write no receipt covers."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from writ import receipt_keys
from writ.stack._tokens import write_secret
from writ.stack._wiring import DEMO

if TYPE_CHECKING:
    from writ.stack._stack import Stack

__all__ = ["seed_payments", "start_crm", "start_host", "wait_file"]


def start_crm(stack: Stack) -> None:
    """The simulated CRM and payment provider, the provider seeded with the demo's payments."""
    stack.crm_url = _start_fake(stack, "crm")
    stack.payments_url = _start_fake(stack, "payments")
    with httpx.Client(base_url=stack.payments_url, timeout=5) as client:
        seed_payments(client)


def seed_payments(client: httpx.Client, *, reset: bool = False) -> None:
    """The payment provider's demo payments (what `payment.refund` reads and refunds);
    `reset` forgets every payment, refund and charge first."""
    if reset:
        client.post("/_control/reset").raise_for_status()
    for payment in json.loads((DEMO / "payments.json").read_text()):
        client.post("/_control/payments", json=payment).raise_for_status()


def start_host(stack: Stack, *, port: int = 0) -> None:
    """The simulated host product (its MCP server and its REST API), registered as the
    `helpdesk` MCP server of tenant acme. Two credentials: the MCP one only retrieval is
    given (through the registration), the REST one only the dispatcher."""
    from writ.mcp import add_server

    ready = stack.home / "host.url"
    ready.unlink(missing_ok=True)
    # Its authorization server knows one OAuth client, for registrations that use client
    # credentials instead of the static token (`oauth_client_secret`).
    clients = stack.secrets / "host-oauth-clients.json"
    if not clients.exists():
        write_secret(clients, json.dumps({"writ-retrieval": secrets.token_urlsafe(32)}))
    stack._spawn(
        "host",
        [
            sys.executable,
            "-m",
            "fakes.host",
            "--port",
            str(port),
            "--mcp-token-file",
            str(stack.secrets / "host-mcp.token"),
            "--rest-token-file",
            str(stack.secrets / "host-rest.token"),
            "--oauth-clients-file",
            str(clients),
            "--ready-file",
            str(ready),
            "--receipt-keys-file",
            _receipt_keys(stack),
        ],
        {},
    )
    stack.host_url = wait_file(ready, stack.procs["host"], 20).strip()
    add_server(
        stack.home,
        "acme",
        "helpdesk",
        url=f"{stack.host_url}/mcp",
        credential_file=str(stack.secrets / "host-mcp.token"),
        tools=["tickets.search", "ticket.get", "customer.get"],
        facts={"host_ticket": "ticket.get"},
    )


def _receipt_keys(stack: Stack) -> str:
    """The approval receipts' public key set, which the systems of record verify with."""
    receipt_keys.ensure(stack.secrets, stack.config)
    return str(stack.config / receipt_keys.PUBLIC)


def _start_fake(stack: Stack, name: str) -> str:
    ready = stack.home / f"{name}.url"
    ready.unlink(missing_ok=True)
    stack._spawn(
        name,
        [
            sys.executable,
            "-m",
            f"fakes.{name}",
            "--port",
            "0",
            "--token-file",
            str(stack.secrets / f"{name}.token"),
            "--ready-file",
            str(ready),
            "--receipt-keys-file",
            _receipt_keys(stack),
        ],
        {},
    )
    return wait_file(ready, stack.procs[name], 20).strip()


def wait_file(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> str:
    """What a process writes to `path` once it is ready (it exits or times out: an error)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before writing {path}")
        time.sleep(0.02)
    raise RuntimeError(f"{path} did not appear within {timeout}s")
