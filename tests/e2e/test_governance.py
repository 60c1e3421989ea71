"""Governance through the real processes: unattended runs stop at an ask, operators
answer with `writ pending` / `writ decide`, attended asks time out to a deny, signed org policy
outranks grants, and a governance that cannot read its store denies what is sensitive."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import anyio
import asyncpg
import httpx
import msgspec
import nats
import pytest

from libs.db import role_name
from schemas import subjects
from schemas.governance import Answer, DecideRequest, Decision
from schemas.host import DecisionResult
from services.governance.policy import PolicyDocument
from tests.e2e.conftest import Host
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.fixture
def payments(stack: Stack) -> Any:
    with httpx.Client(base_url=stack.payments_url, timeout=5) as client:
        yield client


def charges_for(payments: httpx.Client, operation_id: str) -> list[dict[str, Any]]:
    return [
        c
        for c in payments.get("/_control/charges").json()
        if c["reference"].endswith(f":{operation_id}")
    ]


def writ(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "writ.cli",
            args[0],
            "--home",
            str(stack.home),
            "--nats-url",
            stack.nats_url,
            *args[1:],
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def _stopped_at_ask(
    host: Host, tenant: str = "acme", agent: str = "billing-assistant", **kwargs: Any
) -> Any:
    request = host.request(
        agent=agent, tenant=tenant, principal=f"alice@{tenant}.example", **kwargs
    )
    await host.publish(request, tenant=tenant, msg_id=request.request_id)
    result = await host.wait_result(request.request_id, tenant=tenant)
    return request, result


async def _final(host: Host, request_id: str, tenant: str = "acme") -> Any:
    with anyio.fail_after(30):
        while True:
            for result in await host.results(request_id, tenant=tenant):
                if getattr(result, "status", None) in ("succeeded", "failed"):
                    return result
            await anyio.sleep(0.1)


async def test_an_unattended_run_stops_at_an_ask_and_resumes_once_when_answered(
    stack: Stack, host: Host, db: asyncpg.Connection, payments: httpx.Client
) -> None:
    request, result = await _stopped_at_ask(host)
    assert result.status == "awaiting_human"
    assert result.error is not None and result.error.code == "AWAITING_HUMAN"
    pending_id = result.pending_id
    assert pending_id is not None
    assert (
        await db.fetchval(
            "SELECT count(*) FROM admission.commands WHERE run_id = $1", result.run_id
        )
        == 0
    )

    assert result.proposal is not None
    proposal_id = result.proposal.proposal_id
    listed = writ(stack, "pending")
    assert listed.returncode == 0 and pending_id in listed.stdout
    # A charge moves money: asked every time, once or deny, shown with its preview.
    assert "payment.charge.create" in listed.stdout and "once | deny" in listed.stdout
    assert f"proposal  {proposal_id}" in listed.stdout
    assert "Amount to charge: 49.00 EUR" in listed.stdout

    # The decision is about a proposal: answered only where its preview is shown.
    blind = writ(stack, "decide", pending_id, "once")
    assert blind.returncode == 1 and "proposal" in blind.stdout, blind.stdout + blind.stderr
    answered = writ(
        stack, "decide", pending_id, "once", "--reason", "expected", "--proposal", proposal_id
    )
    assert answered.returncode == 0, answered.stdout + answered.stderr
    final = await _final(host, request.request_id)

    assert final.status == "succeeded", final
    [action] = final.actions
    assert action.state == "succeeded"
    assert len(charges_for(payments, action.operation_id)) == 1
    command = await db.fetchrow("SELECT * FROM admission.commands WHERE run_id = $1", result.run_id)
    answer = await db.fetchrow(
        "SELECT * FROM governance.pending WHERE pending_id = $1", uuid.UUID(pending_id)
    )
    assert (answer["answer"], answer["answered_by"]) == ("once", "ops@acme.example")
    assert command["decision_id"] == answer["answer_decision_id"]

    # Approving twice yields one execution and the same outcome.
    again = writ(stack, "decide", pending_id, "once", "--proposal", proposal_id)
    assert again.returncode == 1 and "already answered" in again.stdout
    await anyio.sleep(1.0)
    assert len(charges_for(payments, action.operation_id)) == 1
    assert pending_id not in writ(stack, "pending").stdout
    # "once" granted nothing: the agent's next run asks again.
    _, next_run = await _stopped_at_ask(host)
    assert next_run.status == "awaiting_human" and next_run.pending_id != pending_id


async def test_deny_fails_the_run_with_rejected_and_the_reason(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    request, result = await _stopped_at_ask(host)
    denied = writ(
        stack,
        "decide",
        result.pending_id,
        "deny",
        "--reason",
        "not this month",
        "--proposal",
        result.proposal.proposal_id,
    )
    assert denied.returncode == 0, denied.stdout + denied.stderr

    final = await _final(host, request.request_id)

    assert final.status == "failed"
    assert final.error is not None and final.error.code == "REJECTED"
    assert "not this month" in final.error.message
    assert (
        await db.fetchval(
            "SELECT count(*) FROM admission.commands WHERE run_id = $1", result.run_id
        )
        == 0
    )
    proposal = await db.fetchrow(
        "SELECT state FROM admission.proposals WHERE run_id = $1", result.run_id
    )
    assert proposal["state"] == "rejected"


async def test_always_writes_a_standing_grant_for_the_family_not_the_tool(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    request, result = await _stopped_at_ask(host, tenant="globex", agent="crm-assistant")
    answered = writ(
        stack,
        "decide",
        "--tenant",
        "globex",
        "--principal",
        "ops@globex.example",
        result.pending_id,
        "always",
        "--proposal",
        result.proposal.proposal_id,
    )
    assert answered.returncode == 0, answered.stdout + answered.stderr
    assert (await _final(host, request.request_id, "globex")).status == "succeeded"

    grants = await db.fetch(
        "SELECT agent, family FROM governance.standing_grants WHERE tenant = 'globex'"
    )
    assert [(g["agent"], g["family"]) for g in grants] == [("crm-assistant", "write_delete")]
    # The next run is allowed by the grant, at line 5, without asking anyone.
    second = host.request(agent="crm-assistant", tenant="globex", principal="alice@globex.example")
    await host.publish(second, tenant="globex", msg_id=second.request_id)
    result2 = await _final(host, second.request_id, "globex")
    assert result2.status == "succeeded"
    line = await db.fetchval(
        "SELECT decision_line FROM admission.commands WHERE run_id = $1", result2.run_id
    )
    assert line == 5


async def _publish_decision(
    host: Host, tenant: str, token: str, pending_id: str, answer: Answer = "once"
) -> DecisionResult:
    return await host.decide(pending_id, answer, tenant=tenant, token=token)


async def test_only_approvers_of_the_same_tenant_may_answer(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    _, result = await _stopped_at_ask(host)
    pending_id = result.pending_id

    no_role = await _publish_decision(
        host, "acme", stack.token("acme", "bob@acme.example"), pending_id
    )
    assert not no_role.accepted and "FORBIDDEN" in no_role.message
    other_tenant = await _publish_decision(
        host, "globex", stack.token("globex", "eve@globex.example", roles=["approver"]), pending_id
    )
    assert not other_tenant.accepted and "no such pending decision" in other_tenant.message
    forged = await _publish_decision(
        host, "acme", stack.token("globex", "eve@globex.example", roles=["approver"]), pending_id
    )
    assert not forged.accepted and "BAD_SIGNATURE" in forged.message
    not_offered = await _publish_decision(
        host, "acme", stack.token("acme", "ops@acme.example", roles=["approver"]), str(uuid.uuid4())
    )
    assert not not_offered.accepted

    row = await db.fetchrow(
        "SELECT answer FROM governance.pending WHERE pending_id = $1", uuid.UUID(pending_id)
    )
    assert row["answer"] is None  # still waiting for a rightful answer


async def test_an_attended_ask_unanswered_for_five_minutes_is_a_deny(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    request = host.request(agent="billing-assistant", attended=True)
    await host.publish(request, msg_id=request.request_id)
    with anyio.fail_after(20):
        while (
            row := await db.fetchrow(
                "SELECT p.* FROM governance.pending p JOIN planner.runs r "
                "ON r.run_id = p.run_id WHERE r.request_id = $1",
                request.request_id,
            )
        ) is None:
            await anyio.sleep(0.05)
    assert row["attended"] and row["deadline"] is not None
    assert 290 <= (row["deadline"] - row["created_at"]).total_seconds() <= 310
    assert await host.results(request.request_id) == []  # attended: the run waits, silently

    # Five minutes pass.
    await db.execute(
        "UPDATE governance.pending SET deadline = now() - interval '1 second' "
        "WHERE pending_id = $1",
        row["pending_id"],
    )
    final = await _final(host, request.request_id)

    assert final.status == "failed" and final.error.code == "REJECTED"
    assert "no answer within 5 minutes" in final.error.message
    assert (
        await db.fetchval(
            "SELECT count(*) FROM admission.commands WHERE run_id = $1", row["run_id"]
        )
        == 0
    )


async def _decide(nc: Any, **fields: Any) -> Decision:
    ask = DecideRequest(
        tenant="acme",
        principal="alice@acme.example",
        agent="crm-assistant",
        run_id=f"run-{uuid.uuid4().hex[:8]}",
        tool="crm.note.create",
        **fields,
    )
    reply = await nc.request(subjects.DECIDE, msgspec.json.encode(ask), timeout=5)
    return msgspec.json.decode(reply.data, type=Decision)


async def _until_policy(db: asyncpg.Connection, version_prefix: str | None) -> None:
    with anyio.fail_after(20):
        while True:
            version = await db.fetchval(
                "SELECT version FROM governance.policy WHERE tenant = 'acme'"
            )
            if (version is None and version_prefix is None) or (
                version is not None
                and version_prefix is not None
                and version.startswith(version_prefix)
            ):
                return
            await anyio.sleep(0.1)


async def test_a_signed_org_policy_outranks_a_standing_grant_and_a_bad_one_denies_all(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    assert (await _decide(host.nc)).verdict == "allow"  # the demo agent's standing grant
    try:
        stack.write_policy(
            "acme",
            PolicyDocument(
                tenant="acme", version="2026-11-29.1", refused_tools=["crm.note.create"]
            ),
        )
        await _until_policy(db, "2026-11-29.1")
        refused = await _decide(host.nc)
        assert (refused.verdict, refused.line, refused.policy_version) == (
            "deny",
            1,
            "2026-11-29.1",
        )

        # A tampered file: the signature no longer matches what it says.
        path = stack.policies / "acme.json"
        path.write_text(path.read_text().replace('"crm.note.create"', '"nothing"'))
        await _until_policy(db, "refused:")
        tampered = await _decide(host.nc)
        assert (tampered.verdict, tampered.line) == ("deny", 1)
        assert "refused" in tampered.reason
        status = await db.fetchrow(
            "SELECT status, refusal FROM governance.policy WHERE tenant = 'acme'"
        )
        assert status["status"] == "refused" and "signature" in status["refusal"]
    finally:
        (stack.policies / "acme.json").unlink(missing_ok=True)
        await _until_policy(db, None)
    assert (await _decide(host.nc)).verdict == "allow"


async def test_governance_that_cannot_read_its_store_denies_every_sensitive_call(
    stack: Stack, db: asyncpg.Connection
) -> None:
    role = role_name(stack.database, "governance")
    nc = await nats.connect(stack.nats_url)
    verdicts: list[str] = []
    cut = anyio.Event()

    async def load() -> None:
        while not cut.is_set():
            verdicts.append((await _decide(nc)).verdict)

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(load)
            await anyio.sleep(0.5)
            assert verdicts and set(verdicts) == {"allow"}
            # Cut the store: governance's role can no longer log in, its sessions are killed.
            await db.execute(f'ALTER ROLE "{role}" NOLOGIN')
            await db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
            )
            await anyio.sleep(0.5)  # in-flight answers from before the cut drain away
            verdicts.clear()
            await anyio.sleep(2.0)
            cut.set()
        during = list(verdicts)
    finally:
        await db.execute(f'ALTER ROLE "{role}" LOGIN')
        await nc.close()

    assert len(during) > 20
    assert set(during) == {"deny"}  # not one sensitive call allowed while the store was away
    nc = await nats.connect(stack.nats_url)
    try:
        with anyio.fail_after(20):
            while (await _decide(nc)).verdict != "allow":
                await anyio.sleep(0.2)
    finally:
        await nc.close()
