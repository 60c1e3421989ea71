# ruff: noqa: F811 (the journal's `env` fixture is imported, and named by every test)
"""The record outside the database lost, shortened or littered, with the sealer running: it
never adopts what it finds, verify names the loss, and only a signed re-anchoring starts the
record again (`libs/journal/_anchor.py`).

The set-up is `test_journal_record.py`'s: a real append-only JetStream stream for the record,
one journal per test, its sealer running.
"""

from __future__ import annotations

import anyio
import msgspec
import pytest
from nats.aio.client import Client
from prometheus_client import CollectorRegistry

from libs.bus import ensure_streams
from libs.journal import (
    REANCHORED,
    ReAnchorError,
    Sealer,
    anchor_verifies,
    load_verify_keys,
    reanchor,
)
from schemas.journal import JournalCheckpoint
from tests.integration.test_journal_record import Env, cut, env, first, on  # noqa: F401

pytestmark = pytest.mark.anyio


async def refused(env: Env, reason: str) -> None:
    refusals = "writ_journal_seal_refusals_total"
    with anyio.fail_after(10):
        while (
            env.registry.get_sample_value(refusals, {"service": env.service, "reason": reason}) or 0
        ) < 1:
            await anyio.sleep(0.02)


async def lose_the_record(env: Env, nc: Client) -> None:
    """What deleting the record's stream and declaring it again (as a service starting did)
    leaves: an empty record."""
    js = nc.jetstream()
    await js.delete_stream(env.record.stream)
    await ensure_streams(js, [env.record.spec()])


async def restart(env: Env) -> None:
    """A new process of the service: a sealer that knows nothing but the record."""
    env.stop()
    env.registry = CollectorRegistry()
    env.sealer = Sealer(
        pool=env.pool,
        journal=env.journal,
        signing=env.signing,
        record=env.record,
        registry=env.registry,
        interval=0.02,
    )
    await env.sealer.seal_once()


@on("governance", "dispatcher")
async def test_a_lost_record_is_refused_not_adopted_and_verify_names_it(
    env: Env, nc: Client
) -> None:
    await env.batches(3)
    await lose_the_record(env, nc)
    await restart(env)
    await env.request()
    for _ in range(3):  # every round refuses, rows to seal or not
        assert await env.sealer.seal_once() == 0
    assert env.sealer.refused is not None and "re-anchor" in env.sealer.refused
    assert env.registry.get_sample_value(
        "writ_journal_seal_refusals_total",
        {"service": env.service, "reason": "record_missing"},
    )
    assert await env.record.read(env.service) == []  # nothing adopted
    assert await env.seals() == 9
    seq, entry_id, reason = first(await env.verify())
    assert (seq, entry_id) == (None, None)
    assert "has no checkpoint of this journal" in reason and "up to seq 9" in reason

    # The stream itself gone: verify says so (and reads nothing to crash on).
    await nc.jetstream().delete_stream(env.record.stream)
    _, _, reason = first(await env.verify())
    assert "the record outside the database is missing" in reason
    assert await env.sealer.seal_once() == 0
    await ensure_streams(nc.jetstream(), [env.record.spec()])


@on("planner")
async def test_a_running_sealer_whose_record_vanishes_refuses_from_its_next_round(
    env: Env, nc: Client
) -> None:
    await env.batches(2)
    await lose_the_record(env, nc)
    await env.request()
    await refused(env, "record_missing")
    assert await env.record.read(env.service) == []
    assert await env.seals() == 6


@on("admission")
async def test_re_anchoring_names_what_was_lost_is_signed_journaled_and_sealing_resumes(
    env: Env, nc: Client
) -> None:
    await env.batches(3)
    with pytest.raises(ReAnchorError, match="nothing to re-anchor"):
        await _reanchor(env)
    await lose_the_record(env, nc)
    await env.request()
    await refused(env, "record_missing")

    anchor = await _reanchor(env)
    assert anchor.seq == 9 and anchor.reanchor is not None
    assert (anchor.reanchor.record_last, anchor.reanchor.unrecorded) == (0, 3)
    keys = load_verify_keys(msgspec.json.encode(env.public))[env.service]
    assert anchor_verifies(anchor, keys)
    forged = msgspec.structs.replace(
        anchor, reanchor=msgspec.structs.replace(anchor.reanchor, unrecorded=0)
    )
    assert not anchor_verifies(forged, keys)  # what was lost is under the signature

    with anyio.fail_after(10):  # the request's rows and the re-anchoring's own, on the anchor
        while await env.seals() < 13:
            await anyio.sleep(0.02)
    assert env.sealer.refused is None
    kinds = await env.admin.fetch(
        f"SELECT j.kind FROM {env.s}.journal_seals s JOIN {env.s}.journal j "
        "ON j.id = s.entry_id WHERE s.seq > 9"
    )
    assert REANCHORED in {r["kind"] for r in kinds}
    report = await env.verify()
    assert report.ok, report.problems
    assert len(report.reanchored) == 1
    assert "re-anchored at seq 9 by ops@example.com" in report.reanchored[0]
    assert "3 checkpoint(s) up to seq 9 were not in the record" in report.reanchored[0]
    recorded = await env.record.read(env.service)
    assert recorded[0].reanchor is not None and recorded[1].prev_seq == 9


@on("governance")
async def test_re_anchoring_after_a_cut_tail_names_the_cut_and_keeps_holding_the_rest(
    env: Env,
) -> None:
    start = (await env.batches(4))[-1][0][0]
    await cut(env, start)
    await refused(env, "head_differs")
    anchor = await _reanchor(env)
    assert anchor.reanchor is not None
    assert (anchor.seq, anchor.reanchor.cut_to, anchor.reanchor.unrecorded) == (9, 12, 0)
    await env.request()
    with anyio.fail_after(10):
        while await env.seals() < 13:
            await anyio.sleep(0.02)
    report = await env.verify()
    assert report.ok, report.problems
    assert "after seq 9 up to seq 12 were cut from the database" in report.reanchored[0]
    # The history the record kept below the anchor is still held: a rewrite there is named.
    await env.admin.execute(
        f"UPDATE {env.s}.journal_seals SET entry_hash = sha256(entry_hash) WHERE seq = 3"
    )
    assert not (await env.verify()).ok


@on("dispatcher")
async def test_junk_on_the_record_does_not_stop_the_sealer_and_verify_names_its_sequence(
    env: Env, nc: Client
) -> None:
    await env.batches(2)
    js = nc.jetstream()
    subject = env.record.subject(env.service)
    acks = [
        await js.publish(subject, body, stream=env.record.stream)
        for body in (b'{"stream":"WRIT_AUDIT","seq":7}', b"", b"\xff garbage")
    ]
    for _ in range(2):
        await env.request()
        await env.settled()
    assert env.sealer.refused is None
    assert await env.seals() == 12
    report = await env.verify()
    junk = [str(p) for p in report.problems]
    assert len(junk) == 3, junk
    for ack, problem in zip(acks, junk, strict=True):
        assert f"the record's message at stream sequence {ack.seq} is not a checkpoint" in problem
    # A sealer starting on top of junk finds its checkpoint below it.
    assert (await env.record.last(env.service))[1].seq == 12  # type: ignore[union-attr]
    await js.publish(subject, b"junk on top", stream=env.record.stream)
    await restart(env)
    await env.request()
    assert await env.sealer.seal_once() == 3
    # An operator's re-anchoring acknowledges the junk it names: verify reports, not fails.
    await js.publish(subject, b"more junk", stream=env.record.stream)
    anchor = await _reanchor(env)
    assert anchor.reanchor is not None and len(anchor.reanchor.junk) == 5
    report = await env.verify()
    assert report.ok, report.problems
    assert "junk at stream sequence(s)" in report.reanchored[0]


async def _reanchor(env: Env) -> JournalCheckpoint:
    async with env.pool.acquire() as conn:
        return await reanchor(
            conn,
            record=env.record,
            journal=env.journal,
            signing=env.signing,
            by="ops@example.com",
            reason="the record was deleted",
        )
