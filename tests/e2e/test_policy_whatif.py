"""`writ policy whatif` over the real deployment's journal: charges a host asked for (some
approved and made, some still waiting) ruled again under a candidate that refuses charges above
500.00 EUR. Exactly those charges flip, and the what-if charges nothing and writes nothing."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx
import msgspec
import pytest

from tests.e2e.conftest import Host
from tests.e2e.test_approvals import _charge, _settled
from writ.stack import Stack
from writ.whatif import Report

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.timeout(600)]


async def all_sealed(db: asyncpg.Connection) -> None:
    """Wait until governance's and admission's sealers chained every row."""
    with anyio.fail_after(60):
        for schema in ("governance", "admission"):
            while await db.fetchval(
                f"SELECT count(*) FROM {schema}.journal j WHERE NOT EXISTS "
                f"(SELECT 1 FROM {schema}.journal_seals s WHERE s.entry_id = j.id)"
            ):
                await anyio.sleep(0.2)


async def test_a_candidate_refusing_large_charges_flips_exactly_them_and_charges_nothing(
    stack: Stack, host: Host, db: asyncpg.Connection, tmp_path: Path
) -> None:
    started = time.monotonic()
    await anyio.sleep(1.1)  # the window starts after anything an earlier test journaled
    cut = datetime.now(UTC)
    asked: dict[int, Any] = {}
    for cents in (12000, 50000, 65000, 120000):
        asked[cents] = await _charge(host, cents, "alice@acme.example")
        assert asked[cents].status == "awaiting_human" and asked[cents].proposal is not None
    made = {}
    for cents in (12000, 120000):
        first = asked[cents]
        taken = await host.decide(first.pending_id, "once", proposal_id=first.proposal.proposal_id)
        assert taken.accepted, taken
        if cents >= 50000:  # four eyes: a second approver
            assert "1 of 2 approvals" in taken.message, taken
            second = await host.decide(
                first.pending_id,
                "once",
                principal="lead@acme.example",
                proposal_id=first.proposal.proposal_id,
            )
            assert second.accepted and second.message == "answered once", second
        done = await _settled(host, first.request_id)
        assert done.status == "succeeded", done
        made[cents] = done.operation_id
    await all_sealed(db)

    with httpx.Client(base_url=stack.payments_url, timeout=5) as payments:
        charges = payments.get("/_control/charges").json()
        candidate = tmp_path / "candidate.json"
        candidate.write_text(
            json.dumps(
                {
                    "version": "charges-500",
                    "thresholds": [
                        {
                            "tool": "payment.charge.create",
                            "currency": "EUR",
                            "above_cents": 50000,
                            "verdict": "deny",
                        }
                    ],
                }
            )
        )
        out = tmp_path / "report.json"
        until = datetime.now(UTC)
        window = f"{int((until - cut).total_seconds()) + 1}s"
        assert time.monotonic() - started > 1
        ran = await anyio.run_process(
            [
                sys.executable,
                "-m",
                "writ.cli",
                "policy",
                "whatif",
                "--policy",
                str(candidate),
                "--tenant",
                "acme",
                "--since",
                window,
                "--until",
                until.isoformat(),
                "--output",
                str(out),
                "--home",
                str(stack.home),
            ],
            check=False,
        )
        assert ran.returncode == 0, ran.stdout.decode() + ran.stderr.decode()
        # The what-if made no charge.
        assert payments.get("/_control/charges").json() == charges
    report = msgspec.json.decode(out.read_bytes(), type=Report)
    assert report.not_redecidable == [], report.not_redecidable
    flips = sorted((f.amount_cents, f.before, f.after, f.operation) for f in report.flips)
    assert flips == sorted(
        [
            (65000, "ask", "deny", asked[65000].proposal.proposal_id),
            (120000, "ask", "deny", made[120000]),
            (120000, "allow", "deny", made[120000]),
        ]
    ), ran.stdout.decode()
    assert all(f.tool == "payment.charge.create" for f in report.flips)
