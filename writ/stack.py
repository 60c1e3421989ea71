"""A whole Writ deployment on one machine: infrastructure, database, secrets, six processes.

`writ run` uses it for the demo and the end-to-end tests use it to drive real processes. Each
service process gets an environment built from nothing, holding only its own settings (the CRM
credential's path is given to the dispatcher and to no one else) and, under `writ run`, the
user's `OTEL_*` and `WRIT_*` settings (`Stack.inherit`).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import anyio
import asyncpg
import httpx
import jwt
import nats
import nats.aio.client
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from libs import lifetime
from libs.db import load_migrations, provision, provision_auditor, role_name, with_database
from libs.embedded import EmbeddedNats, EmbeddedPostgres
from libs.journal import AUDITOR_TABLES, DataKeys, SigningKey
from libs.natsauth import (
    ADMIN,
    AUDIT_ADMIN,
    JOURNALED,
    PROVISION,
    PROVISION_AUDIT,
    auth_config,
    ensure_passwords,
    host_user,
    inbox_prefix,
    seal_user,
)
from libs.provision import provision_bus, provision_record
from schemas import subjects
from writ import receipt_keys

__all__ = ["JOURNALS", "NOT_INHERITED", "SERVICES", "Stack", "mint_token"]

# `WRIT_*` variables `writ run` reads for itself or decides per service: they never reach a
# service from the user's environment (WRIT_DATABASE_URL names the administrator's database).
NOT_INHERITED: Final = frozenset(
    {
        "WRIT_NATS_URL",
        "WRIT_NATS_USER",
        "WRIT_NATS_PASSWORD_FILE",
        "WRIT_DATABASE_URL",
        "WRIT_DATABASE_PASSWORD_FILE",
        "WRIT_HTTP_PORT",
        "WRIT_HTTP_PORT_FILE",
        "WRIT_METRICS_PORT",
        "WRIT_METRICS_PORT_FILE",
        "WRIT_INSTANCE",
        "WRIT_API_URL",
        "WRIT_RECEIPT_SIGNING_KEY_FILE",  # admission's alone, never passed to every service
    }
)

# Migration order: a service may grant on tables of a service migrated before it.
SERVICES: Final = ("retrieval", "planner", "governance", "admission", "dispatcher", "ingress")
_WITH_DATABASE: Final = ("retrieval", "planner", "governance", "admission", "dispatcher")
# The services that keep an audit journal (and record its checkpoints in WRIT_AUDIT).
JOURNALS: Final = ("planner", "governance", "admission", "dispatcher")
_DEMO: Final = Path(__file__).parent / "demo"
AUDIENCE: Final = "writ"
POLICY_KEY_ID: Final = "org-1"


def mint_token(
    private_key_pem: bytes,
    *,
    issuer: str,
    tenant: str,
    principal: str,
    ttl_s: float = 300.0,
    audience: str = AUDIENCE,
    now: datetime | None = None,
    **extra: object,
) -> str:
    """An EdDSA-signed JWT as a host would send it."""
    issued = now or datetime.now(UTC)
    claims = {
        "iss": issuer,
        "aud": audience,
        "sub": principal,
        "tenant": tenant,
        "iat": issued,
        "exp": issued + timedelta(seconds=ttl_s),
        "jti": secrets.token_hex(8),
        **extra,
    }
    return jwt.encode(claims, private_key_pem, algorithm="EdDSA")


def _migrations() -> dict[str, list]:
    root = Path(__file__).resolve().parent.parent / "services"
    return {name: load_migrations(name, root / name / "migrations") for name in _WITH_DATABASE}


class Stack:
    """Everything `make run` starts, under one home folder."""

    def __init__(
        self,
        home: Path,
        *,
        nats_url: str | None = None,
        admin_dsn: str | None = None,
        database: str = "writ",
        decisions_file: Path | None = None,
        tenants: tuple[str, ...] = ("acme", "globex"),
        durable_pg: bool = True,
        extra_env: dict[str, dict[str, str]] | None = None,
        http_port: int = 0,
        nats_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.home = Path(home).resolve()
        self.database = database
        self.tenants = tenants
        self.decisions_file = decisions_file or _DEMO / "decisions.json"
        self._nats_url, self._admin_dsn = nats_url, admin_dsn
        self.embedded_nats: EmbeddedNats | None = None
        self.embedded_pg: EmbeddedPostgres | None = None
        # What starts the embedded NATS: `EmbeddedNats`, or (the soak's cluster topology) an
        # equivalent that runs several nodes behind the same `url`, `start` and `stop`.
        self._nats_factory = nats_factory or EmbeddedNats
        self._durable_pg = durable_pg
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # Which service each running instance is (`start_instance`), for a supervisor to
        # restart it; the lock keeps a stop and a supervisor's restart from crossing.
        self.instances: dict[str, str] = {}
        self.lock = threading.RLock()
        # Per-service (or "*" for all) extra WRIT_* settings, e.g. short leases in fault tests.
        self.extra_env = extra_env or {}
        # The user's settings passed on to every service (`inherit`); nothing by default.
        self.inherited_env: dict[str, str] = {}
        self.crm_url = ""
        self.payments_url = ""
        self.host_url = ""  # the simulated host product (fakes/host/): MCP + REST
        # The HTTP API's port: 0 lets ingress take a free one (`api_url` reads which).
        self.http_port = http_port
        self.secrets = self.home / "secrets"
        self.config = self.home / "config"
        self.logs = self.home / "logs"
        self.policies = self.home / "policies"

    # -- infrastructure ---------------------------------------------------------------------

    @property
    def nats_url(self) -> str:
        """The NATS server in use, as its administrator (operators' tooling, tests' inspection).

        An embedded server authenticates every client (libs/natsauth.py); a server named by
        `WRIT_NATS_URL` is used as it is given.
        """
        assert self._nats_url is not None
        if self.embedded_nats is None:
            return self._nats_url
        password = self.nats_password(ADMIN)
        return self._nats_url.replace("nats://", f"nats://{ADMIN}:{password}@", 1)

    @property
    def record_nats_url(self) -> str:
        """The NATS server as the audit record's administrator (`audit-admin`, in the record's
        own account): `writ audit verify`, export and re-anchor, tests' inspection."""
        assert self._nats_url is not None
        if self.embedded_nats is None:
            return self._nats_url
        password = self.nats_password(AUDIT_ADMIN)
        return self._nats_url.replace("nats://", f"nats://{AUDIT_ADMIN}:{password}@", 1)

    @property
    def public_nats_url(self) -> str:
        """The NATS server's URL without anyone's credentials (to print, to give hosts)."""
        assert self._nats_url is not None
        return self._nats_url

    def nats_password(self, user: str) -> str:
        """A NATS user's password (its secret file)."""
        return (self.secrets / f"nats-{user}.password").read_text().strip()

    def nats_options(self, user: str) -> dict[str, str]:
        """`nats.connect` keyword arguments to connect as `user` (its own inbox prefix)."""
        if self.embedded_nats is None:
            return {}
        return {
            "user": user,
            "password": self.nats_password(user),
            "inbox_prefix": inbox_prefix(user),
        }

    async def host_connection(self, tenant: str, **options: Any) -> nats.aio.client.Client:
        """A connection as the tenant's host, with exactly the host's NATS permissions."""
        assert self._nats_url is not None
        return await nats.connect(
            self._nats_url,
            max_reconnect_attempts=-1,
            **self.nats_options(host_user(tenant)),
            **options,
        )

    @property
    def admin_dsn(self) -> str:
        """The administrator's DSN (migrations, seeding, tests' inspection)."""
        assert self._admin_dsn is not None
        return self._admin_dsn

    @property
    def database_dsn(self) -> str:
        """The administrator's DSN for Writ's database."""
        return with_database(self.admin_dsn, self.database)

    def start_infrastructure(self) -> None:
        """Start embedded NATS and Postgres unless real ones were named."""
        for folder in (self.secrets, self.config, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        self.secrets.chmod(0o700)
        if self._nats_url is None:
            self.embedded_nats = self._nats_factory(self.home / "nats", auth=self._nats_auth())
            self.embedded_nats.start()
            self._nats_url = self.embedded_nats.url
        # For operators' `writ` commands: the administrator's URL, password included.
        _write_secret(self.home / "nats.url", self.nats_url)
        _write_secret(self.home / "nats-audit.url", self.record_nats_url)
        if self._admin_dsn is None:
            self.embedded_pg = EmbeddedPostgres(self.home / "postgres", durable=self._durable_pg)
            self.embedded_pg.start()
            self._admin_dsn = self.embedded_pg.admin_url

    def _nats_auth(self) -> str:
        """Generate (once) a password per NATS user; the server's users and permissions."""
        return auth_config(ensure_passwords(self.secrets, self.tenants), self.tenants)

    def start_all(self) -> None:
        """Infrastructure, database, the fakes and the six services, ready to serve."""
        self.start_infrastructure()
        anyio.run(self.provision)
        self.start_crm()
        self.start_host()
        self.start_services()
        anyio.run(self.wait_ready)

    async def provision(self) -> None:
        """Database, roles, migrations, secrets and the demo's tenants, documents and grants."""
        await self._retire_shared_host_streams()
        passwords = {}
        for name in _WITH_DATABASE:
            path = self.secrets / f"pg-{name}.password"
            if path.exists():
                passwords[name] = path.read_text().strip()
        passwords = await provision(self.admin_dsn, self.database, _migrations(), passwords)
        for name, password in passwords.items():
            _write_secret(self.secrets / f"pg-{name}.password", password)
        await self._auditor()
        await self._eval_recorder()
        for connector in ("crm", "payments", "host-mcp", "host-rest"):
            token = self.secrets / f"{connector}.token"
            if not token.exists():
                _write_secret(token, secrets.token_urlsafe(32))
        keys = {}
        for tenant in self.tenants:
            private = self.secrets / f"host-{tenant}.pem"
            if not private.exists():
                key = Ed25519PrivateKey.generate()
                _write_secret(
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
                "issuer": self.issuer(tenant),
                "public_key": public.decode(),
                "principals": "email",  # the demo tenants' principals are e-mail addresses
            }
        # Tenants registered with `writ tenant add` stay; the demo tenants are rewritten.
        registered = self.config / "tenant-keys.json"
        known = json.loads(registered.read_text()) if registered.exists() else {}
        registered.write_text(json.dumps({**known, **keys}, indent=2))
        # The organisation's policy signing key: governance holds the public half only.
        signing = self.secrets / "policy-signing.pem"
        if not signing.exists():
            _write_secret(
                signing,
                Ed25519PrivateKey.generate()
                .private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
                .decode(),
            )
        public = (
            serialization.load_pem_private_key(signing.read_bytes(), password=None)
            .public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        (self.config / "policy-keys.json").write_text(
            json.dumps({POLICY_KEY_ID: public.decode()}, indent=2)
        )
        self.policies.mkdir(exist_ok=True)
        self._journal_keys()
        receipt_keys.ensure(self.secrets, self.config)
        await self._seed_demo()
        await self.provision_bus()

    async def provision_bus(self) -> None:
        """Every stream, durable consumer and bucket, as `writ nats provision` does, connected
        as provisioning's identity (libs/provision.py): the services find them made. The
        tenants are the demo's and every one registered (`config/tenant-keys.json`); the
        limits are the ones the services are configured with (`extra_env`)."""
        registered = json.loads((self.config / "tenant-keys.json").read_text())
        tenants = sorted({*self.tenants, *registered})
        dispatcher = self.service_env("dispatcher")
        nc = await nats.connect(
            self._nats_url or self.nats_url,
            **(self.nats_options(PROVISION) if self.embedded_nats is not None else {}),
        )
        try:
            await provision_bus(
                nc.jetstream(),
                tenants,
                replicas=int(dispatcher.get("WRIT_STREAM_REPLICAS", "1")),
                duplicate_window_s=float(dispatcher.get("WRIT_DUPLICATE_WINDOW_S", "0")),
                dispatcher_lease_s=float(dispatcher.get("WRIT_LEASE_S", "30")),
            )
        finally:
            await nc.close()
        nc = await nats.connect(
            self._nats_url or self.nats_url,
            **(self.nats_options(PROVISION_AUDIT) if self.embedded_nats is not None else {}),
        )
        try:
            await provision_record(
                nc.jetstream(), replicas=int(dispatcher.get("WRIT_STREAM_REPLICAS", "1"))
            )
        finally:
            await nc.close()

    async def _retire_shared_host_streams(self) -> None:
        """Delete the streams one `WRIT_IN` / `WRIT_OUT` for every tenant that deployments
        before per-tenant streams declared: their subjects overlap the tenants' own, which
        ingress could not declare beside them. What they held is not carried over."""
        nc = await nats.connect(self.nats_url)
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

    def _journal_keys(self) -> None:
        """Each service's journal keys (its own secrets), the public halves for `writ audit`,
        and the auditor's DSN."""
        public_file = self.config / "journal-keys.json"
        public = json.loads(public_file.read_text()) if public_file.exists() else {}
        for name in _WITH_DATABASE:
            signing = self.secrets / f"journal-{name}-signing.json"
            if not signing.exists():
                _write_secret(signing, SigningKey.generate(f"{name}-1").to_json())
            key = SigningKey.from_json(signing.read_text())
            # Keep retired public keys: checkpoints they signed must still verify.
            public.setdefault(name, {})[key.key_id] = key.public_pem()
            data = self.secrets / f"journal-{name}-data.json"
            if not data.exists():
                _write_secret(data, DataKeys.generate(f"{name}-data-1"))
        public_file.write_text(json.dumps(public, indent=2))

    async def _auditor(self) -> None:
        """The auditor's read-only role and its DSN (`writ audit` reads it): the journals, and
        the planner's record of runs that replay compares them with. Nothing else, no write."""
        path = self.secrets / "pg-auditor.password"
        password = await provision_auditor(
            self.admin_dsn,
            self.database,
            AUDITOR_TABLES,
            path.read_text().strip() if path.exists() else None,
        )
        _write_secret(path, password)
        _write_secret(
            self.secrets / "audit.dsn",
            with_database(
                self.admin_dsn,
                self.database,
                user=role_name(self.database, "auditor"),
                password=password,
            ),
        )

    async def _eval_recorder(self) -> None:
        """The role `writ eval record` journals a report's digest as: it may call one function
        that writes one `eval.report` row in the planner's journal, nothing else
        (writ/eval/_record.py); its DSN."""
        from writ.eval._record import provision_eval_recorder

        path = self.secrets / "pg-eval.password"
        password = await provision_eval_recorder(
            self.admin_dsn, self.database, path.read_text().strip() if path.exists() else None
        )
        _write_secret(path, password)
        _write_secret(
            self.secrets / "eval.dsn",
            with_database(
                self.admin_dsn,
                self.database,
                user=role_name(self.database, "eval"),
                password=password,
            ),
        )

    def issuer(self, tenant: str) -> str:
        """The issuer name of a tenant's host."""
        return f"https://{tenant}.example/host"

    def host_key(self, tenant: str) -> bytes:
        """The private key a tenant's host signs with (the demo plays the host)."""
        return (self.secrets / f"host-{tenant}.pem").read_bytes()

    def token(self, tenant: str, principal: str, **kwargs: Any) -> str:
        """A token as the tenant's host would mint it."""
        return mint_token(
            self.host_key(tenant),
            issuer=self.issuer(tenant),
            tenant=tenant,
            principal=principal,
            **kwargs,
        )

    def write_policy(self, tenant: str, document: object, *, sign: bool = True) -> None:
        """Install an org policy file for `tenant`, signed with the organisation's key."""
        from services.governance.policy import PolicyDocument, sign_policy

        assert isinstance(document, PolicyDocument)
        key = serialization.load_pem_private_key(
            (self.secrets / "policy-signing.pem").read_bytes(), password=None
        )
        assert isinstance(key, Ed25519PrivateKey)
        data = sign_policy(document, key, POLICY_KEY_ID) if sign else b"{}"
        tmp = self.policies / f".{tenant}.json.tmp"
        tmp.write_bytes(data)
        tmp.replace(self.policies / f"{tenant}.json")

    async def _seed_demo(self) -> None:
        documents = json.loads((_DEMO / "documents.json").read_text())
        conn = await asyncpg.connect(self.database_dsn)
        try:
            await conn.executemany(
                "INSERT INTO retrieval.documents (tenant, document_id, kind, title, body) "
                "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                [
                    (d["tenant"], d["document_id"], d["kind"], d["title"], d["body"])
                    for d in documents
                ],
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
            # Scenario C: the helpdesk agent may comment on the host's tickets and read its
            # customers (personal data) without asking.
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

    # -- processes --------------------------------------------------------------------------

    def start_crm(self) -> None:
        """The simulated CRM and payment provider: real HTTP servers on loopback."""
        self.crm_url = self._start_fake("crm")
        self.payments_url = self._start_fake("payments")
        with httpx.Client(base_url=self.payments_url, timeout=5) as client:
            self.seed_payments(client)

    @staticmethod
    def seed_payments(client: httpx.Client, *, reset: bool = False) -> None:
        """The payment provider's demo payments (what `payment.refund` reads and refunds);
        `reset` forgets every payment, refund and charge first."""
        if reset:
            client.post("/_control/reset").raise_for_status()
        for payment in json.loads((_DEMO / "payments.json").read_text()):
            client.post("/_control/payments", json=payment).raise_for_status()

    # -- federation (scenario C): the host product --------------------------------------------

    def start_host(self, *, port: int = 0) -> None:
        """The simulated host product (its MCP server and its REST API), registered as the
        `helpdesk` MCP server of tenant acme. Two credentials: the MCP one only retrieval is
        given (through the registration), the REST one only the dispatcher."""
        from writ.mcp import add_server

        ready = self.home / "host.url"
        ready.unlink(missing_ok=True)
        # Its authorization server knows one OAuth client, for registrations that use client
        # credentials instead of the static token (`oauth_client_secret`).
        clients = self.secrets / "host-oauth-clients.json"
        if not clients.exists():
            _write_secret(clients, json.dumps({"writ-retrieval": secrets.token_urlsafe(32)}))
        self._spawn(
            "host",
            [
                sys.executable,
                "-m",
                "fakes.host",
                "--port",
                str(port),
                "--mcp-token-file",
                str(self.secrets / "host-mcp.token"),
                "--rest-token-file",
                str(self.secrets / "host-rest.token"),
                "--oauth-clients-file",
                str(clients),
                "--ready-file",
                str(ready),
                "--receipt-keys-file",
                self._receipt_keys(),
            ],
            {},
        )
        self.host_url = _wait_file(ready, self.procs["host"], 20).strip()
        add_server(
            self.home,
            "acme",
            "helpdesk",
            url=f"{self.host_url}/mcp",
            credential_file=str(self.secrets / "host-mcp.token"),
            tools=["tickets.search", "ticket.get", "customer.get"],
            facts={"host_ticket": "ticket.get"},
        )

    def _receipt_keys(self) -> str:
        """The approval receipts' public key set, which the systems of record verify with."""
        receipt_keys.ensure(self.secrets, self.config)
        return str(self.config / receipt_keys.PUBLIC)

    def _start_fake(self, name: str) -> str:
        ready = self.home / f"{name}.url"
        ready.unlink(missing_ok=True)
        self._spawn(
            name,
            [
                sys.executable,
                "-m",
                f"fakes.{name}",
                "--port",
                "0",
                "--token-file",
                str(self.secrets / f"{name}.token"),
                "--ready-file",
                str(ready),
                "--receipt-keys-file",
                self._receipt_keys(),
            ],
            {},
        )
        return _wait_file(ready, self.procs[name], 20).strip()

    def service_env(self, name: str) -> dict[str, str]:
        """Exactly what one service process is given; nothing is inherited from this process."""
        env = {
            "WRIT_NATS_URL": self._nats_url or "",
            "WRIT_INSTANCE": f"{name}-0",
            "WRIT_METRICS_PORT": "0",
            "WRIT_METRICS_PORT_FILE": str(self.home / f"{name}.metrics-port"),
        }
        if self.embedded_nats is not None:
            # Each service connects as itself, held by the server to its own subjects.
            env["WRIT_NATS_USER"] = name
            env["WRIT_NATS_PASSWORD_FILE"] = str(self.secrets / f"nats-{name}.password")
            if name in JOURNALED:  # its sealer connects again, as its own user
                env["WRIT_SEAL_NATS_PASSWORD_FILE"] = str(
                    self.secrets / f"nats-{seal_user(name)}.password"
                )
        if name in _WITH_DATABASE:
            env["WRIT_DATABASE_URL"] = with_database(
                self.admin_dsn, self.database, user=role_name(self.database, name), password=""
            )
            env["WRIT_DATABASE_PASSWORD_FILE"] = str(self.secrets / f"pg-{name}.password")
            env["WRIT_JOURNAL_SIGNING_KEY_FILE"] = str(
                self.secrets / f"journal-{name}-signing.json"
            )
            env["WRIT_JOURNAL_DATA_KEYS_FILE"] = str(self.secrets / f"journal-{name}-data.json")
        if name == "admission":  # the approval receipts' signing key is admission's alone
            env["WRIT_RECEIPT_SIGNING_KEY_FILE"] = str(self.secrets / receipt_keys.SIGNING)
        if name == "ingress":
            env["WRIT_TENANT_KEYS_FILE"] = str(self.config / "tenant-keys.json")
            env["WRIT_RECEIPT_KEYS_FILE"] = str(self.config / receipt_keys.PUBLIC)
            env["WRIT_AGENTS_DIR"] = str(_DEMO / "agents")  # names only: UNKNOWN_AGENT
            env["WRIT_HTTP_PORT"] = str(self.http_port)
            env["WRIT_HTTP_PORT_FILE"] = str(self.home / "ingress.http-port")
        if name == "governance":
            env["WRIT_POLICY_DIR"] = str(self.policies)
            env["WRIT_POLICY_KEYS_FILE"] = str(self.config / "policy-keys.json")
        if name == "planner":
            env["WRIT_DECISIONS_FILE"] = str(self.decisions_file)
            env["WRIT_AGENTS_DIR"] = str(_DEMO / "agents")
        if name == "retrieval":
            env["WRIT_MCP_SERVERS_FILE"] = str(self.config / "mcp-servers.json")
        if name == "dispatcher":
            if self.host_url:
                env["WRIT_HOST_URL"] = self.host_url
                env["WRIT_HOST_TOKEN_FILE"] = str(self.secrets / "host-rest.token")
            env["WRIT_CRM_URL"] = self.crm_url
            env["WRIT_CRM_TOKEN_FILE"] = str(self.secrets / "crm.token")
            env["WRIT_PAYMENTS_URL"] = self.payments_url
            env["WRIT_PAYMENTS_TOKEN_FILE"] = str(self.secrets / "payments.token")
        return {
            **self.inherited_env,
            **env,
            **self.extra_env.get("*", {}),
            **self.extra_env.get(name, {}),
        }

    def inherit(self, environ: Mapping[str, str]) -> dict[str, str]:
        """Pass the user's settings on to every service (what `writ run` does): each `OTEL_*`
        variable and each `WRIT_*` one except the deployment's own wiring (`NOT_INHERITED`),
        below what this deployment sets for a service itself. The variables passed on."""
        self.inherited_env = {
            key: value
            for key, value in environ.items()
            if key.startswith("OTEL_") or (key.startswith("WRIT_") and key not in NOT_INHERITED)
        }
        return self.inherited_env

    def start_services(self, names: tuple[str, ...] = SERVICES) -> None:
        """Each service as its own OS process, `writ service <name>`."""
        for name in names:
            self.start_instance(name, name)

    def start_instance(self, service: str, key: str) -> None:
        """One more process of `service`, known here as `key` (e.g. a second dispatcher)."""
        port_file = self.home / f"{key}.metrics-port"
        port_file.unlink(missing_ok=True)
        if service == "ingress":
            (self.home / "ingress.http-port").unlink(missing_ok=True)
        env = {
            **self.service_env(service),
            "WRIT_METRICS_PORT_FILE": str(port_file),
            "WRIT_INSTANCE": key,
        }
        with self.lock:
            self._spawn(key, [sys.executable, "-m", "writ.cli", "service", service], env)
            self.instances[key] = service

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        base = {
            key: os.environ[key]
            for key in ("PATH", "LANG", "LC_ALL", "TZ", "HOME", "WRIT_LOG_LEVEL")
            if key in os.environ
        }
        log = (self.logs / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            argv,
            env={**base, **env},
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lifetime.preexec(signal.SIGTERM),  # dies with `writ run`, if tied
        )
        log.close()

    async def wait_ready(self, names: tuple[str, ...] = SERVICES, timeout: float = 60) -> None:
        """Until every named service answers `$SRV.PING` (its consumers exist by then)."""
        want = {f"writ-{n}" for n in names}
        nc = await nats.connect(self.nats_url)
        try:
            deadline = time.monotonic() + timeout
            seen: set[str] = set()
            while time.monotonic() < deadline:
                for name, proc in self.procs.items():
                    if proc.poll() is not None:
                        raise RuntimeError(
                            f"{name} exited with {proc.returncode}:\n" + self.log_tail(name)
                        )
                seen = set()
                inbox = nc.new_inbox()
                sub = await nc.subscribe(inbox)
                await nc.publish("$SRV.PING", b"", reply=inbox)
                await nc.flush()
                end = time.monotonic() + 0.5
                while time.monotonic() < end:
                    try:
                        msg = await sub.next_msg(timeout=max(end - time.monotonic(), 0.01))
                    except nats.errors.TimeoutError:
                        break
                    if msg.data:  # an empty reply is the server's "no responders" status
                        seen.add(json.loads(msg.data)["name"])
                await sub.unsubscribe()
                if want <= seen:
                    return
            raise RuntimeError(f"services not ready: missing {sorted(want - seen)}")
        finally:
            await nc.close()

    @property
    def api_url(self) -> str:
        """The base URL of ingress's HTTP API (`/api/v1`)."""
        port = _wait_file(self.home / "ingress.http-port", self.procs["ingress"], 20)
        return f"http://127.0.0.1:{int(port)}/api/v1"

    def console_link(
        self,
        *,
        tenant: str = "acme",
        principal: str = "ops@acme.example",
        roles: tuple[str, ...] = ("approver", "auditor"),
        ttl_s: float = 3600.0,
        now: datetime | None = None,
    ) -> str:
        """A one-time sign-in link to the approval console (the demo approver by default).

        Its token is for the console's sign-in audience, which no API route takes: it opens
        one session, within `SIGN_IN_WINDOW_S` (ten minutes) of `now`, and that session lasts
        until the token's expiry (`ttl_s`)."""
        from services.ingress.logic import console_audience

        port = (self.home / "ingress.http-port").read_text().strip()
        token = self.token(
            tenant,
            principal,
            roles=list(roles),
            ttl_s=ttl_s,
            audience=console_audience(AUDIENCE),
            now=now,
        )
        return f"http://127.0.0.1:{int(port)}/console/sign-in?token={token}"

    def metrics_port(self, name: str) -> int:
        """The port of a service's `/metrics` endpoint."""
        return int(_wait_file(self.home / f"{name}.metrics-port", self.procs[name], 20))

    def log_tail(self, name: str, size: int = 4000) -> str:
        """The end of a process's log, for failure messages."""
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-size:] if path.exists() else ""

    def stop_process(self, name: str, *, kill: bool = False, timeout: float = 20) -> int | None:
        """SIGTERM (drain) or SIGKILL (crash) one process and wait for it (a supervisor does
        not restart a process stopped here)."""
        with self.lock:
            proc = self.procs.pop(name, None)
            self.instances.pop(name, None)
            if proc is None or proc.poll() is not None:
                return None if proc is None else proc.returncode
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()

    def stop(self, *, timeout: float = 20) -> None:
        """Stop every process, then the embedded servers.

        The services are told to drain all at once and waited for together (one after another,
        Ctrl-C on `make run` took the sum of six drains), then the fakes they were calling.
        """
        fakes = ("crm", "payments", "host")
        for group in ([n for n in self.procs if n not in fakes], list(fakes)):
            with self.lock:
                procs = [p for p in (self.procs.pop(n, None) for n in group) if p is not None]
                for name in group:
                    self.instances.pop(name, None)
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.embedded_nats is not None:
            self.embedded_nats.stop()
        if self.embedded_pg is not None:
            self.embedded_pg.stop()


def _write_secret(path: Path, value: str) -> None:
    path.write_text(value)
    path.chmod(0o600)


def _wait_file(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before writing {path}")
        time.sleep(0.02)
    raise RuntimeError(f"{path} did not appear within {timeout}s")
