"""Rules and standing grants naming an MCP server (`mcp:<server>/*`) or one of its tools, as
governance's store reads them from a real PostgreSQL for `decide`, and what the table refuses
to hold."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from libs.db import connect_pool, load_migrations, provision, role_name, with_database
from services.governance.logic import Call, decide
from services.governance.store import GovernanceStore, ToRead

pytestmark = pytest.mark.anyio

MIGRATIONS = Path(__file__).resolve().parents[2] / "services" / "governance" / "migrations"


@pytest.fixture
async def store(scratch_db: str) -> AsyncIterator[tuple[GovernanceStore, asyncpg.Connection]]:
    database = scratch_db.rsplit("/", 1)[1]
    passwords = await provision(
        scratch_db, database, {"governance": load_migrations("governance", MIGRATIONS)}
    )
    dsn = with_database(
        scratch_db,
        database,
        user=role_name(database, "governance"),
        password=passwords["governance"],
    )
    pool = await connect_pool(dsn)
    admin = await asyncpg.connect(scratch_db)
    yield GovernanceStore(pool), admin
    await admin.close()
    await pool.close()


PIN = "a" * 64
CHANGED = "b" * 64


def mcp(
    tool: str, family: str | None = "write_delete", agent: str = "assistant", digest: str = PIN
) -> Call:
    return Call(
        tool=tool,
        family=family,
        connector=None,
        agent=agent,
        first_argument="C-1",
        digest=digest if tool.startswith("mcp:") else None,
    )


async def _grant(
    admin: asyncpg.Connection, agent: str, family: str, source: str, digest: str = PIN
) -> None:
    await admin.execute(
        "INSERT INTO governance.standing_grants (tenant, agent, family, granted_by, source, "
        "digest) VALUES ('acme', $1, $2, 'ops@acme', $3, $4)",
        agent,
        family,
        source,
        digest,
    )


async def test_a_grant_naming_a_server_reaches_its_tools_only(store) -> None:
    gov, admin = store
    await _grant(admin, "assistant", "write_delete", "mcp:crm/*")
    await _grant(admin, "assistant", "read_personal", "mcp:crm/contact.get")
    calls = [
        mcp("mcp:crm/note.add"),
        mcp("mcp:crm/contact.get", "read_personal"),
        mcp("mcp:crm/contact.list", "read_personal"),
        mcp("mcp:crm-evil/note.add"),
        mcp("mcp:crm/note.add", None),
        mcp("mcp:crm/note.add", agent="other"),
        mcp("crm.note.create"),
    ]
    facts = await gov.facts_many(
        [ToRead(tenant="acme", call=c, principal="alice@acme", run_id="run-1") for c in calls]
    )
    verdicts = [decide(c, f).verdict for c, f in zip(calls, facts, strict=True)]
    assert verdicts == ["allow", "allow", "ask", "ask", "ask", "ask", "ask"]
    # What the store gives a call is only the grants naming that call's tool or server.
    assert facts[0].standing_sources == {("mcp:crm/*", "write_delete", PIN)}
    assert facts[3].standing_sources == frozenset()
    assert facts[6].standing_sources == frozenset()
    # A family-wide grant is not a source grant.
    assert all(f.standing_families == frozenset() for f in facts)


async def test_a_deny_rule_naming_a_server_is_read_for_its_tools_only(store) -> None:
    gov, admin = store
    await admin.execute(
        "INSERT INTO governance.rules (tenant, tool, effect) VALUES ('acme', 'mcp:crm/*', 'deny')"
    )
    await _grant(admin, "assistant", "write_delete", "mcp:crm/*")
    mine = await gov.facts("acme", mcp("mcp:crm/note.add"), "alice@acme", "run-1")
    theirs = await gov.facts("acme", mcp("mcp:crm-evil/note.add"), "alice@acme", "run-1")
    assert [r.tool for r in mine.rules] == ["mcp:crm/*"]
    assert theirs.rules == ()
    assert decide(mcp("mcp:crm/note.add"), mine).verdict == "deny"
    assert decide(mcp("mcp:crm/note.add", None), mine).verdict == "deny"
    assert decide(mcp("mcp:crm-evil/note.add"), theirs).verdict == "ask"


@pytest.mark.parametrize(
    ("family", "source"),
    [
        ("send_external", "mcp:crm/*"),
        ("execute_code", "mcp:crm/shell"),
        ("write_delete", "mcp:crm"),
        ("write_delete", "mcp:crm/"),
        ("write_delete", "mcp:crm*"),
        ("write_delete", "mcp:*/*"),
        ("write_delete", "crm.note.create"),
        ("write_delete", "mcp:crm/a/b"),
        ("write_delete", "mcp:crm/*\n"),
    ],
)
async def test_the_table_refuses_a_source_grant_that_could_widen(
    store, family: str, source: str
) -> None:
    _, admin = store
    with pytest.raises(asyncpg.CheckViolationError):
        await _grant(admin, "assistant", family, source)


@pytest.mark.parametrize(
    ("source", "digest"), [("mcp:crm/*", ""), ("mcp:crm/x", "A" * 64), ("", PIN)]
)
async def test_the_table_refuses_a_source_grant_without_its_pin(
    store, source: str, digest: str
) -> None:
    """A grant naming a source names the digest it covers; a family-wide grant names none."""
    _, admin = store
    with pytest.raises(asyncpg.CheckViolationError):
        await _grant(admin, "assistant", "write_delete", source, digest)


@pytest.mark.parametrize(
    ("tool", "effect", "digest"),
    [("mcp:crm/shell", "allow", None), ("mcp:crm/*", "deny", PIN), ("shell.run", "allow", PIN)],
)
async def test_the_table_refuses_an_mcp_allow_rule_without_its_pin(
    store, tool: str, effect: str, digest: str | None
) -> None:
    _, admin = store
    with pytest.raises(asyncpg.CheckViolationError):
        await admin.execute(
            "INSERT INTO governance.rules (tenant, tool, effect, digest) "
            "VALUES ('acme', $1, $2, $3)",
            tool,
            effect,
            digest,
        )


@pytest.mark.parametrize(
    "tool",
    [
        "mcp:crm",
        "mcp:crm/",
        "mcp:cr*",
        "mcp:*",
        "mcp:Crm/*",
        "mcp:crm/ *",
        "mcp:crm/a/b",
        "mcp:crm/*\n",
    ],
)
async def test_the_table_refuses_a_rule_naming_no_mcp_tool(store, tool: str) -> None:
    """A deny rule spelt so that it names no tool would refuse nothing: it is not written."""
    _, admin = store
    with pytest.raises(asyncpg.CheckViolationError):
        await admin.execute(
            "INSERT INTO governance.rules (tenant, tool, effect) VALUES ('acme', $1, 'deny')", tool
        )
    for named in ("mcp:crm/*", "mcp:crm/note.add", "crm.note.create"):
        await admin.execute(
            "INSERT INTO governance.rules (tenant, tool, effect) VALUES ('acme', $1, 'deny')", named
        )


async def test_a_grant_covers_the_definition_it_names_and_not_the_changed_one(store) -> None:
    """Each digest of a server-wide grant is a row; a tool served with another digest (changed,
    then classified again into the same family) reads no grant for it, and a family-wide grant
    reads as covering no `mcp:` tool."""
    gov, admin = store
    await _grant(admin, "assistant", "write_delete", "mcp:crm/*", PIN)
    await _grant(admin, "assistant", "write_delete", "mcp:crm/*", "c" * 64)
    await admin.execute(
        "INSERT INTO governance.standing_grants (tenant, agent, family, granted_by) "
        "VALUES ('acme', 'assistant', 'write_delete', 'ops@acme')"
    )
    calls = [mcp("mcp:crm/note.add"), mcp("mcp:crm/note.add", digest=CHANGED)]
    facts = await gov.facts_many(
        [ToRead(tenant="acme", call=c, principal="alice@acme", run_id="run-1") for c in calls]
    )
    assert [decide(c, f).verdict for c, f in zip(calls, facts, strict=True)] == ["allow", "ask"]


async def test_a_family_wide_grant_and_a_source_grant_of_one_family_are_both_kept(store) -> None:
    _, admin = store
    await admin.execute(
        "INSERT INTO governance.standing_grants (tenant, agent, family, granted_by) "
        "VALUES ('acme', 'assistant', 'write_delete', 'ops@acme')"
    )
    await _grant(admin, "assistant", "write_delete", "mcp:crm/*")
    rows = await admin.fetch("SELECT source FROM governance.standing_grants ORDER BY source")
    assert [r["source"] for r in rows] == ["", "mcp:crm/*"]


async def test_an_answer_about_an_mcp_tool_approves_the_definition_it_was_asked_on(
    store,
) -> None:
    """A person answers `once`, then `always`, to asks about `mcp:crm/note.add` served with one
    digest: the answer approves that call as that definition only (served changed and
    classified again, it is not approved), and `always` writes the grant for that tool pinned to
    it, journaled with the digest."""
    gov, admin = store
    call = mcp("mcp:crm/note.add")
    ask = decide(call, await gov.facts("acme", call, "alice@acme", "run-1"))
    assert ask.verdict == "ask"
    pending_id = await gov.record(
        tenant="acme",
        run_id="run-1",
        principal="alice@acme",
        call=call,
        ruling=ask,
        policy_version="v1",
    )
    assert (
        await admin.fetchval(
            "SELECT digest FROM governance.pending WHERE pending_id = $1::uuid", pending_id
        )
        == PIN
    )
    answered = await gov.answer(
        tenant="acme", pending_id=pending_id, answer="once", answered_by="bob@acme", reason=""
    )
    approval = answered.decision_id
    same = await gov.facts("acme", call, "alice@acme", "run-1", approval_id=approval)
    changed = mcp("mcp:crm/note.add", digest=CHANGED)
    other = await gov.facts("acme", changed, "alice@acme", "run-1", approval_id=approval)
    assert (same.approved, other.approved) == (True, False)
    assert decide(changed, other).verdict == "ask"

    second = await gov.record(
        tenant="acme",
        run_id="run-2",
        principal="alice@acme",
        call=call,
        ruling=ask,
        policy_version="v1",
    )
    await gov.answer(
        tenant="acme", pending_id=second, answer="always", answered_by="bob@acme", reason=""
    )
    rows = await admin.fetch(
        "SELECT family, source, digest FROM governance.standing_grants WHERE tenant = 'acme'"
    )
    assert [tuple(r) for r in rows] == [("write_delete", "mcp:crm/note.add", PIN)]
    facts = await gov.facts_many(
        [
            ToRead(tenant="acme", call=c, principal="alice@acme", run_id="run-3")
            for c in (call, changed)
        ]
    )
    assert [decide(c, f).verdict for c, f in zip((call, changed), facts, strict=True)] == [
        "allow",
        "ask",
    ]
