"""The journal against an attacker who can write to its database, with the sealer running and
every checkpoint recorded in a real append-only JetStream stream.

Each attack is done in SQL only (no signing key, no access to the record), then a new row is
written (the next request) and the sealer gets its chance; `verify` must then fail naming the
first bad seq. The attacks run on journals named after each of the four services that keep one:
the mechanism is the same code, the chains must not be.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import asyncpg
import msgspec
import pytest
from nats.aio.client import Client
from nats.js.errors import APIError
from prometheus_client import CollectorRegistry

from libs.bus import ensure_streams
from libs.db import connect_pool, load_migrations, provision, role_name, with_database
from libs.journal import (
    DataKeys,
    FileRecord,
    JetStreamRecord,
    Journal,
    RecordError,
    Sealer,
    SigningKey,
    VerifyReport,
    entry_hash,
    load_verify_keys,
    verify,
)
from libs.journal._record import signed_checkpoint

pytestmark = pytest.mark.anyio

JOURNALS = ("governance", "planner", "admission", "dispatcher")
_ROW = "id, xid::text AS xid, tenant, kind, subject, run_id, recorded_at, key_id, nonce, ciphertext"


class Env(msgspec.Struct, kw_only=True):
    service: str
    pool: asyncpg.Pool
    admin: asyncpg.Connection  # the attacker (and the auditor's view of the database)
    journal: Journal
    signing: SigningKey
    record: JetStreamRecord
    sealer: Sealer
    public: dict[str, Any]
    registry: CollectorRegistry
    written: int = 0
    stop: Callable[[], None] = lambda: None  # stops the running sealer

    @property
    def s(self) -> str:
        return self.service

    async def verify(self, **kwargs: Any) -> VerifyReport:
        keys = load_verify_keys(msgspec.json.encode(self.public))
        kwargs.setdefault("record", self.record)
        return await verify(self.admin, service=self.service, keys=keys, **kwargs)

    async def request(self, rows: int = 3) -> None:
        """What a request leaves in the journal: a few rows in one transaction."""
        async with self.pool.acquire() as conn, conn.transaction():
            for _ in range(rows):
                self.written += 1
                await self.journal.write(
                    conn,
                    tenant="acme",
                    kind="test",
                    subject=f"s-{self.written}",
                    run_id="run-1",
                    payload={"n": self.written},
                )

    async def seals(self) -> int:
        return await self.admin.fetchval(f"SELECT count(*) FROM {self.s}.journal_seals")

    async def settled(self) -> None:
        """Until the sealer has sealed everything after its head, or refused to."""
        with anyio.fail_after(10):
            while self.sealer.refused is None and await self.admin.fetchval(
                f"SELECT count(*) FROM {self.s}.journal j WHERE NOT EXISTS (SELECT 1 "
                f"FROM {self.s}.journal_seals s WHERE s.entry_id = j.id) AND (j.xid, j.id) "
                f"> coalesce((SELECT (xid, entry_id) FROM {self.s}.journal_seals ORDER BY seq "
                "DESC LIMIT 1), ('0'::xid8, 0::bigint))"
            ):
                await anyio.sleep(0.02)

    async def batches(self, count: int = 4, rows: int = 3) -> list[list[tuple[int, int]]]:
        """`count` requests, each sealed as its own batch: [(seq, row id)] of each batch."""
        for _ in range(count):
            await self.request(rows)
            await self.settled()
        seals = await self.admin.fetch(
            f"SELECT seq, entry_id FROM {self.s}.journal_seals ORDER BY seq"
        )
        cps = [
            0,
            *[
                r["seq"]
                for r in await self.admin.fetch(
                    f"SELECT seq FROM {self.s}.journal_checkpoints ORDER BY seq"
                )
            ],
        ]
        return [
            [(r["seq"], r["entry_id"]) for r in seals if a < r["seq"] <= b]
            for a, b in zip(cps, cps[1:], strict=False)
        ]


def on(*journals: str) -> pytest.MarkDecorator:
    """Run a test on these services' journals (the cheap attacks on one each, in turn)."""
    return pytest.mark.parametrize("env", journals, indirect=True)


@pytest.fixture
async def env(
    request: pytest.FixtureRequest, scratch_db: str, nc: Client, unique: str, tmp_path: Path
) -> AsyncIterator[Env]:
    service = getattr(request, "param", "governance")
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "001_journal.sql").write_text(
        f"CREATE SCHEMA {service};\nGRANT USAGE ON SCHEMA {service} TO {{role:{service}}};\n"
        "{include:journal}\n{include:journal_rejected}\n"
    )
    database = scratch_db.rsplit("/", 1)[1]
    passwords = await provision(scratch_db, database, {service: load_migrations(service, folder)})
    pool = await connect_pool(
        with_database(
            scratch_db, database, user=role_name(database, service), password=passwords[service]
        ),
        max_size=8,
    )
    admin = await asyncpg.connect(scratch_db)
    js = nc.jetstream()
    record = JetStreamRecord(
        js, stream=f"AUDIT_{unique}", subject=lambda s: f"t{unique}.audit.checkpoints.{s}"
    )
    await ensure_streams(js, [record.spec()])
    journal = Journal(service=service, keys=DataKeys.from_json(DataKeys.generate("d1")))
    signing = SigningKey.generate(f"{service}-1")
    registry = CollectorRegistry()
    env = Env(
        service=service,
        pool=pool,
        admin=admin,
        journal=journal,
        signing=signing,
        record=record,
        public={service: {signing.key_id: signing.public_pem()}},
        registry=registry,
        sealer=Sealer(
            pool=pool,
            journal=journal,
            signing=signing,
            record=record,
            registry=registry,
            interval=0.02,
        ),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(_sealing, env)
        yield env
        tg.cancel_scope.cancel()
    await js.delete_stream(record.stream)
    await admin.close()
    await pool.close()


async def _sealing(env: Env, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    with anyio.CancelScope() as scope:
        env.stop = scope.cancel
        await env.sealer.run(task_status=task_status)


def first(report: VerifyReport) -> tuple[int | None, int | None, str]:
    assert not report.ok, "verify found nothing"
    p = report.problems[0]
    return p.seq, p.entry_id, p.reason


async def attacked(env: Env, attack: Callable[[], Awaitable[None]]) -> VerifyReport:
    """Attack, then the next request, then what verify says once the sealer had its turn."""
    await attack()
    await env.request()
    await env.settled()
    return await env.verify()


async def row(env: Env, entry_id: int) -> asyncpg.Record:
    return await env.admin.fetchrow(f"SELECT {_ROW} FROM {env.s}.journal WHERE id = $1", entry_id)


# -- a chain nobody touched -------------------------------------------------------------------


@on(*JOURNALS)
async def test_an_untouched_chain_is_intact_and_every_checkpoint_is_recorded(env: Env) -> None:
    await env.batches(3)
    report = await env.verify(grace=timedelta(0))
    assert report.ok, report.problems
    assert report.entries == 9 and report.checkpoints == 3 == report.recorded
    assert [c.seq for c in await env.record.read(env.service)] == [3, 6, 9]


@on("governance")
async def test_the_record_stream_refuses_a_delete_a_purge_and_lifting_either_denial(
    env: Env, nc: Client
) -> None:
    await env.batches(1)
    js = nc.jetstream()
    with pytest.raises(APIError, match="delete not permitted"):
        await js.delete_msg(env.record.stream, 1)
    with pytest.raises(APIError, match="purge not permitted"):
        await js.purge_stream(env.record.stream)
    info = await js.stream_info(env.record.stream)
    assert info.config.deny_delete and info.config.deny_purge
    assert not info.config.allow_rollup_hdrs
    config = info.config
    config.deny_delete = False
    with pytest.raises(APIError, match="deny"):
        await js.update_stream(config)
    config.deny_delete, config.deny_purge = True, False
    with pytest.raises(APIError, match="deny"):
        await js.update_stream(config)
    assert len(await env.record.read(env.service)) == 1
    # And a checkpoint lands only on top of the one its sealer read last.
    newest = (await env.record.read(env.service))[-1]
    for after in (0, 99):
        with pytest.raises(RecordError):
            await env.record.append(newest, after=after)
    assert len(await env.record.read(env.service)) == 1


# -- attacks on sealed rows: the chain itself names them ----------------------------------------


@on("planner")
async def test_edit(env: Env) -> None:
    victim = (await env.batches())[1][1]
    report = await attacked(
        env,
        lambda: env.admin.execute(
            f"UPDATE {env.s}.journal SET ciphertext = set_byte(ciphertext, 2, "
            "get_byte(ciphertext, 2) # 1) WHERE id = $1",
            victim[1],
        ),
    )
    assert first(report)[:2] == victim and "edited" in first(report)[2]


@on("admission")
async def test_delete(env: Env) -> None:
    victim = (await env.batches())[2][0]
    report = await attacked(
        env, lambda: env.admin.execute(f"DELETE FROM {env.s}.journal WHERE id = $1", victim[1])
    )
    assert first(report)[:2] == victim and "deleted" in first(report)[2]


@on("dispatcher")
async def test_insert(env: Env) -> None:
    victim = (await env.batches())[1][0]
    original = await row(env, victim[1])

    async def attack() -> None:  # a row that sorts just before a sealed one
        await env.admin.execute(
            f"INSERT INTO {env.s}.journal (id, xid, tenant, kind, subject, run_id, "
            "recorded_at, key_id, nonce, ciphertext) OVERRIDING SYSTEM VALUE VALUES "
            "(-1, $1::text::xid8, 'acme', 'test', 'forged', '', now(), 'd1', $2, $3)",
            original["xid"],
            b"\0" * 12,
            b"\0" * 20,
        )

    report = await attacked(env, attack)
    assert first(report)[:2] == (victim[0], -1) and "inserted" in first(report)[2]


@on("governance")
async def test_copy(env: Env) -> None:
    victim = (await env.batches())[0][1]

    async def attack() -> None:  # every column but the ids, so the payload still opens
        await env.admin.execute(
            f"INSERT INTO {env.s}.journal (tenant, kind, subject, run_id, recorded_at, key_id, "
            f"nonce, ciphertext) SELECT tenant, kind, subject, run_id, recorded_at, key_id, "
            f"nonce, ciphertext FROM {env.s}.journal WHERE id = $1",
            victim[1],
        )

    head = await env.seals()
    report = await attacked(env, attack)
    assert first(report)[0] == head + 1 and f"nonce of seq {victim[0]}" in first(report)[2]


@on("planner")
async def test_a_row_recorded_well_before_the_head_is_rejected(env: Env) -> None:
    await env.batches(2)
    entry = env.journal.entry(
        tenant="acme",
        kind="test",
        subject="old",
        payload={},
        at=datetime.now(UTC) - timedelta(hours=1),
    )
    head = await env.seals()
    report = await attacked(
        env, lambda: env.admin.execute(env.journal.insert_sql, *msgspec.structs.astuple(entry))
    )
    seq, _, reason = first(report)
    assert seq == head + 1 and "rejected" in reason and "late" in reason
    assert env.sealer.refused is None  # the chain went on: the next request is sealed
    assert report.entries == head + 4


@on("admission")
async def test_swap(env: Env) -> None:
    batches = await env.batches()
    a, b = batches[0][1], batches[2][2]
    report = await attacked(
        env,
        lambda: env.admin.execute(
            f"UPDATE {env.s}.journal j SET xid = o.xid, tenant = o.tenant, kind = o.kind, "
            "subject = o.subject, run_id = o.run_id, recorded_at = o.recorded_at, "
            "key_id = o.key_id, nonce = o.nonce, ciphertext = o.ciphertext "
            f"FROM {env.s}.journal o WHERE (j.id, o.id) IN (($1, $2), ($2, $1))",
            a[1],
            b[1],
        ),
    )
    assert first(report)[:2] == a


@on("dispatcher")
@pytest.mark.parametrize("how", ["edit", "re-sign", "replace"])
async def test_replace_or_re_sign_a_checkpoint(env: Env, how: str) -> None:
    batches = await env.batches()
    seq = batches[1][-1][0]
    args: tuple[object, ...]
    if how == "edit":
        sql, args = "SET prev_seq = 0", ()
    elif how == "re-sign":  # a key of the attacker's, under the service's key id
        forger = SigningKey.generate(env.signing.key_id)
        cp = await env.admin.fetchrow(
            f"SELECT * FROM {env.s}.journal_checkpoints WHERE seq = $1", seq
        )
        forged = signed_checkpoint(
            forger,
            service=env.service,
            seq=seq,
            prev_seq=cp["prev_seq"],
            head=bytes(cp["head_hash"]),
            prev_head=b"",
            signed_at=0,
        )
        sql, args = "SET signature = $2", (base64.b64decode(forged.signature),)
    else:  # another genuine checkpoint's signature
        other = await env.admin.fetchval(
            f"SELECT signature FROM {env.s}.journal_checkpoints WHERE seq = $1", batches[0][-1][0]
        )
        sql, args = "SET signature = $2", (other,)
    report = await attacked(
        env,
        lambda: env.admin.execute(
            f"UPDATE {env.s}.journal_checkpoints {sql} WHERE seq = $1", seq, *args
        ),
    )
    assert first(report)[0] == seq and "signature" in first(report)[2]
    assert any(p.seq == seq and "never saw" in p.reason for p in report.problems)


# -- attacks that rewrite the chain with its seals: the record names them -----------------------


async def cut(env: Env, from_seq: int) -> list[asyncpg.Record]:
    """Delete every row, seal and checkpoint from `from_seq` on; the rows deleted."""
    rows = await env.admin.fetch(
        f"SELECT {', '.join('j.' + c.strip() for c in _ROW.split(','))} FROM {env.s}.journal j "
        f"JOIN {env.s}.journal_seals s ON s.entry_id = j.id WHERE s.seq >= $1 ORDER BY s.seq",
        from_seq,
    )
    async with env.admin.transaction():
        await env.admin.execute(
            f"DELETE FROM {env.s}.journal WHERE id IN (SELECT entry_id "
            f"FROM {env.s}.journal_seals WHERE seq >= $1)",
            from_seq,
        )
        await env.admin.execute(f"DELETE FROM {env.s}.journal_seals WHERE seq >= $1", from_seq)
        await env.admin.execute(
            f"DELETE FROM {env.s}.journal_checkpoints WHERE seq >= $1", from_seq
        )
    return rows


@on(*JOURNALS)
async def test_cut_the_tail(env: Env) -> None:
    start = (await env.batches())[-1][0][0]
    await cut(env, start)
    # Refused at once, before any new row needs sealing. A round that read its seals before
    # the cut and its checkpoints after may first refuse as "seal past checkpoint"; the next
    # round sees the cut head itself.
    refusals = "writ_journal_seal_refusals_total"
    with anyio.fail_after(10):
        while (
            env.registry.get_sample_value(
                refusals, {"service": env.service, "reason": "head_differs"}
            )
            or 0
        ) < 1:
            await anyio.sleep(0.02)
    assert env.sealer.refused is not None
    report = await attacked(env, env.request)
    seq, _, reason = first(report)
    assert seq == start and "the tail was cut" in reason
    assert env.sealer.refused is not None  # it did not chain the new request onto the cut
    assert await env.seals() == start - 1


@on(*JOURNALS)
async def test_splice_and_re_insert(env: Env) -> None:
    batches = await env.batches(5)
    start, victim = batches[2][0][0], batches[2][1][1]

    async def attack() -> None:  # every later row back, unchanged but for its id and xid
        for r in await cut(env, start):
            if r["id"] != victim:
                await env.admin.execute(
                    env.journal.insert_sql,
                    r["tenant"],
                    r["kind"],
                    r["subject"],
                    r["run_id"],
                    r["key_id"],
                    r["nonce"],
                    r["ciphertext"],
                    r["recorded_at"],
                )

    report = await attacked(env, attack)
    seq, _, reason = first(report)
    assert seq == start and "the tail was cut" in reason
    assert env.sealer.refused is not None
    # With the data keys too, and whoever seals: the record's heads are not the chain's.
    assert first(await env.verify(journal=env.journal))[0] == start


async def rehash(env: Env, from_seq: int) -> None:
    """Recompute every seal from `from_seq` (the chain is unkeyed sha256 over public fields)."""
    prev = bytes(
        await env.admin.fetchval(
            f"SELECT prev_hash FROM {env.s}.journal_seals WHERE seq = $1", from_seq
        )
    )
    for s in await env.admin.fetch(
        f"SELECT seq, entry_id FROM {env.s}.journal_seals WHERE seq >= $1 ORDER BY seq", from_seq
    ):
        digest = entry_hash(
            prev, service=env.service, seq=s["seq"], row=await row(env, s["entry_id"])
        )
        await env.admin.execute(
            f"UPDATE {env.s}.journal_seals SET prev_hash = $2, entry_hash = $3 WHERE seq = $1",
            s["seq"],
            prev,
            digest,
        )
        prev = digest


@on(*JOURNALS)
@pytest.mark.parametrize("where", ["first", "middle"])
async def test_rehash_and_drop_checkpoints(env: Env, where: str) -> None:
    batches = await env.batches()
    victim = batches[1][0 if where == "first" else 1]

    async def attack() -> None:
        await env.admin.execute(
            f"UPDATE {env.s}.journal SET ciphertext = set_byte("
            "ciphertext, 0, get_byte(ciphertext, 0) # 1) WHERE id = $1",
            victim[1],
        )
        await rehash(env, victim[0])
        await env.admin.execute(
            f"DELETE FROM {env.s}.journal_checkpoints WHERE seq >= $1", victim[0]
        )

    report = await attacked(env, attack)
    assert env.sealer.refused is not None
    # The record pins each batch's head: the rewrite is named from its batch's first seq...
    assert first(report)[0] == batches[1][0][0] and "rewritten" in first(report)[2]
    # ...and to the row with the data keys (its payload no longer opens).
    assert first(await env.verify(journal=env.journal))[:2] == victim


@on(*JOURNALS)
async def test_forge_a_row_and_delete_behind_it(env: Env) -> None:
    await env.batches(2)
    head = await env.seals()

    async def attack() -> None:
        forged = await env.admin.fetchval(
            f"INSERT INTO {env.s}.journal (tenant, kind, subject, key_id, nonce, ciphertext) "
            "VALUES ('acme', 'test', 'x', 'd1', $1, $2) RETURNING id",
            b"\1" * 12,
            b"\1" * 20,
        )
        await env.request()  # genuine rows behind it
        await env.settled()
        behind = await env.admin.fetchval(f"SELECT max(id) FROM {env.s}.journal")
        await env.admin.execute(f"DELETE FROM {env.s}.journal WHERE id IN ($1, $2)", behind, forged)

    report = await attacked(env, attack)
    seq, _, reason = first(report)
    assert seq == head + 1 and "missing" in reason  # the forged row's place in the chain
    assert any("missing" in p.reason and p.seq == head + 4 for p in report.problems)


# -- the sealer between its record and its commit ---------------------------------------------


class Crashing(Sealer):
    """A sealer that dies after recording its checkpoint, before its commit."""

    async def _seal(self, *args: Any) -> int:
        await super()._seal(*args)
        raise ConnectionError("killed before the commit")


@on("admission")
async def test_a_checkpoint_recorded_but_not_committed_is_completed(env: Env) -> None:
    await env.batches(2)
    env.stop()
    crashing = Crashing(pool=env.pool, journal=env.journal, signing=env.signing, record=env.record)
    await env.request()
    with pytest.raises(ConnectionError):
        await crashing.seal_once()
    recorded = [c.seq for c in await env.record.read(env.service)]
    assert recorded == [3, 6, 9] and await env.seals() == 6
    report = await env.verify()  # its rows are all there: not tampering
    assert report.ok and report.pending == 9, report.problems
    restarted = Sealer(pool=env.pool, journal=env.journal, signing=env.signing, record=env.record)
    await env.request()
    assert await restarted.seal_once() == 3  # the recorded batch, as recorded
    assert await restarted.seal_all() == 3  # then the new request
    assert restarted.refused is None
    report = await env.verify(grace=timedelta(0))
    assert report.ok and report.pending is None and report.checkpoints == report.recorded == 4


@on("dispatcher")
async def test_a_recorded_checkpoint_whose_rows_were_then_deleted_is_refused(env: Env) -> None:
    await env.batches(2)
    env.stop()
    await env.request()
    with pytest.raises(ConnectionError):
        await Crashing(
            pool=env.pool, journal=env.journal, signing=env.signing, record=env.record
        ).seal_once()
    await env.admin.execute(
        f"DELETE FROM {env.s}.journal WHERE id = (SELECT max(id) FROM {env.s}.journal)"
    )
    restarted = Sealer(pool=env.pool, journal=env.journal, signing=env.signing, record=env.record)
    await env.request()
    assert await restarted.seal_all() == 0 and "cut" in (restarted.refused or "")
    seq, _, reason = first(await env.verify())
    assert seq == 7 and "the tail was cut" in reason


@on("planner")
async def test_two_sealers_of_one_service_take_turns(env: Env) -> None:
    other = Sealer(
        pool=env.pool, journal=env.journal, signing=env.signing, record=env.record, interval=0.01
    )
    async with anyio.create_task_group() as tg:
        await tg.start(other.run)
        await env.batches(12, rows=2)
        tg.cancel_scope.cancel()
    assert env.sealer.refused is None and other.refused is None
    report = await env.verify(grace=timedelta(0))
    assert report.ok and report.entries == 24, report.problems


@on("governance")
async def test_an_exported_record_catches_what_it_covers(env: Env, tmp_path: Path) -> None:
    start = (await env.batches(3))[-1][0][0]
    export = FileRecord(tmp_path / "record.jsonl")
    assert await export.export(env.record, [env.service]) == 3
    assert await export.export(env.record, [env.service]) == 0  # appends only what is new
    await env.batches(1)
    assert (await env.verify(record=export, grace=timedelta(0))).ok  # newer than the export
    await cut(env, start)
    assert first(await env.verify(record=export))[0] == start
