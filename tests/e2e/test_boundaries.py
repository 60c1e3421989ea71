"""Authority boundaries, as deployed: who holds the CRM credential, what each role may touch,
and what every service shows operators (micro service discovery, `/metrics`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import nats
import pytest

from libs.db import role_name, with_database
from libs.settings import load_settings
from services.admission.__main__ import AdmissionSettings
from services.dispatcher.__main__ import DispatcherSettings
from services.governance.__main__ import GovernanceSettings
from services.ingress.__main__ import IngressSettings
from services.planner.__main__ import PlannerSettings
from services.retrieval.__main__ import RetrievalSettings
from tests.e2e.conftest import Host
from writ.stack import SERVICES, Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

NOT_DISPATCHER = [s for s in SERVICES if s != "dispatcher"]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


@pytest.mark.parametrize("name", SERVICES)
def test_every_service_runs_on_uvloop(stack: Stack, name: str) -> None:
    """`WRIT_EVENT_LOOP` defaults to uvloop: its loop is loaded in each service's process."""
    pid = stack.procs[name].pid
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "/uvloop/loop." in maps, f"{name} has no uvloop loaded"
    assert f"writ-{name} starting on uvloop" in (stack.logs / f"{name}.log").read_text(
        errors="replace"
    )


@pytest.mark.parametrize("name", NOT_DISPATCHER)
def test_only_the_dispatcher_is_given_the_crm_credential(stack: Stack, name: str) -> None:
    token = (stack.secrets / "crm.token").read_text().strip()
    env = _environ(stack.procs[name].pid)
    assert not any("CRM" in key for key in env), env.keys()
    assert not any(token in value or "crm.token" in value for value in env.values())
    cmdline = Path(f"/proc/{stack.procs[name].pid}/cmdline").read_bytes().decode()
    assert "crm" not in cmdline
    # The control: the dispatcher does get it, so the check above can see one.
    dispatcher = _environ(stack.procs["dispatcher"].pid)
    assert dispatcher["WRIT_CRM_TOKEN_FILE"].endswith("crm.token")


@pytest.mark.parametrize(
    "settings_type",
    [IngressSettings, RetrievalSettings, PlannerSettings, GovernanceSettings, AdmissionSettings],
)
def test_no_other_service_has_a_setting_that_could_hold_it(settings_type: type) -> None:
    env = {
        "WRIT_NATS_URL": "nats://x",
        "WRIT_DATABASE_URL": "postgresql://x",
        "WRIT_DATABASE_PASSWORD_FILE": "/p",
        "WRIT_TENANT_KEYS_FILE": "/k",
        "WRIT_DECISIONS_FILE": "/d",
        "WRIT_CRM_URL": "http://crm",
        "WRIT_CRM_TOKEN_FILE": "/secrets/crm.token",
    }
    settings: Any = load_settings(settings_type, env)
    assert "crm.token" not in repr(settings)
    assert "crm" in repr(load_settings(DispatcherSettings, env))


async def test_the_crm_refuses_calls_without_the_credential(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.crm_url) as client:
        response = await client.post(
            "/v1/customers/ACME-42/notes",
            json={"body": "x"},
            headers={"Idempotency-Key": "k-no-credential"},
        )
    assert response.status_code == 401


async def _connect_as(stack: Stack, service: str) -> asyncpg.Connection:
    password = (stack.secrets / f"pg-{service}.password").read_text().strip()
    dsn = with_database(
        stack.admin_dsn, stack.database, user=role_name(stack.database, service), password=password
    )
    return await asyncpg.connect(dsn)


WRITES = {
    "admission.commands": "INSERT INTO admission.commands (tenant, operation_id) VALUES ('a', "
    "gen_random_uuid())",
    "admission.outbox": "DELETE FROM admission.outbox",
    "planner.runs": "UPDATE planner.runs SET status = 'failed'",
    "governance.standing_grants": "INSERT INTO governance.standing_grants "
    "(tenant, agent, family, granted_by) VALUES "
    "('acme', 'x', 'write_delete', 'me')",
    "governance.rules": "DELETE FROM governance.rules",
    "retrieval.documents": "DELETE FROM retrieval.documents",
    "dispatcher.attempts": "DELETE FROM dispatcher.attempts",
}
OWNER = {
    "admission.commands": "admission",
    "admission.outbox": "admission",
    "planner.runs": "planner",
    "governance.standing_grants": "governance",
    "governance.rules": "governance",
    "retrieval.documents": "retrieval",
    "dispatcher.attempts": "dispatcher",
}


@pytest.mark.parametrize(
    "service", ["retrieval", "planner", "governance", "admission", "dispatcher"]
)
async def test_a_service_role_cannot_write_another_services_tables(
    stack: Stack, service: str
) -> None:
    conn = await _connect_as(stack, service)
    try:
        for table, sql in WRITES.items():
            if OWNER[table] == service:
                continue
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("CREATE TABLE public.sneaky (x int)")
    finally:
        await conn.close()


async def test_the_dispatcher_moves_state_but_cannot_change_what_was_approved(
    stack: Stack, host: Host
) -> None:
    request = host.request()
    await host.publish(request, msg_id=request.request_id)
    result = await host.wait_result(request.request_id)
    conn = await _connect_as(stack, "dispatcher")
    try:
        operation_id = result.actions[0].operation_id
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(
                "UPDATE admission.commands SET arguments = '{}' WHERE operation_id = $1",
                operation_id,
            )
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(
                "UPDATE admission.commands SET request_hash = '\\x00' WHERE operation_id = $1",
                operation_id,
            )
        # Its state columns are its own to move (here: a no-op update of the same value).
        changed = await conn.execute(
            "UPDATE admission.commands SET state = state WHERE operation_id = $1", operation_id
        )
        assert changed == "UPDATE 1"
    finally:
        await conn.close()


async def test_a_role_cannot_log_in_with_another_roles_password(stack: Stack) -> None:
    password = (stack.secrets / "pg-planner.password").read_text().strip()
    dsn = with_database(
        stack.admin_dsn,
        stack.database,
        user=role_name(stack.database, "admission"),
        password=password,
    )
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(dsn)


async def test_every_service_answers_srv_ping_and_stats(stack: Stack) -> None:
    nc = await nats.connect(stack.nats_url)
    try:
        names = set()
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish("$SRV.STATS", b"", reply=inbox)
        try:
            while True:
                msg = await sub.next_msg(timeout=1.0)
                if msg.data:
                    names.add(json.loads(msg.data)["name"])
        except nats.errors.TimeoutError:
            pass
        assert {f"writ-{s}" for s in SERVICES} <= names
    finally:
        await nc.close()


@pytest.mark.parametrize("name", SERVICES)
async def test_every_service_exposes_its_metrics(stack: Stack, host: Host, name: str) -> None:
    request = host.request()
    await host.publish(request, msg_id=request.request_id)
    await host.wait_result(request.request_id)
    port = stack.metrics_port(name)
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    handled = [
        line
        for line in text.splitlines()
        if line.startswith("writ_messages_handled_total{") and f'service="{name}"' in line
    ]
    # Every consumer is exported from the start (at 0); the request went through at least one.
    assert handled and any(float(line.rsplit(" ", 1)[1]) >= 1 for line in handled), text
    assert "# TYPE writ_handler_seconds histogram" in text
    assert "# TYPE writ_messages_failed_total counter" in text
