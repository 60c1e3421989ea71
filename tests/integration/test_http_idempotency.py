"""The HTTP door's Idempotency-Key store on a real nats-server's key-value bucket, and the
results router on its core subscription."""

from __future__ import annotations

import anyio
import msgspec
import pytest
from nats.aio.client import Client

from libs.provision import IDEMPOTENCY_BUCKET, ensure_bucket
from schemas.api import StartRun
from schemas.host import RunResult
from services.ingress.http._idempotency import Idempotency, fingerprint
from services.ingress.http._problems import ApiError
from services.ingress.http._results import Results

pytestmark = pytest.mark.anyio


async def test_the_first_answer_is_kept_and_another_body_is_a_conflict(private_nc: Client) -> None:
    await ensure_bucket(private_nc.jetstream(), IDEMPOTENCY_BUCKET, replicas=1)  # provisioning
    store = await Idempotency.open(private_nc.jetstream())
    again = await Idempotency.open(private_nc.jetstream())  # the bucket exists: reused
    body = StartRun(agent="crm-assistant", input="x")
    first = fingerprint("alice@acme.example", "POST /api/v1/runs", body)
    assert await store.claim("acme", "key-1", first) is None  # new: go on
    assert await again.claim("acme", "key-1", first) is None  # no answer yet: go on again
    await store.remember("acme", "key-1", first, 202, b'{"run_id":"r"}')
    held = await again.claim("acme", "key-1", first)
    assert held is not None and (held.status, held.body) == (202, b'{"run_id":"r"}')
    other = fingerprint(
        "alice@acme.example", "POST /api/v1/runs", msgspec.structs.replace(body, input="y")
    )
    with pytest.raises(ApiError) as conflict:
        await store.claim("acme", "key-1", other)
    assert (conflict.value.code, conflict.value.status) == ("CONFLICT", 409)
    # Another principal's same body under the key: a conflict, never the first answer.
    with pytest.raises(ApiError) as foreign:
        await store.claim(
            "acme", "key-1", fingerprint("bob@acme.example", "POST /api/v1/runs", body)
        )
    assert foreign.value.code == "CONFLICT" and "run_id" not in foreign.value.detail
    # Keys are per tenant: the same key elsewhere is another request.
    assert await store.claim("globex", "key-1", other) is None


async def test_results_reach_who_waits_for_them_by_request_or_run_id(private_nc: Client) -> None:
    results = Results(private_nc)
    await results.start()
    try:
        async with (
            results.watch("acme", "req-1") as by_request,
            results.watch("acme", "run-1") as by_run,
            results.watch("globex", "req-1") as elsewhere,
        ):
            result = RunResult(request_id="req-1", status="succeeded", run_id="run-1")
            await private_nc.publish("writ.out.results.acme", msgspec.json.encode(result))
            assert await by_request.next(5) == result
            assert await by_run.next(5) == result
            assert await elsewhere.next(0.3) is None  # another tenant's subject
    finally:
        await results.stop()


async def test_closing_ends_every_wait_at_once_and_keeps_what_arrived(private_nc: Client) -> None:
    # A stopping ingress closes the router: its long-polls answer within the HTTP server's
    # graceful shutdown instead of being cut off by it.
    results = Results(private_nc)
    try:
        async with results.watch("acme", "run-2") as early, results.watch("acme", "run-3") as idle:
            result = RunResult(request_id="req-2", status="succeeded", run_id="run-2")
            await private_nc.publish("writ.out.results.acme", msgspec.json.encode(result))
            await private_nc.flush()
            with anyio.fail_after(5):
                while not early.items:
                    await anyio.sleep(0.01)
            ended: list[object] = []

            async def wait() -> None:
                ended.append(await idle.next(60))

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await anyio.sleep(0.2)
                assert not ended and not idle.closing
                results.close()
                with anyio.fail_after(1):  # woken, not left to its 60 s
                    while not ended:
                        await anyio.sleep(0.01)
            assert ended == [None] and idle.closing
            assert await early.next(60) == result  # what came before closing is still read
            assert await early.next(60) is None  # and then no more waiting
        async with results.watch("acme", "run-4") as late:
            with anyio.fail_after(1):
                assert await late.next(60) is None  # a wait begun after closing ends at once
    finally:
        await results.stop()


async def test_a_bucket_without_a_leader_is_unavailable_not_an_internal_error(
    private_nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bucket between leaders answers nothing (no responders, no stream response): the
    request waits it out, then is `503 UNAVAILABLE` to be retried under the same key, never
    a `500` (the cluster soak saw chat messages refused so while a node was down)."""
    from libs.bus import BusUnavailable
    from services.ingress.http import _idempotency

    js = private_nc.jetstream()
    await ensure_bucket(js, IDEMPOTENCY_BUCKET, replicas=1)
    store = await Idempotency.open(js)
    monkeypatch.setattr(_idempotency, "PATIENCE_S", 0.5, raising=False)
    await js.delete_stream(f"KV_{IDEMPOTENCY_BUCKET.bucket}")  # nobody answers for it now
    try:
        body = StartRun(agent="crm-assistant", input="x")
        print_ = fingerprint("alice@acme.example", "POST /api/v1/runs", body)
        with pytest.raises(BusUnavailable):
            await store.claim("acme", "key-2", print_)
        with pytest.raises(BusUnavailable):
            await store.remember("acme", "key-2", print_, 202, b"{}")
    finally:
        await ensure_bucket(js, IDEMPOTENCY_BUCKET, replicas=1)
