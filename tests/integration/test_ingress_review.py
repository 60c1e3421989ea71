"""Ingress hands a verified `ReviewDecision` to the planner's review endpoint on a real
nats-server: an answer the planner does not take in time, or fails to take, is retried (nak'd
and redelivered), never reported accepted; only the planner's answer makes a `ReviewResult`."""

from __future__ import annotations

import anyio
import anyio.abc
import msgspec
import nats
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nats.aio.client import Client
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry

from libs.provision import provision_bus
from libs.runtime import Runtime
from libs.telemetry import make_tracer_provider
from schemas import subjects
from schemas.host import ReviewDecision, ReviewResult
from schemas.planner import REVIEW, ReviewAnswer, ReviewTaken
from services.ingress.logic import TenantKey
from services.ingress.service import IngressService
from writ.stack import mint_token

pytestmark = pytest.mark.anyio

ISSUER = "https://idp.acme.example"
_KEY = Ed25519PrivateKey.generate()
PRIVATE = _KEY.private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
)
KEYS = {
    "acme": TenantKey(
        issuer=ISSUER,
        public_key=_KEY.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode(),
    )
}


@pytest.fixture
async def nc(private_nc: Client) -> Client:
    """This module's own nats-server (see conftest.py), with Writ's streams."""
    await provision_bus(private_nc.jetstream(), ["acme"])
    return private_nc


async def _decide(nc: Client, pending_id: str, request_id: str) -> None:
    token = mint_token(
        PRIVATE, issuer=ISSUER, tenant="acme", principal="ops@acme", roles=["approver"]
    )
    message = ReviewDecision(
        request_id=request_id,
        token=token,
        pending_id=pending_id,
        answer="approve",
        comment="checked",
    )
    await nc.jetstream().publish(
        subjects.review("acme"), msgspec.json.encode(message), headers={"Nats-Msg-Id": request_id}
    )


async def _service(nc: Client, tg: anyio.abc.TaskGroup) -> None:
    rt = Runtime(
        name="ingress",
        nc=nc,
        js=nc.jetstream(),
        registry=CollectorRegistry(),
        tracer_provider=make_tracer_provider("ingress"),
    )
    svc = IngressService(
        rt=rt, keys=KEYS, audience="writ", max_request_bytes=64 * 1024, review_timeout_s=0.3
    )
    await tg.start(svc.run)


async def test_an_unanswered_or_failed_review_is_retried_until_the_planner_takes_it(
    nc: Client, unique: str
) -> None:
    asked: list[ReviewAnswer] = []
    replied = anyio.Event()

    async def planner(msg: Msg) -> None:
        # Silent twice (ingress times out), then a failure, then the run's answer.
        asked.append(msgspec.json.decode(msg.data, type=ReviewAnswer))
        if len(asked) == 3:
            await nc.publish(
                msg.reply,
                b"",
                headers={
                    "Nats-Service-Error-Code": "500",
                    "Nats-Service-Error": "review answer failed",
                },
            )
        elif len(asked) >= 4:
            replied.set()
            await msg.respond(msgspec.json.encode(ReviewTaken(run_id="run-1", status="succeeded")))

    results = await nc.subscribe(subjects.result("acme"))
    review_sub = await nc.subscribe(REVIEW, cb=planner)
    async with anyio.create_task_group() as tg:
        await _service(nc, tg)
        await _decide(nc, "review-run-1-0", f"rev-{unique}")
        with anyio.fail_after(30):
            msg = await results.next_msg(timeout=30)
        assert replied.is_set()  # nothing was reported before the planner took it
        result = msgspec.json.decode(msg.data, type=ReviewResult)
        assert (result.request_id, result.pending_id, result.accepted, result.message) == (
            f"rev-{unique}",
            "review-run-1-0",
            True,
            "approved; the run is succeeded",
        )
        # Built from verified fields only, the same each time it was retried.
        assert len(asked) == 4 and len(set(asked)) == 1
        assert asked[0] == ReviewAnswer(
            tenant="acme",
            run_id="run-1",
            step=0,
            answer="approve",
            reviewer="ops@acme",
            reason="checked",
        )
        tg.cancel_scope.cancel()
    await review_sub.unsubscribe()
    await results.unsubscribe()


async def test_a_review_answer_waits_for_a_planner_to_be_there(nc: Client, unique: str) -> None:
    results = await nc.subscribe(subjects.result("acme"))
    async with anyio.create_task_group() as tg:
        await _service(nc, tg)
        await _decide(nc, "review-run-2-4", f"rev-{unique}")
        with pytest.raises(nats.errors.TimeoutError):  # no responders: nak'd, not answered
            await results.next_msg(timeout=1.5)

        async def planner(msg: Msg) -> None:
            await nc.publish(
                msg.reply,
                b"",
                headers={"Nats-Service-Error-Code": "404", "Nats-Service-Error": "no such run"},
            )

        review_sub = await nc.subscribe(REVIEW, cb=planner)
        result = msgspec.json.decode((await results.next_msg(timeout=30)).data, type=ReviewResult)
        assert (result.accepted, result.pending_id) == (False, "review-run-2-4")
        assert "no review is waiting" in result.message and "no such run" not in result.message
        tg.cancel_scope.cancel()
    await review_sub.unsubscribe()
    await results.unsubscribe()


async def test_an_id_that_names_no_review_never_reaches_the_planner(
    nc: Client, unique: str
) -> None:
    asked: list[Msg] = []

    async def planner(msg: Msg) -> None:
        asked.append(msg)

    review_sub = await nc.subscribe(REVIEW, cb=planner)
    results = await nc.subscribe(subjects.result("acme"))
    async with anyio.create_task_group() as tg:
        await _service(nc, tg)
        await _decide(nc, "prop_abc", f"rev-{unique}")
        result = msgspec.json.decode((await results.next_msg(timeout=30)).data, type=ReviewResult)
        assert (result.accepted, result.pending_id) == (False, "prop_abc")
        assert "no review is waiting" in result.message
        tg.cancel_scope.cancel()
    assert asked == []
    await review_sub.unsubscribe()
    await results.unsubscribe()
