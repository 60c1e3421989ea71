"""A run that reads, then proposes, through the six real processes: the demo agent
(`research-assistant`) asks for its catalog, reads the tenant's documents through retrieval,
observes them as untrusted data, proposes one note, observes its outcome, and its answer passes
the critic; the journal replays it identical offline."""

from __future__ import annotations

import asyncpg
import msgspec
import pytest

from tests.e2e.conftest import Host, replayed
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

AGENT = "research-assistant"


async def test_a_run_reads_the_documents_then_proposes_one_note(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    # As `writ run` does for its demo agent: the tenant's administrator lets it write notes.
    await db.execute(
        "INSERT INTO governance.standing_grants (tenant, agent, family, "
        "granted_by) VALUES ('acme', $1, 'write_delete', 'admin@acme.example') "
        "ON CONFLICT DO NOTHING",
        AGENT,
    )
    request = host.request(
        agent=AGENT, text="Note what our documents say about the delayed shipment of ACME-42"
    )
    await host.publish(request, msg_id=request.request_id)
    try:
        result = await host.wait_result(request.request_id)
    except TimeoutError:
        raise AssertionError(stack.log_tail("planner")) from None
    assert result.status == "succeeded", (result, stack.log_tail("planner"))
    assert result.run_id is not None

    rows = await db.fetch(
        "SELECT kind, payload FROM planner.steps WHERE run_id = $1 ORDER BY seq", result.run_id
    )
    steps = [(r["kind"], msgspec.json.decode(r["payload"])) for r in rows]
    assert [(k, p.get("decision") or p.get("verdict")) for k, p in steps] == [
        ("decision", "request_capabilities"),
        ("decision", "select_capability"),
        ("observation", None),
        ("decision", "select_capability"),
        ("observation", None),
        ("decision", "answer_directly"),
        ("critic", "accept"),
    ]
    assert steps[1][1]["capability"] == "tool:documents.search"
    read = steps[2][1]
    assert (read["tool"], read["executed"], read["untrusted"]) == ("documents.search", True, True)
    call = next(i for i in read["items"] if i["id"] == "call-2026-11-28")
    assert "delayed shipment of order 7781" in call["text"]
    assert call["trust"] == "untrusted"
    assert {i["id"] for i in read["items"]}.isdisjoint({"customer-GLOBEX-7", "globex-memo-acme"})
    assert steps[4][1]["state"] == "succeeded"
    # The read was decided by governance and never became a command; the note did, once.
    decided = await db.fetch(
        "SELECT tool, verdict FROM governance.decisions WHERE run_id = $1 ORDER BY decided_at",
        result.run_id,
    )
    assert (decided[0]["tool"], decided[0]["verdict"]) == ("documents.search", "allow")
    assert {(d["tool"], d["verdict"]) for d in decided[1:]} == {("crm.note.create", "allow")}
    commands = await db.fetch(
        "SELECT action, state FROM admission.commands WHERE run_id = $1", result.run_id
    )
    assert [(c["action"], c["state"]) for c in commands] == [("crm.note.create", "succeeded")]
    assert [(a.action, a.state) for a in result.actions] == [("crm.note.create", "succeeded")]

    report = await replayed(host, db, result.run_id)
    assert (report.verdict, report.divergences, report.missing) == ("identical", [], [])
