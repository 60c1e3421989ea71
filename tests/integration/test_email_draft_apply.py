"""`email.draft.apply`'s local executor against a real PostgreSQL, as the dispatcher's role: it
counts the draft's audience within its tenant, writes one form per operation key, and may read
but never write the host's drafts and audiences."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from actions import ACTIONS
from actions.base import Stale
from actions.email_draft_apply import DraftArguments, DraftFacts, EmailDraftApply
from libs.db import load_migrations, provision, role_name, with_database

pytestmark = pytest.mark.anyio

# The dispatcher's migrations stand alone (they grant on nothing of admission's).
MIGRATIONS = Path(__file__).resolve().parents[2] / "services" / "dispatcher" / "migrations"
DRAFT: EmailDraftApply = ACTIONS["email.draft.apply"]  # type: ignore[assignment]


@pytest.fixture
async def dbs(scratch_db: str) -> AsyncIterator[tuple[asyncpg.Connection, asyncpg.Connection]]:
    """(the dispatcher's connection, an administrator's connection seeding the host's data)."""
    database = scratch_db.rsplit("/", 1)[1]
    passwords = await provision(
        scratch_db, database, {"dispatcher": load_migrations("dispatcher", MIGRATIONS)}
    )
    dispatcher = await asyncpg.connect(
        with_database(
            scratch_db,
            database,
            user=role_name(database, "dispatcher"),
            password=passwords["dispatcher"],
        )
    )
    admin = await asyncpg.connect(scratch_db)
    await admin.executemany(
        "INSERT INTO dispatcher.mail_drafts (tenant, draft_id, subject, body, segment, state) "
        "VALUES ($1, $2, $3, $4, $5, $6)",
        [
            ("acme", "spring", "Spring league", "Sign up by May 1.", "members", "draft"),
            ("acme", "old", "Autumn league", "Gone.", "members", "archived"),
            ("acme", "nobody", "Hello", "Hi.", "empty-segment", "draft"),
            ("globex", "spring", "Globex spring", "Theirs.", "members", "draft"),
            ("globex", "secret", "Globex only", "Theirs.", "members", "draft"),
        ],
    )
    await admin.executemany(
        "INSERT INTO dispatcher.mail_audience (tenant, segment, address) VALUES ($1, $2, $3)",
        [
            *[("acme", "members", f"m{i}@acme.test") for i in range(3)],
            *[("acme", "juniors", f"j{i}@acme.test") for i in range(2)],
            *[("globex", "members", f"g{i}@globex.test") for i in range(5)],
        ],
    )
    yield dispatcher, admin
    await admin.close()
    await dispatcher.close()


async def test_read_local_counts_the_segment_of_the_tenants_draft(dbs) -> None:
    dispatcher, _ = dbs
    assert await DRAFT.read_local(dispatcher, "acme", "spring") == DraftFacts(
        draft_id="spring",
        subject="Spring league",
        body="Sign up by May 1.",
        segment="members",
        state="draft",
        recipients=3,
    )
    theirs = await DRAFT.read_local(dispatcher, "globex", "spring")
    assert theirs is not None and (theirs.subject, theirs.recipients) == ("Globex spring", 5)
    archived = await DRAFT.read_local(dispatcher, "acme", "old")
    assert archived is not None and archived.state == "archived"
    empty = await DRAFT.read_local(dispatcher, "acme", "nobody")
    assert empty is not None and empty.recipients == 0


async def test_read_local_never_finds_another_tenants_draft(dbs) -> None:
    dispatcher, _ = dbs
    assert await DRAFT.read_local(dispatcher, "acme", "secret") is None
    assert await DRAFT.read_local(dispatcher, "acme", "missing") is None
    assert await DRAFT.read_local(dispatcher, "initech", "spring") is None


async def test_read_local_can_lock_the_draft_in_a_transaction(dbs) -> None:
    dispatcher, _ = dbs
    async with dispatcher.transaction():
        facts = await DRAFT.read_local(dispatcher, "acme", "spring", lock=True)
        assert facts is not None and facts.recipients == 3
        assert await DRAFT.read_local(dispatcher, "acme", "secret", lock=True) is None


async def test_proposal_read_from_postgres_goes_stale_when_the_audience_changes(dbs) -> None:
    dispatcher, admin = dbs
    request = DRAFT.decode_request({"draft_id": "spring"})
    frozen = DRAFT.resolve(request, await DRAFT.read_local(dispatcher, "acme", "spring"))
    DRAFT.revalidate(
        frozen.arguments,
        frozen.preview,
        await DRAFT.read_local(dispatcher, "acme", "spring"),
        key="acme:op-1",
    )
    # Another tenant's audience growing changes nothing here.
    await admin.execute(
        "INSERT INTO dispatcher.mail_audience VALUES ('globex', 'members', 'g9@globex.test')"
    )
    DRAFT.revalidate(
        frozen.arguments,
        frozen.preview,
        await DRAFT.read_local(dispatcher, "acme", "spring"),
        key="acme:op-1",
    )
    await admin.execute(
        "INSERT INTO dispatcher.mail_audience VALUES ('acme', 'members', 'new@acme.test')"
    )
    with pytest.raises(Stale, match="3 recipients when proposed, 4 now"):
        DRAFT.revalidate(
            frozen.arguments,
            frozen.preview,
            await DRAFT.read_local(dispatcher, "acme", "spring"),
            key="acme:op-1",
        )


def _arguments(recipients: int = 3) -> DraftArguments:
    return DraftArguments(
        draft_id="spring",
        subject="Spring league",
        body="Sign up by May 1.",
        segment="members",
        recipients=recipients,
    )


async def test_apply_local_writes_one_form_per_operation_key(dbs) -> None:
    dispatcher, admin = dbs
    async with dispatcher.transaction():
        first = await DRAFT.apply_local(dispatcher, "acme", _arguments(), "acme:op-1")
    async with dispatcher.transaction():
        again = await DRAFT.apply_local(dispatcher, "acme", _arguments(), "acme:op-1")
    assert first == again and first.startswith("form-")
    rows = await admin.fetch(
        "SELECT form_id, tenant, draft_id, subject, body, segment, "
        "recipients, operation_key FROM dispatcher.mail_forms"
    )
    assert [tuple(r)[1:] for r in rows] == [
        ("acme", "spring", "Spring league", "Sign up by May 1.", "members", 3, "acme:op-1")
    ]
    assert first == f"form-{rows[0]['form_id']}"
    # Another operation, or the same key in another tenant, is another form.
    other = await DRAFT.apply_local(dispatcher, "acme", _arguments(), "acme:op-2")
    theirs = await DRAFT.apply_local(dispatcher, "globex", _arguments(5), "acme:op-1")
    assert len({first, other, theirs}) == 3
    assert await admin.fetchval("SELECT count(*) FROM dispatcher.mail_forms") == 3


async def test_apply_local_rolls_back_with_its_transaction(dbs) -> None:
    dispatcher, admin = dbs
    with pytest.raises(RuntimeError):
        async with dispatcher.transaction():
            await DRAFT.apply_local(dispatcher, "acme", _arguments(), "acme:op-1")
            raise RuntimeError("the outcome could not be recorded")
    assert await admin.fetchval("SELECT count(*) FROM dispatcher.mail_forms") == 0


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO dispatcher.mail_drafts (tenant, draft_id, subject, body, segment) "
        "VALUES ('acme', 'x', 's', 'b', 'members')",
        "INSERT INTO dispatcher.mail_audience (tenant, segment, address) "
        "VALUES ('acme', 'members', 'intruder@evil.test')",
        "DELETE FROM dispatcher.mail_audience",
        "DELETE FROM dispatcher.mail_drafts",
    ],
)
async def test_dispatcher_cannot_write_the_hosts_drafts_or_audience(dbs, statement: str) -> None:
    dispatcher, admin = dbs
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied"):
        await dispatcher.execute(statement)
    assert await admin.fetchval("SELECT count(*) FROM dispatcher.mail_drafts") == 5
    assert await admin.fetchval("SELECT count(*) FROM dispatcher.mail_audience") == 10
