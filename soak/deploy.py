"""The soak's deployment: `writ run`'s stack (embedded NATS and PostgreSQL, the fakes, the six
services), a second dispatcher and a second admission (whose outbox relay runs beside the
first's), short leases so a frozen holder is taken over within seconds, and `writ run`'s own
supervisor, which restarts every service process the nemesis kills.

The planner asks a model over the OpenAI-compatible API: the fake model (fakes/llm.py, on
loopback), whose rules answer each conversation by its state (`MODEL_RULES`) and whose request
log the checker reads. Both demo tenants are driven; globex gets the standing grants the demo
gives acme's note agents."""

from __future__ import annotations

import json
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import anyio
import asyncpg
import httpx
import nats
import nats.aio.client

from fakes.llm import SERIAL, FakeLlm
from libs.embedded import free_port
from libs.natsauth import ADMIN
from soak.settings import SoakSettings
from writ.stack import SERVICES, Stack
from writ.supervisor import Supervisor

__all__ = [
    "FAKES",
    "MODEL_RULES",
    "NOTE",
    "REPLICAS",
    "TALK",
    "TENANTS",
    "Deployment",
    "admin_connect",
    "approver",
    "principal",
]

TENANTS: Final = ("acme", "globex")  # both demo tenants (writ/stack/)


def principal(tenant: str) -> str:
    """Who the host says asks, in `tenant`."""
    return f"soak@{tenant}.example"


def approver(tenant: str) -> str:
    """Who approves refunds in `tenant` (not the principal who asked: separation of duties)."""
    return f"ops@{tenant}.example"


# The second instance of each service that runs twice (the name is the instance's key).
REPLICAS: Final = {"dispatcher-2": "dispatcher", "admission-2": "admission"}
FAKES: Final = ("crm", "payments")
# A provider call's timeout: a `slow` fault longer than this is an answer lost to the caller.
CALL_TIMEOUT_S: Final = 1.5
# The planner's wait for one model answer (a `slow` model past it is an answer lost).
MODEL_TIMEOUT_S: Final = 4.0
_DEMO_AGENTS: Final = Path(__file__).resolve().parent.parent / "writ" / "demo" / "agents"
# The note every run and every note-writing chat turn writes (ACME-42 exists in both tenants);
# the model's serial in it and in every answer tells the checker which answer was recorded.
NOTE: Final = {"customer_id": "ACME-42", "body": f"Soak note, model reply {SERIAL}."}
TALK: Final = "[talk]"  # in every message of a chat session that only talks


def _decision(next_: dict[str, Any]) -> dict[str, Any]:
    return {"content": json.dumps({"next": next_})}


# No observation yet: write the note (a talking session answers instead); after it: answer.
MODEL_RULES: Final = [
    {
        "when": ['"observations":[]', TALK],
        "reply": _decision(
            {"decision": "answer_directly", "answer": f"Happy to talk (model reply {SERIAL})."}
        ),
    },
    {
        "when": ['"observations":[]'],
        "reply": _decision(
            {
                "decision": "select_capability",
                "capability": "crm.note.create",
                "arguments": json.dumps(NOTE),
            }
        ),
    },
    {
        "reply": _decision(
            {"decision": "answer_directly", "answer": f"I added the note (model reply {SERIAL})."}
        )
    },
]


async def admin_connect(stack: Stack, **options: Any) -> nats.aio.client.Client:
    """The administrator's connection, credentials as options: a URL's own user and password
    would not go with the other cluster nodes the servers tell the client about."""
    return await nats.connect(
        stack.public_nats_url, user=ADMIN, password=stack.nats_password(ADMIN), **options
    )


class Deployment:
    """A `Stack` with replicas and a supervisor, and a log of what happened to it."""

    def __init__(self, settings: SoakSettings, home: Path) -> None:
        self.settings = settings
        self.home = home
        self.events = (home / "soak-events.log").open("a", buffering=1)
        self.model_token = secrets.token_urlsafe(16)
        self.model = FakeLlm(token=self.model_token)  # bound now: its URL goes to the planner
        key = home / "model.key"
        key.write_text(self.model_token)
        key.chmod(0o600)
        env = {
            "*": {"WRIT_DRAIN_TIMEOUT_S": "2"},
            "dispatcher": {
                "WRIT_LEASE_S": str(settings.lease_s),
                "WRIT_SWEEP_EVERY_S": "1",
                "WRIT_PENDING_GRACE_S": "10",
                "WRIT_CALL_TIMEOUT_S": str(CALL_TIMEOUT_S),
            },
            "planner": {
                "WRIT_PROVIDER": "openai",
                "WRIT_MODEL_URL": f"{self.model.url}/v1",
                "WRIT_MODEL_NAME": "soak-model",
                "WRIT_MODEL_KEY_FILE": str(key),
                "WRIT_MODEL_TIMEOUT_S": str(MODEL_TIMEOUT_S),
                "WRIT_AGENTS_DIR": str(self._agents(home / "agents")),
            },
        }
        nats_factory: Callable[..., Any] | None = None
        if settings.topology == "cluster":
            from soak.cluster import NatsCluster

            env["*"]["WRIT_STREAM_REPLICAS"] = "3"
            nats_factory = NatsCluster
        # A fixed HTTP port: a restarted ingress serves the chat load where it was.
        self.stack = Stack(
            home / "stack",
            database="soak",
            durable_pg=settings.durable_pg,
            extra_env=env,
            nats_factory=nats_factory,
            http_port=free_port(),
        )
        self.supervisor = Supervisor(self.stack, report=self.log, max_delay_s=5.0)

    @staticmethod
    def _agents(folder: Path) -> Path:
        """The demo's agents, each asking the OpenAI-compatible provider (the fake model)."""
        folder.mkdir(parents=True, exist_ok=True)
        for path in _DEMO_AGENTS.glob("*.json"):
            manifest = json.loads(path.read_text())
            manifest["provider"] = "openai"
            # The soak's chat load writes notes straight from a turn, as the fake model's rules
            # say; the demo agent's plan mode (a plan waits for the user) is the chat tests'.
            manifest.pop("plan_mode", None)
            (folder / path.name).write_text(json.dumps(manifest))
        return folder

    @property
    def model_url(self) -> str:
        return self.model.url

    def model_client(self, timeout: float = 30) -> httpx.AsyncClient:
        """The fake model's control API (its rules, its modes, its request log)."""
        return httpx.AsyncClient(
            base_url=self.model.url,
            timeout=timeout,
            headers={"Authorization": f"Bearer {self.model_token}"},
        )

    async def _prepare(self) -> None:
        async with self.model_client() as client:
            (await client.post("/_control/rules", json={"rules": MODEL_RULES})).raise_for_status()
        conn = await asyncpg.connect(self.stack.database_dsn)
        try:  # what the demo grants acme's note agents, globex's administrator grants too
            await conn.executemany(
                "INSERT INTO governance.standing_grants (tenant, agent, family, granted_by) "
                "VALUES ($1, $2, 'write_delete', $3) ON CONFLICT DO NOTHING",
                [
                    (tenant, agent, f"admin@{tenant}.example")
                    for tenant in TENANTS
                    for agent in ("crm-assistant", "chat-assistant")
                ],
            )
        finally:
            await conn.close()

    def log(self, kind: str, message: str) -> None:
        """One line in `soak-events.log` (and on stderr)."""
        line = f"{time.strftime('%H:%M:%S')} {kind:<10} {message}"
        self.events.write(line + "\n")
        print(line, file=sys.stderr, flush=True)

    @property
    def service_instances(self) -> dict[str, str]:
        """Every service instance the nemesis may kill: key -> service."""
        return {**{name: name for name in SERVICES}, **REPLICAS}

    def start(self) -> None:
        """Everything up and ready, then supervised."""
        self.model.start()
        self.stack.start_all()
        anyio.run(self._prepare)
        for key, service in REPLICAS.items():
            self.stack.start_instance(service, key)
        anyio.run(self.stack.wait_ready)
        self.supervisor.start()

    async def all_up(self, timeout: float = 60) -> None:
        """Until every instance runs again (the supervisor restarts the killed ones) and each
        service answers its ping."""
        with anyio.fail_after(timeout):
            while True:
                down = [
                    key
                    for key in self.service_instances
                    if (proc := self.stack.procs.get(key)) is None or proc.poll() is not None
                ]
                if not down:
                    break
                await anyio.sleep(0.2)
        await self.stack.wait_ready(timeout=timeout)

    def stop(self) -> None:
        """Stop supervising, then stop everything."""
        self.supervisor.stop()
        self.stack.stop()
        self.model.stop()
        self.events.close()
