"""`writ policy whatif | record | verify` against a real PostgreSQL: governance's store journals
its decisions (with the facts they were ruled on) and admission's journal the proposals'
amounts, both sealed; the what-if, as the read-only auditor, reports exactly the refunds a
candidate would flip, writes nothing to any store, and its sealed report verifies."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import msgspec
import pytest

from actions import ACTIONS
from libs.db import (
    connect_pool,
    provision,
    provision_auditor,
    role_name,
    with_database,
)
from libs.journal import DataKeys, Journal, Sealer, SigningKey
from services.governance.logic import Call, decide
from services.governance.store import Answered, GovernanceStore
from writ.eval._record import provision_eval_recorder
from writ.migrate import image_migrations
from writ.whatif import Report

pytestmark = pytest.mark.anyio

SERVICES = ("governance", "admission", "planner")
REFUND = ACTIONS["payment.refund"]
# The window's refunds, in cents and currency: the two EUR ones above 500.00 must flip.
REFUNDS = [(12000, "EUR"), (50000, "EUR"), (65000, "EUR"), (120000, "EUR"), (90000, "USD")]


def writ(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "writ.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def counts(admin: asyncpg.Connection) -> dict[str, int]:
    """Rows of every table of every service's schema."""
    tables = await admin.fetch(
        "SELECT schemaname, tablename FROM pg_tables WHERE schemaname = ANY($1::text[])",
        list(SERVICES),
    )
    return {
        f"{t['schemaname']}.{t['tablename']}": await admin.fetchval(
            f'SELECT count(*) FROM "{t["schemaname"]}"."{t["tablename"]}"'
        )
        for t in tables
    }


@pytest.mark.timeout(600)
async def test_a_candidate_over_the_sealed_journal_flips_exactly_the_large_refunds(
    scratch_db: str, tmp_path: Path
) -> None:
    database = scratch_db.rsplit("/", 1)[1]
    passwords = await provision(scratch_db, database, image_migrations())
    pools = {
        s: await connect_pool(
            with_database(scratch_db, database, user=role_name(database, s), password=passwords[s]),
            max_size=4,
        )
        for s in SERVICES
    }
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    journals = {}
    for s in SERVICES:
        keys = DataKeys.generate(f"{s}-d1")
        (secrets / f"journal-{s}-data.json").write_text(keys)
        journals[s] = Journal(service=s, keys=DataKeys.from_json(keys))
    auditor = with_database(
        scratch_db,
        database,
        user=role_name(database, "auditor"),
        password=await provision_auditor(
            scratch_db,
            database,
            {s: ["journal", "journal_seals"] for s in SERVICES},
        ),
    )
    eval_dsn = with_database(
        scratch_db,
        database,
        user=role_name(database, "eval"),
        password=await provision_eval_recorder(scratch_db, database),
    )
    admin = await asyncpg.connect(scratch_db)
    try:
        store = GovernanceStore(pools["governance"], journal=journals["governance"])
        call = Call(
            tool="payment.refund",
            family=REFUND.family,
            connector=REFUND.connector,
            agent="refund-assistant",
            first_argument="pay_1",
            grantable=REFUND.grant_may_cover(),
        )
        proposals, pending_of = {}, {}
        for i, (cents, currency) in enumerate(REFUNDS):
            proposal_id = str(uuid.uuid4())
            facts = await store.facts("acme", call, "p@acme.example", f"run-{i}")
            pending_of[proposal_id] = await store.record(
                tenant="acme",
                run_id=f"run-{i}",
                principal="p@acme.example",
                call=call,
                ruling=decide(call, facts),
                policy_version=facts.policy_version,
                proposal_id=proposal_id,
                facts=facts,
            )
            async with pools["admission"].acquire() as conn:
                await journals["admission"].write(
                    conn,
                    tenant="acme",
                    kind="proposal.waiting",
                    subject=f"pub-{i}",
                    run_id=f"run-{i}",
                    payload={
                        "proposal_id": proposal_id,
                        "public_id": f"pub-{i}",
                        "action": "payment.refund",
                        "arguments": {"amount_cents": cents, "currency": currency},
                    },
                )
            proposals[proposal_id] = f"pub-{i}"
        # The largest refund is approved, admitted as operation op-3 and re-checked at dispatch
        # on that answer: the re-check has no proposal, only the answer it stood on.
        [large] = [p for p, pub in proposals.items() if pub == "pub-3"]
        asked = pending_of[large]
        answered = await store.answer(
            tenant="acme",
            pending_id=asked,
            answer="once",
            answered_by="ops@acme.example",
            reason="checked",
            proposal_id=large,
        )
        assert isinstance(answered, Answered)
        async with pools["admission"].acquire() as conn:
            await journals["admission"].write(
                conn,
                tenant="acme",
                kind="command.admitted",
                subject="op-3",
                run_id="run-3",
                payload={
                    "operation_id": "op-3",
                    "proposal_id": large,
                    "action": "payment.refund",
                    "arguments": {"amount_cents": 120000, "currency": "EUR"},
                    "decision_id": answered.decision_id,
                },
            )
        facts = await store.facts(
            "acme", call, "p@acme.example", "run-3", approval_id=answered.decision_id
        )
        assert decide(call, facts).verdict == "allow"
        await store.record(
            tenant="acme",
            run_id="run-3",
            principal="p@acme.example",
            call=call,
            ruling=decide(call, facts),
            policy_version=facts.policy_version,
            facts=facts,
            approval_id=answered.decision_id,
        )
        read = Call(tool="crm.customer.get", family="read", connector="crm", agent="assistant")
        facts = await store.facts("acme", read, "p@acme.example", "run-r")
        await store.record(
            tenant="acme",
            run_id="run-r",
            principal="p@acme.example",
            call=read,
            ruling=decide(read, facts),
            policy_version=facts.policy_version,
            facts=facts,
        )
        for s in ("governance", "admission"):
            signing = SigningKey.generate(f"{s}-1")
            await Sealer(pool=pools[s], journal=journals[s], signing=signing).seal_all()
        before = await counts(admin)

        common = ["--tenant", "acme", "--since", "1h", "--home", str(tmp_path)]
        common += ["--dsn", auditor]
        reports, printed = {}, {}
        for verdict in ("deny", "ask"):
            candidate = tmp_path / f"{verdict}.json"
            candidate.write_text(
                json.dumps(
                    {
                        "version": f"refunds-{verdict}",
                        "thresholds": [
                            {
                                "tool": "payment.refund",
                                "currency": "EUR",
                                "above_cents": 50000,
                                "verdict": verdict,
                            }
                        ],
                    }
                )
            )
            out = tmp_path / f"{verdict}.report.json"
            ran = writ(
                "policy", "whatif", "--policy", str(candidate), "--output", str(out), *common
            )
            assert ran.returncode == 0, ran.stdout + ran.stderr
            printed[verdict] = ran.stdout
            reports[verdict] = msgspec.json.decode(out.read_bytes(), type=Report)
        denied = reports["deny"]
        assert denied.decisions == denied.redecided == len(REFUNDS) + 2
        assert denied.not_redecidable == []
        assert sorted((f.operation, f.amount_cents, f.before, f.after) for f in denied.flips) == [
            ("op-3", 120000, "allow", "deny"),
            ("op-3", 120000, "ask", "deny"),
            ("pub-2", 65000, "ask", "deny"),
        ]
        assert "ask -> deny  payment.refund 650.00 EUR  operation pub-2" in printed["deny"]
        # Money is asked every time already: an `ask` threshold flips nothing.
        assert reports["ask"].flips == [] and reports["ask"].redecided == len(REFUNDS) + 2
        # ... and the report says so, and why, rather than staying silent.
        [effect] = reports["ask"].thresholds
        assert (effect.covered, effect.raised) == (3, 0)
        assert "the candidate changes nothing for them" in printed["ask"]
        assert "unchanged: already ask: a consequential action (money" in printed["ask"]
        # Nothing was written to any store by the what-if.
        assert await counts(admin) == before

        # The report's digest, journaled as the eval role and sealed with the planner's chain.
        report_file = str(tmp_path / "deny.report.json")
        recorded = writ("policy", "record", report_file, "--dsn", eval_dsn, "--home", str(tmp_path))
        assert recorded.returncode == 0, recorded.stdout + recorded.stderr
        unsealed = writ("policy", "verify", report_file, "--dsn", auditor, "--home", str(tmp_path))
        assert unsealed.returncode == 1, unsealed.stdout + unsealed.stderr
        signing = SigningKey.generate("planner-1")
        sealer = Sealer(pool=pools["planner"], journal=journals["planner"], signing=signing)
        assert await sealer.seal_all() == 1
        sealed = writ("policy", "verify", report_file, "--dsn", auditor, "--home", str(tmp_path))
        assert sealed.returncode == 0 and "sealed at planner journal seq" in sealed.stdout, (
            sealed.stdout + sealed.stderr
        )
        # A report edited after it was sealed is not the one sealed.
        tampered: dict[str, Any] = json.loads(await anyio.Path(report_file).read_text())
        tampered["flips"] = tampered["flips"][:1]
        (tmp_path / "tampered.json").write_text(json.dumps(tampered))
        edited = writ(
            "policy",
            "verify",
            str(tmp_path / "tampered.json"),
            "--dsn",
            auditor,
            "--home",
            str(tmp_path),
        )
        assert edited.returncode == 1 and "NOT in" in edited.stderr, edited.stdout + edited.stderr
        assert reports["ask"].until <= datetime.now(UTC).isoformat()
    finally:
        await admin.close()
        for pool in pools.values():
            await pool.close()
