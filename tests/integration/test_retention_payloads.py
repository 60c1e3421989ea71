"""Retention beyond the journal, against a real PostgreSQL: a run's input and evidence, a
proposal's arguments and preview and a chat message are sealed under their run's (session's)
window key, so a tenant's expired day is unreadable in the service tables too, even to the
administrator, and the API says "expired"; another tenant is untouched and the chains still
verify. A principal's erasure clears the reasons they wrote on others' runs; the policy
what-if counts a decision whose payload expired as not evaluable and rules the rest."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec
import pytest

from actions import ACTIONS
from libs.db import connect_pool, provision, role_name, with_database
from libs.journal import (
    DataKeys,
    Journal,
    Sealer,
    SigningKey,
    WindowKeys,
    destroy_windows,
    load_verify_keys,
    verify,
    window_key_id,
)
from libs.retention import RetentionPolicy, apply_policy, erase_principal, recorder
from schemas.governance import Decision
from schemas.reads import GetProposal
from schemas.retrieval import EvidenceGathered
from schemas.sessions import UserMessage
from services.admission.reads import AdmissionReads
from services.admission.store import AdmissionStore
from services.governance.logic import Call, decide
from services.governance.store import GovernanceStore
from services.planner.sessions._store import SessionStore
from services.planner.status import run_view
from services.planner.store import PlannerStore
from writ.migrate import image_migrations
from writ.whatif import Candidate, whatif
from writ.whatif._read import journaled_window

pytestmark = pytest.mark.anyio

SERVICES = ("planner", "admission", "governance")
SECRET = "the customer's card ends 4242"


class Env(msgspec.Struct, kw_only=True):
    admin: asyncpg.Connection
    pools: dict[str, asyncpg.Pool]
    key_files: dict[str, str]
    journals: dict[str, Journal]
    signing: dict[str, SigningKey]
    planner_records: str  # the planner's data key file, as retention records under it


@pytest.fixture
async def env(scratch_db: str) -> AsyncIterator[Env]:
    database = scratch_db.rsplit("/", 1)[1]
    passwords = await provision(scratch_db, database, image_migrations())
    pools, key_files, journals = {}, {}, {}
    for s in SERVICES:
        pools[s] = await connect_pool(
            with_database(scratch_db, database, user=role_name(database, s), password=passwords[s]),
            max_size=4,
        )
        key_files[s] = DataKeys.generate(f"{s}-d1")
        keys = WindowKeys(DataKeys.from_json(key_files[s]), schema=s)
        keys.bind(pools[s])
        journals[s] = Journal(service=s, keys=keys)
    admin = await asyncpg.connect(scratch_db)
    yield Env(
        admin=admin,
        pools=pools,
        key_files=key_files,
        journals=journals,
        signing={s: SigningKey.generate(f"{s}-1") for s in SERVICES},
        planner_records=key_files["planner"],
    )
    await admin.close()
    for pool in pools.values():
        await pool.close()


def fresh(env: Env, service: str) -> Journal:
    """The journal as an administrator holding the service's key file opens it."""
    return Journal(
        service=service,
        keys=WindowKeys(DataKeys.from_json(env.key_files[service]), schema=service),
    )


async def seal_all(env: Env) -> None:
    for s in SERVICES:
        await Sealer(pool=env.pools[s], journal=env.journals[s], signing=env.signing[s]).seal_all()


async def start(env: Env, tenant: str) -> tuple[str, str, str]:
    """A run (input, evidence), a proposal waiting for a person and a chat message of
    `tenant`'s, today; (run id, public proposal id, session id)."""
    run_id, session_id = f"run-{tenant}", f"ses-{tenant}"
    planner = PlannerStore(env.pools["planner"], journal=env.journals["planner"])
    evidence = [
        {
            "document_id": f"doc-{tenant}",
            "kind": "call",
            "title": f"Call with {tenant}",
            "text": f"{tenant}: {SECRET}",
            "rank": 1.0,
        }
    ]
    assert await planner.create_run(
        msgspec.convert(
            {
                "type": "EvidenceGathered",
                "run_id": run_id,
                "request_id": f"req-{tenant}",
                "tenant": tenant,
                "principal": f"p@{tenant}.example",
                "agent": "research-assistant",
                "input": f"refund {tenant}: {SECRET}",
                "evidence": evidence,
            },
            EvidenceGathered,
        )
    )
    admission = AdmissionStore(env.pools["admission"], journal=env.journals["admission"])
    proposal = await admission.record_proposal(
        tenant=tenant,
        proposal_id=str(uuid.uuid4()),
        run_id=run_id,
        step=2,
        principal=f"p@{tenant}.example",
        agent="research-assistant",
        action="crm.note.create",
        version=1,
        arguments={"customer_id": "ACME-42", "body": SECRET},
        request_hash=b"\x01" * 32,
        state="pending",
        decision_id=str(uuid.uuid4()),
        reason="asks a person",
        preview={"customer_id": "ACME-42", "body": SECRET},
        ttl=timedelta(days=7),
    )
    sessions = SessionStore(env.pools["planner"], journal=env.journals["planner"])
    async with env.pools["planner"].acquire() as conn, conn.transaction():
        await sessions.create(
            conn,
            session_id=session_id,
            tenant=tenant,
            principal=f"p@{tenant}.example",
            agent="research-assistant",
            plan_mode=False,
            open_key=f"k-{tenant}",
        )
        session = await sessions.lock(conn, session_id)
        assert session is not None
        await sessions.add_event(
            conn,
            session,
            "message:1",
            lambda n: UserMessage(session_id=session_id, n=n, turn=1, text=SECRET),
        )
    return run_id, proposal.public_id, session_id


async def test_an_expired_day_is_erased_in_the_service_tables_too(env: Env) -> None:
    acme = await start(env, "acme")
    globex = await start(env, "globex")
    await seal_all(env)
    today = datetime.now(UTC)
    window = window_key_id("acme", today.date(), acme[0])
    policy = RetentionPolicy.from_json(json.dumps({"tenants": {"acme": {"journal": 1}}}))
    erased = await apply_policy(
        env.admin,
        policy,
        by="ops",
        record_in=recorder(env.planner_records),
        now=today + timedelta(days=2),
    )
    assert {e.service: e.key_ids for e in erased} == {
        "planner": sorted([window, window_key_id("acme", today.date(), acme[2])]),
        "admission": [window],
    }

    # The administrator reads ciphertext only, and the key's row has lost its bytes.
    run = await env.admin.fetchrow(
        "SELECT input, evidence::text AS evidence, sealed FROM planner.runs WHERE run_id = $1",
        acme[0],
    )
    assert (run["input"], run["evidence"]) == ("", "[]")
    assert SECRET.encode() not in run["sealed"]
    proposal = await env.admin.fetchrow(
        "SELECT arguments::text AS arguments, preview, facts, sealed FROM admission.proposals "
        "WHERE public_id = $1",
        acme[1],
    )
    assert (proposal["arguments"], proposal["preview"], proposal["facts"]) == ("{}", None, None)
    assert SECRET.encode() not in proposal["sealed"]
    event = await env.admin.fetchrow(
        "SELECT body::text AS body, sealed FROM planner.session_events WHERE session_id = $1",
        acme[2],
    )
    assert event["body"] == "{}" and SECRET.encode() not in event["sealed"]
    for schema in ("planner", "admission"):
        assert (
            await env.admin.fetchval(
                f"SELECT wrapped FROM {schema}.journal_window_keys WHERE key_id = $1", window
            )
            is None
        )

    # What the API answers: the run and the proposal say "expired", nothing stands in.
    planner = PlannerStore(env.pools["planner"], journal=fresh(env, "planner"))
    async with env.pools["planner"].acquire() as conn:
        gone = await planner.run(conn, acme[0], fresh=True)
        kept = await planner.run(conn, globex[0], fresh=True)
    assert gone is not None and gone.expired == window
    assert (gone.input, gone.evidence) == ("", [])
    view = run_view(gone, [])
    assert view.payload == "expired" and view.evidence == []
    assert kept is not None and kept.expired is None
    assert kept.input == f"refund globex: {SECRET}"
    assert run_view(kept, []).payload is None and run_view(kept, []).evidence[0].title

    # A process that made the key and still holds it in memory reads it expired too.
    writer = PlannerStore(env.pools["planner"], journal=env.journals["planner"])
    async with env.pools["planner"].acquire() as conn:
        held = await writer.run(conn, acme[0], fresh=True)
    assert held is not None and held.expired == window

    keys = env.journals["admission"].keys
    assert isinstance(keys, WindowKeys)
    reads = AdmissionReads(env.pools["admission"], keys=keys)
    shown = await reads.proposal(GetProposal(tenant="acme", proposal_id=acme[1]))
    assert shown is not None and shown.payload == "expired" and shown.preview == {}
    other = await reads.proposal(GetProposal(tenant="globex", proposal_id=globex[1]))
    assert other is not None and other.payload is None and other.preview["body"] == SECRET
    admission = AdmissionStore(env.pools["admission"], journal=env.journals["admission"])
    row = await admission.proposal_row("acme", public_id=acme[1])
    assert row is not None and row.expired == window and row.arguments == {}
    # An expired proposal cannot be approved: the command would be made of nothing.
    assert not await admission.approve_for_execution(
        row,
        approver="ops@acme.example",
        decision=msgspec.convert(
            {
                "decision_id": str(uuid.uuid4()),
                "verdict": "allow",
                "line": 5,
                "family": ACTIONS["crm.note.create"].family,
                "reason": "approved",
                "policy_version": "v1",
            },
            type=Decision,
        ),
        ttl=timedelta(minutes=5),
        operation_id=str(uuid.uuid4()),
    )

    # The chat message is gone from what the model remembers; the other tenant's is not.
    sessions = SessionStore(env.pools["planner"], journal=fresh(env, "planner"))
    async with env.pools["planner"].acquire() as conn:
        assert await sessions.events(conn, acme[2]) == []
        [message] = await sessions.events(conn, globex[2])
    assert isinstance(message, UserMessage) and message.text == SECRET

    # Both chains still verify, and name the expired window.
    await seal_all(env)
    public = load_verify_keys(
        json.dumps({s: {f"{s}-1": env.signing[s].public_pem()} for s in SERVICES})
    )
    for schema in ("planner", "admission"):
        report = await verify(env.admin, service=schema, keys=public, journal=fresh(env, schema))
        assert report.ok, report.problems
        assert window in report.expired


async def test_an_erasure_clears_what_the_principal_wrote_on_others_runs(env: Env) -> None:
    store = GovernanceStore(env.pools["governance"], journal=env.journals["governance"])
    call = Call(
        tool="crm.note.create",
        family=ACTIONS["crm.note.create"].family,
        connector="crm",
        agent="research-assistant",
        first_argument="ACME-42",
    )
    asked = {}
    for approver in ("erin@acme.example", "frank@acme.example"):
        run_id = f"run-of-bob-{approver[0]}"
        facts = await store.facts("acme", call, "bob@acme.example", run_id)
        ruling = decide(call, facts)
        assert ruling.verdict == "ask"
        pending = await store.record(
            tenant="acme",
            run_id=run_id,
            principal="bob@acme.example",
            call=call,
            ruling=ruling,
            policy_version=facts.policy_version,
            facts=facts,
        )
        await store.answer(
            tenant="acme",
            pending_id=pending,
            answer="deny",
            answered_by=approver,
            reason=f"{approver} says: the customer {SECRET}",
        )
        asked[approver] = pending

    done = await erase_principal(
        env.admin,
        tenant="acme",
        principal="erin@acme.example",
        by="dpo@acme.example",
        reason="request of the person",
        record_in=recorder(env.planner_records),
    )
    assert done.runs == [] and done.reasons_erased == 1
    rows = {
        r["answered_by"]: r
        for r in await env.admin.fetch(
            "SELECT answered_by, answer, answer_reason FROM governance.pending "
            "WHERE tenant = 'acme'"
        )
    }
    # Who answered, and how, stays (it is who authorised or refused an effect); her words go.
    assert rows["erin@acme.example"]["answer"] == "deny"
    assert rows["erin@acme.example"]["answer_reason"] is None
    assert rows["frank@acme.example"]["answer_reason"].startswith("frank@acme.example says")
    # Bob's run keeps its keys: it is not the erased principal's.
    assert (
        await env.admin.fetchval(
            "SELECT count(*) FROM governance.journal_window_keys WHERE wrapped IS NULL"
        )
        == 0
    )


async def test_the_whatif_counts_an_expired_decision_and_rules_the_rest(env: Env) -> None:
    store = GovernanceStore(env.pools["governance"], journal=env.journals["governance"])
    refund = ACTIONS["payment.refund"]
    call = Call(
        tool="payment.refund",
        family=refund.family,
        connector=refund.connector,
        agent="refund-assistant",
        first_argument="pay_1",
        grantable=refund.grant_may_cover(),
    )
    decisions = {}
    for i, cents in enumerate((65000, 90000, 12000)):
        run_id, proposal_id = f"run-{i}", str(uuid.uuid4())
        facts = await store.facts("acme", call, "p@acme.example", run_id)
        decisions[run_id] = await store.record(
            tenant="acme",
            run_id=run_id,
            principal="p@acme.example",
            call=call,
            ruling=decide(call, facts),
            policy_version=facts.policy_version,
            proposal_id=proposal_id,
            facts=facts,
        )
        async with env.pools["admission"].acquire() as conn:
            await env.journals["admission"].prepare("acme", run_id, conn=conn)
            async with conn.transaction():
                await env.journals["admission"].write(
                    conn,
                    tenant="acme",
                    kind="proposal.pending",
                    subject=f"pub-{i}",
                    run_id=run_id,
                    payload={
                        "proposal_id": proposal_id,
                        "public_id": f"pub-{i}",
                        "arguments": {"amount_cents": cents, "currency": "EUR"},
                    },
                )
    await seal_all(env)
    # run-0's payloads are erased (its principal's erasure would do the same).
    for schema in ("governance", "admission"):
        await destroy_windows(
            env.admin, schema=schema, tenant="acme", runs=["run-0"], by="ops", reason="test"
        )

    now = datetime.now(UTC)
    lost: list[str] = []
    async with env.admin.transaction(readonly=True):
        read, amounts = await journaled_window(
            env.admin,
            fresh(env, "governance"),
            fresh(env, "admission"),
            tenant="acme",
            since=now - timedelta(hours=1),
            until=now + timedelta(minutes=1),
            not_evaluable=lost,
        )
    assert [d.run_id for d in read] == ["run-1", "run-2"]
    assert len(lost) == 1 and lost[0].startswith(decisions["run-0"])
    assert "payload expired" in lost[0]
    candidate = msgspec.convert(
        {
            "version": "refunds-deny",
            "thresholds": [
                {
                    "tool": "payment.refund",
                    "currency": "EUR",
                    "above_cents": 50000,
                    "verdict": "deny",
                }
            ],
        },
        Candidate,
    )
    report = whatif(
        tenant="acme",
        candidate=candidate,
        candidate_digest="d",
        since="s",
        until="u",
        decisions=read,
        amounts=amounts,
        not_evaluable=lost,
    )
    assert report.decisions == 3 and report.redecided == 2
    assert report.not_evaluable == lost
    assert [(f.run_id, f.amount_cents, f.before, f.after) for f in report.flips] == [
        ("run-1", 90000, "ask", "deny")
    ]
