"""Provisioning a local deployment before its services start: the database, its roles and
migrations, every secret, the demo's tenants, documents and grants, the bus, and each tenant's
host credentials. Idempotent: what exists is kept (passwords and keys included)."""

from __future__ import annotations

import json
import secrets
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import nats
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from libs.db import provision as provision_database
from libs.db import provision_auditor, role_name, with_database
from libs.journal import AUDITOR_TABLES, DataKeys, SigningKey
from libs.natsauth import PROVISION, PROVISION_AUDIT
from libs.provision import provision_bus as provision_streams
from libs.provision import provision_record
from schemas import subjects
from writ import receipt_keys
from writ.stack._tokens import AUDIENCE, POLICY_KEY_ID, migrations, write_secret
from writ.tenants import keys_file

if TYPE_CHECKING:
    from writ.stack._stack import Stack

__all__ = ["provision", "provision_bus", "retire_shared_host_streams"]

_WITH_DATABASE = ("retrieval", "planner", "governance", "admission", "dispatcher")
_DEMO = Path(__file__).resolve().parent.parent / "demo"


async def provision(stack: Stack) -> None:
    """Database, roles, migrations, secrets and the demo's tenants, documents and grants."""
    await retire_shared_host_streams(stack)
    passwords = {}
    for name in _WITH_DATABASE:
        path = stack.secrets / f"pg-{name}.password"
        if path.exists():
            passwords[name] = path.read_text().strip()
    passwords = await provision_database(stack.admin_dsn, stack.database, migrations(), passwords)
    for name, password in passwords.items():
        write_secret(stack.secrets / f"pg-{name}.password", password)
    await _auditor(stack)
    await _eval_recorder(stack)
    for connector in ("crm", "payments", "host-mcp", "host-rest"):
        token = stack.secrets / f"{connector}.token"
        if not token.exists():
            write_secret(token, secrets.token_urlsafe(32))
    keys = {}
    # The demo tenants' keys are registered when the deployment is made; from then on the
    # registry is the deployment's (`writ tenant add|remove` change it, a restart does not).
    for tenant in stack.demo_tenants if stack.new else ():
        private = stack.secrets / f"host-{tenant}.pem"
        if not private.exists():
            key = Ed25519PrivateKey.generate()
            write_secret(
                private,
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                ).decode(),
            )
        loaded = serialization.load_pem_private_key(private.read_bytes(), password=None)
        public = loaded.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        keys[tenant] = {
            "issuer": stack.issuer(tenant),
            "public_key": public.decode(),
            "principals": "email",  # the demo tenants' principals are e-mail addresses
        }
    if keys:  # one registered before (`writ tenant add` ahead of the first start) stays
        registry = keys_file(stack.home)
        known = json.loads(registry.read_text()) if registry.exists() else {}
        registry.parent.mkdir(parents=True, exist_ok=True)
        registry.write_text(json.dumps({**keys, **known}, indent=2))
    # The organisation's policy signing key: governance holds the public half only.
    signing = stack.secrets / "policy-signing.pem"
    public = _signing_key(signing)
    (stack.config / "policy-keys.json").write_text(
        json.dumps({POLICY_KEY_ID: public.decode()}, indent=2)
    )
    _operators_key(stack)
    stack.policies.mkdir(exist_ok=True)
    _journal_keys(stack)
    receipt_keys.ensure(stack.secrets, stack.config)
    await _seed_demo(stack)
    await provision_bus(stack)
    for tenant in stack.tenants():
        stack.write_host_credentials(tenant)
    stack.new = False


async def provision_bus(stack: Stack) -> None:
    """Every stream, durable consumer and bucket, as `writ nats provision` does, connected
    as provisioning's identity (libs/provision.py): the services find them made. The
    tenants are the demo's and every one registered (`config/tenant-keys.json`); the
    limits are the ones the services are configured with (`extra_env`)."""
    tenants = stack.tenants()
    dispatcher = stack.service_env("dispatcher")
    nc = await nats.connect(stack.public_nats_url, **stack.nats_options(PROVISION))
    try:
        await provision_streams(
            nc.jetstream(),
            tenants,
            replicas=int(dispatcher.get("WRIT_STREAM_REPLICAS", "1")),
            duplicate_window_s=float(dispatcher.get("WRIT_DUPLICATE_WINDOW_S", "0")),
            dispatcher_lease_s=float(dispatcher.get("WRIT_LEASE_S", "30")),
        )
    finally:
        await nc.close()
    nc = await nats.connect(stack.public_nats_url, **stack.nats_options(PROVISION_AUDIT))
    try:
        await provision_record(
            nc.jetstream(), replicas=int(dispatcher.get("WRIT_STREAM_REPLICAS", "1"))
        )
    finally:
        await nc.close()


async def retire_shared_host_streams(stack: Stack) -> None:
    """Delete the streams one `WRIT_IN` / `WRIT_OUT` for every tenant that deployments
    before per-tenant streams declared: their subjects overlap the tenants' own, which
    ingress could not declare beside them. What they held is not carried over."""
    nc = await nats.connect(stack.nats_url)
    try:
        js = nc.jetstream()
        for name, subject in (
            ("WRIT_IN", subjects.HOST_IN_FAMILY),
            ("WRIT_OUT", subjects.HOST_OUT_FAMILY),
        ):
            try:
                info = await js.stream_info(name)
            except nats.js.errors.NotFoundError:
                continue
            if list(info.config.subjects or []) == [subject]:
                print(
                    f"retiring stream {name} ({info.state.messages} messages): "
                    "each tenant has its own now",
                    file=sys.stderr,
                )
                await js.delete_stream(name)
    finally:
        await nc.close()


def _journal_keys(stack: Stack) -> None:
    """Each service's journal keys (its own secrets), the public halves for `writ audit`,
    and the auditor's DSN."""
    public_file = stack.config / "journal-keys.json"
    public = json.loads(public_file.read_text()) if public_file.exists() else {}
    for name in _WITH_DATABASE:
        signing = stack.secrets / f"journal-{name}-signing.json"
        if not signing.exists():
            write_secret(signing, SigningKey.generate(f"{name}-1").to_json())
        key = SigningKey.from_json(signing.read_text())
        # Keep retired public keys: checkpoints they signed must still verify.
        public.setdefault(name, {})[key.key_id] = key.public_pem()
        data = stack.secrets / f"journal-{name}-data.json"
        if not data.exists():
            write_secret(data, DataKeys.generate(f"{name}-data-1"))
    public_file.write_text(json.dumps(public, indent=2))


async def _auditor(stack: Stack) -> None:
    """The auditor's read-only role and its DSN (`writ audit` reads it): the journals, and
    the planner's record of runs that replay compares them with. Nothing else, no write."""
    path = stack.secrets / "pg-auditor.password"
    password = await provision_auditor(
        stack.admin_dsn,
        stack.database,
        AUDITOR_TABLES,
        path.read_text().strip() if path.exists() else None,
    )
    write_secret(path, password)
    write_secret(
        stack.secrets / "audit.dsn",
        with_database(
            stack.admin_dsn,
            stack.database,
            user=role_name(stack.database, "auditor"),
            password=password,
        ),
    )


async def _eval_recorder(stack: Stack) -> None:
    """The role `writ eval record` journals a report's digest as: it may call one function
    that writes one `eval.report` row in the planner's journal, nothing else
    (writ/eval/_record.py); its DSN."""
    from writ.eval._record import provision_eval_recorder

    path = stack.secrets / "pg-eval.password"
    password = await provision_eval_recorder(
        stack.admin_dsn, stack.database, path.read_text().strip() if path.exists() else None
    )
    write_secret(path, password)
    write_secret(
        stack.secrets / "eval.dsn",
        with_database(
            stack.admin_dsn,
            stack.database,
            user=role_name(stack.database, "eval"),
            password=password,
        ),
    )


async def _seed_demo(stack: Stack) -> None:
    documents = json.loads((_DEMO / "documents.json").read_text())
    conn = await asyncpg.connect(stack.database_dsn)
    try:
        await conn.executemany(
            "INSERT INTO retrieval.documents (tenant, document_id, kind, title, body) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            [(d["tenant"], d["document_id"], d["kind"], d["title"], d["body"]) for d in documents],
        )
        # Customer records `crm.customer.get` reads (retrieval's own read-only copy).
        customers = json.loads((_DEMO / "customers.json").read_text())
        await conn.executemany(
            "INSERT INTO retrieval.customers (tenant, customer_id, name, owner, email, "
            "status, notes) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
            [
                (
                    c["tenant"],
                    c["customer_id"],
                    c["name"],
                    c["owner"],
                    c["email"],
                    c["status"],
                    c["notes"],
                )
                for c in customers
            ],
        )
        # The demo agents may write to the CRM without asking: a standing grant for their
        # family, given by the tenant's administrator.
        await conn.executemany(
            "INSERT INTO governance.standing_grants (tenant, agent, family, granted_by) "
            "VALUES ('acme', $1, 'write_delete', 'admin@acme.example') "
            "ON CONFLICT DO NOTHING",
            [("crm-assistant",), ("research-assistant",), ("chat-assistant",)],
        )
        # Scenario C: the helpdesk agent may comment on the host's tickets without asking. Its
        # reads of the host's customers (an MCP tool) are covered only by a grant pinned to the
        # tool's classified digest (`writ.mcp.grant_pinned`, once an operator classified it).
        await conn.executemany(
            "INSERT INTO governance.standing_grants (tenant, agent, family, granted_by) "
            "VALUES ('acme', 'helpdesk-assistant', $1, 'admin@acme.example') "
            "ON CONFLICT DO NOTHING",
            [("write_delete",), ("read_personal",)],
        )
        # The host application's mail module: drafts and audiences `email.draft.apply`
        # reads (the dispatcher's role may read them, never change them).
        mail = json.loads((_DEMO / "mail.json").read_text())
        await conn.executemany(
            "INSERT INTO dispatcher.mail_drafts (tenant, draft_id, subject, body, segment) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            [
                (d["tenant"], d["draft_id"], d["subject"], d["body"], d["segment"])
                for d in mail["drafts"]
            ],
        )
        await conn.executemany(
            "INSERT INTO dispatcher.mail_audience (tenant, segment, address) "
            "VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            [(a["tenant"], a["segment"], a["address"]) for a in mail["audience"]],
        )
    finally:
        await conn.close()


def _operators_key(stack: Stack) -> None:
    """The operators' signing key (`writ console --operator` signs with it): ingress holds the
    public half only, and takes the role `operator` from no other key."""
    signing = stack.secrets / "operators-signing.pem"
    public = _signing_key(signing)
    (stack.config / "operators-key.pem").write_bytes(public)


def operator_link(stack: Stack, principal: str, *, tenant: str, ttl_s: float) -> str:
    """A one-time sign-in link for an operator (the console's MCP pages), signed with the
    deployment's operators' key: an identity no host can make."""
    from services.ingress.console._operators import mint_operator_token

    port = (stack.home / "ingress.http-port").read_text().strip()
    token = mint_operator_token(
        (stack.secrets / "operators-signing.pem").read_bytes(),
        tenant=tenant,
        principal=principal,
        ttl_s=ttl_s,
    )
    return f"http://127.0.0.1:{int(port)}/console/sign-in?token={token}"


def console_link(
    stack: Stack,
    *,
    tenant: str,
    principal: str,
    roles: tuple[str, ...],
    ttl_s: float,
    now: datetime | None,
) -> str:
    """A one-time sign-in link to the approval console, as `Stack.console_link` says."""
    from services.ingress.logic import console_audience

    port = (stack.home / "ingress.http-port").read_text().strip()
    token = stack.token(
        tenant,
        principal,
        roles=list(roles),
        ttl_s=ttl_s,
        audience=console_audience(AUDIENCE),
        now=now,
    )
    return f"http://127.0.0.1:{int(port)}/console/sign-in?token={token}"


def _signing_key(path: Path) -> bytes:
    """The public half (PEM) of the Ed25519 signing key at `path`, made there if missing."""
    if not path.exists():
        write_secret(
            path,
            Ed25519PrivateKey.generate()
            .private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            .decode(),
        )
    return (
        serialization.load_pem_private_key(path.read_bytes(), password=None)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
