"""The `Stack`: a whole deployment's infrastructure and processes under one home folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import anyio
import httpx
import nats
import nats.aio.client
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from libs import lifetime
from libs.db import with_database
from libs.embedded import EmbeddedNats, EmbeddedPostgres, free_port
from libs.natsauth import (
    ADMIN,
    AUDIT_ADMIN,
    auth_config,
    ensure_passwords,
    host_user,
    inbox_prefix,
)
from writ.stack import _fakes, _provision
from writ.stack._fakes import wait_file as _wait_file
from writ.stack._tokens import POLICY_KEY_ID, mint_token, write_secret
from writ.stack._wiring import DEMO as _DEMO
from writ.stack._wiring import wiring
from writ.tenants import host_dir, keys_file, registered, write_host_credentials

__all__ = ["JOURNALS", "NOT_INHERITED", "SERVICES", "Stack"]

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
# The services that keep an audit journal (and record its checkpoints in WRIT_AUDIT).
JOURNALS: Final = ("planner", "governance", "admission", "dispatcher")


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
        # The tenants whose hosts the demo plays (it generates their keys). The deployment's
        # tenants are the registered ones (`config/tenant-keys.json`, `writ tenant add`); these
        # are registered when the deployment is made.
        self.demo_tenants = tenants
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
        # The HTTP API's port: 0 takes the one this deployment chose before (remembered in
        # `config/deployment.json`), or a free one the first time.
        self.http_port = http_port
        self.secrets = self.home / "secrets"
        self.config = self.home / "config"
        self.logs = self.home / "logs"
        self.policies = self.home / "policies"
        # Attached (`attach`) to a deployment whose embedded server another process started.
        self._attached = False
        # Being made now (never started before): the demo's tenants are registered with it.
        self.new = (
            not (self.config / "deployment.json").exists() or not keys_file(self.home).exists()
        )

    @classmethod
    def attach(cls, home: Path) -> Stack:
        """The deployment made under `home`, from another process than the one running it
        (`writ tenant`): its NATS server and ports as it recorded them.

        Raises:
            FileNotFoundError: no deployment was ever started there.
        """
        stack = cls(home)
        found = stack._deployment()
        if not found:
            raise FileNotFoundError(f"no deployment under {stack.home} (start it with `writ run`)")
        stack._nats_url = str(found["nats_url"])
        stack.http_port = int(found["http_port"])
        stack._attached = bool(found["embedded_nats"])
        stack.new = False
        return stack

    @property
    def authenticated(self) -> bool:
        """Whether the NATS server is the deployment's own embedded one, which knows every
        user (libs/natsauth.py); a server named by `WRIT_NATS_URL` is used as it is given."""
        return self.embedded_nats is not None or self._attached

    def reload_nats(self, tenants: list[str] | None = None) -> bool:
        """Apply the accounts and users of `tenants` (default: the registered ones; each
        one's password made if it has none) to the deployment's running embedded server,
        without a restart; whether one ran. Clients stay connected."""
        if not self.authenticated:
            return False
        server = self.embedded_nats
        if server is None:
            server = EmbeddedNats(self.home / "nats", port=int(self._deployment()["nats_port"]))
        if not server.serving():
            return False
        server.reload(self._nats_auth(tenants))
        return True

    # -- infrastructure ---------------------------------------------------------------------

    @property
    def nats_url(self) -> str:
        """The NATS server in use, as its administrator (operators' tooling, tests' inspection).

        An embedded server authenticates every client (libs/natsauth.py); a server named by
        `WRIT_NATS_URL` is used as it is given.
        """
        assert self._nats_url is not None
        if not self.authenticated:
            return self._nats_url
        password = self.nats_password(ADMIN)
        return self._nats_url.replace("nats://", f"nats://{ADMIN}:{password}@", 1)

    @property
    def record_nats_url(self) -> str:
        """The NATS server as the audit record's administrator (`audit-admin`, in the record's
        own account): `writ audit verify`, export and re-anchor, tests' inspection."""
        assert self._nats_url is not None
        if not self.authenticated:
            return self._nats_url
        password = self.nats_password(AUDIT_ADMIN)
        return self._nats_url.replace("nats://", f"nats://{AUDIT_ADMIN}:{password}@", 1)

    @property
    def public_nats_url(self) -> str:
        """The NATS server's URL without anyone's credentials (to print)."""
        assert self._nats_url is not None
        return self._nats_url

    def tenants(self) -> list[str]:
        """The deployment's tenants: the registered ones, and the demo's while it is made."""
        return sorted({*registered(self.home), *(self.demo_tenants if self.new else ())})

    def host_credentials(self, tenant: str) -> Path:
        """The folder of what a tenant's host is given (writ/tenants.py, `HOST_FILES`):
        its NATS URL with its own user and password, its inbox prefix, the HTTP API's base
        URL, its issuer and, if Writ made its key pair, its signing key."""
        return host_dir(self.home, tenant)

    def host_nats_url(self, tenant: str) -> str:
        """The NATS server's URL as the tenant's host (its user and password in it); a server
        named by `WRIT_NATS_URL` as it is given."""
        assert self._nats_url is not None
        if not self.authenticated:
            return self._nats_url
        user = host_user(tenant)
        password = quote(self.nats_password(user), safe="")
        return self._nats_url.replace("nats://", f"nats://{user}:{password}@", 1)

    def _deployment(self) -> dict[str, Any]:
        path = self.config / "deployment.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def write_host_credentials(self, tenant: str, *, signing_pem: bytes | None = None) -> Path:
        """Write a tenant's host credentials (`host_credentials`); a demo tenant's signing key
        is the one the demo signs with."""
        demo_key = self.secrets / f"host-{tenant}.pem"
        if signing_pem is None and demo_key.exists():
            signing_pem = demo_key.read_bytes()
        return write_host_credentials(
            self.home,
            tenant,
            nats_url=self.host_nats_url(tenant),
            inbox=inbox_prefix(host_user(tenant)),
            api_url=f"http://127.0.0.1:{self.http_port}/api/v1",
            issuer=self.issuer(tenant),
            signing_pem=signing_pem,
        )

    def nats_password(self, user: str) -> str:
        """A NATS user's password (its secret file)."""
        return (self.secrets / f"nats-{user}.password").read_text().strip()

    def nats_options(self, user: str) -> dict[str, str]:
        """`nats.connect` keyword arguments to connect as `user` (its own inbox prefix)."""
        if not self.authenticated:
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
        # The ports are chosen once and kept: what hosts were given stays true after a restart.
        remembered = self._deployment()
        self.http_port = self.http_port or int(remembered.get("http_port", 0)) or free_port()
        if self._nats_url is None:
            options: dict[str, Any] = {"auth": self._nats_auth()}
            if self._nats_factory is EmbeddedNats:
                options["port"] = int(remembered.get("nats_port", 0)) or free_port()
            self.embedded_nats = self._nats_factory(self.home / "nats", **options)
            self.embedded_nats.start()
            self._nats_url = self.embedded_nats.url
        (self.config / "deployment.json").write_text(
            json.dumps(
                {
                    "nats_url": self.public_nats_url,
                    "nats_port": int(getattr(self.embedded_nats, "port", 0)),
                    "embedded_nats": self.embedded_nats is not None,
                    "http_port": self.http_port,
                },
                indent=2,
            )
        )
        # For operators' `writ` commands: the administrators' URLs, passwords included. No
        # host is given either (a host's are under `hosts/<tenant>/`).
        write_secret(self.home / "nats-admin.url", self.nats_url)
        # Where deployments made before kept the administrator's URL, under a name a host
        # could take for its own.
        (self.home / "nats.url").unlink(missing_ok=True)
        write_secret(self.home / "nats-audit.url", self.record_nats_url)
        if self._admin_dsn is None:
            self.embedded_pg = EmbeddedPostgres(self.home / "postgres", durable=self._durable_pg)
            self.embedded_pg.start()
            self._admin_dsn = self.embedded_pg.admin_url

    def _nats_auth(self, tenants: list[str] | None = None) -> str:
        """Generate (once) a password per NATS user; the server's users and permissions for
        `tenants` (default: the deployment's)."""
        tenants = self.tenants() if tenants is None else tenants
        return auth_config(ensure_passwords(self.secrets, tenants), tenants)

    def start_all(self) -> None:
        """Infrastructure, database, the fakes and the six services, ready to serve."""
        self.start_infrastructure()
        anyio.run(self.provision)
        self.start_crm()
        self.start_host()
        self.start_services()
        anyio.run(self.wait_ready)

    async def provision(self) -> None:
        """Database, roles, migrations, secrets, the demo's tenants, documents and grants, the
        bus, and each tenant's host credentials (writ/stack/_provision.py)."""
        await _provision.provision(self)

    async def provision_bus(self) -> None:
        """Every stream, durable consumer and bucket, as `writ nats provision` does."""
        await _provision.provision_bus(self)

    async def _retire_shared_host_streams(self) -> None:
        await _provision.retire_shared_host_streams(self)

    def issuer(self, tenant: str) -> str:
        """The issuer name of a tenant's host: the registered one, or the demo's."""
        path = keys_file(self.home)
        entry = json.loads(path.read_text()).get(tenant) if path.exists() else None
        return str(entry["issuer"]) if entry else f"https://{tenant}.example/host"

    def host_key(self, tenant: str) -> bytes:
        """The private key a tenant's host signs with (the demo plays the host; a tenant added
        without a key of its own has it in its host credentials)."""
        demo = self.secrets / f"host-{tenant}.pem"
        if demo.exists():
            return demo.read_bytes()
        return (self.host_credentials(tenant) / "signing.pem").read_bytes()

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

    # -- processes --------------------------------------------------------------------------

    def start_crm(self) -> None:
        """The simulated CRM and payment provider: real HTTP servers on loopback."""
        _fakes.start_crm(self)

    @staticmethod
    def seed_payments(client: httpx.Client, *, reset: bool = False) -> None:
        """The payment provider's demo payments (what `payment.refund` reads and refunds);
        `reset` forgets every payment, refund and charge first."""
        _fakes.seed_payments(client, reset=reset)

    def start_host(self, *, port: int = 0) -> None:
        """The simulated host product (its MCP server and its REST API), registered as the
        `helpdesk` MCP server of tenant acme (writ/stack/_fakes.py)."""
        _fakes.start_host(self, port=port)

    def service_env(self, name: str) -> dict[str, str]:
        """Exactly what one service process is given; nothing is inherited from this process."""
        return {
            **self.inherited_env,
            **wiring(self, name),
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
        return _provision.console_link(
            self, tenant=tenant, principal=principal, roles=roles, ttl_s=ttl_s, now=now
        )

    def operator_link(self, principal: str, *, tenant: str = "acme", ttl_s: float = 3600.0) -> str:
        """A one-time sign-in link for an operator, signed with the operators' key."""
        return _provision.operator_link(self, principal, tenant=tenant, ttl_s=ttl_s)

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
