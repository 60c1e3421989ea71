"""The planner's sweeper re-drives a run whose message the bus lost, from PostgreSQL alone.

The planner is killed with a run's decision and its proposal committed and nothing published
(`planner.before_proposal`); then the administrator deletes the run's start from the stream, so
no redelivery ever comes. Without the sweeper the run stays `running` forever; with it the run
ends within the stated bound (60 s after the planner is back), its command made once and the
model asked once per decision. Left in the stream, the start is redelivered while the sweeper
drives the same run: it still takes no step twice. A command's outcome deleted before the
planner handled it is read from admission's registry: the run observes it once and ends. And a
run waiting for a person whose answer's announcement was deleted is driven from governance's
record of the answer: it reads once, and ends; one whose approved refund's outcome was deleted
observes it from admission's registry: one refund, and it ends. A refund a person rejected,
its refusal deleted, is observed from admission's record of the proposal: the run fails
`REJECTED` once, nothing refunded, and the refusal arriving late changes nothing. One refused
as invalid, its refusal deleted, is observed from admission's record of that refusal: the run
fails `INVALID_PROPOSAL` once. And an approval governance recorded while admission died before
claiming the proposal, its message deleted, is acted on by admission's sweeper from governance's
record: one refund, and the run ends; a proposal that expired unanswered, governance's deny
deleted before admission handled it, is expired from that record: the run fails `REJECTED`,
nothing refunded. A run whose end was committed and whose result was not
published, the planner killed in between and the outcome that ended it deleted, has its result
published by the sweeper, once. A host command whose outcome was deleted before admission
answered it is answered by admission's sweeper from the registry, once.
"""

from __future__ import annotations

import json
import secrets
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import asyncpg
import httpx
import nats.js.errors
import pytest
from nats.js.api import RawStreamMsg

from fakes.llm import FakeLlm
from libs.faults import CRASH_STATUS
from schemas import subjects
from schemas.host import CommandResult, RunResult
from tests.e2e.conftest import Host
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.timeout(400)]

BOUND_S = 60.0  # every accepted request ends within this of the fault healing (docs/soak.md)
STALL_S = 2.0


@pytest.fixture(scope="module")
def llm() -> Iterator[tuple[FakeLlm, str]]:
    token = secrets.token_urlsafe(16)
    fake = FakeLlm(token=token)
    fake.start()
    yield fake, token
    fake.stop()


@pytest.fixture(scope="module")
def stack(llm: tuple[FakeLlm, str]) -> Iterator[Stack]:
    fake, token = llm
    with tempfile.TemporaryDirectory(prefix="writ-sweep-") as home:
        root = Path(home)
        agents = root / "agents"
        agents.mkdir()
        manifest = {
            "name": "crm-assistant",
            "version": "1.0.0",
            "provider": "openai",
            "responsibility": "Record customer calls as CRM notes on the customer's record.",
            "uses": [{"kind": "action", "name": "crm.note.create"}],
        }
        (agents / "crm-assistant.json").write_text(json.dumps(manifest))
        lookup = {
            **manifest,
            "name": "lookup-assistant",
            "uses": [{"kind": "tool", "name": "crm.customer.get"}],
        }
        (agents / "lookup-assistant.json").write_text(json.dumps(lookup))
        refunds = {
            **manifest,
            "name": "refund-assistant",
            "uses": [{"kind": "action", "name": "payment.refund"}],
        }
        (agents / "refund-assistant.json").write_text(json.dumps(refunds))
        key = root / "model.key"
        key.write_text(token)
        faults = root / "faults"
        faults.write_text("")
        deployment = Stack(
            root / "stack",
            database="sweep",
            durable_pg=False,
            extra_env={
                "*": {"WRIT_FAULTS_FILE": str(faults), "WRIT_DRAIN_TIMEOUT_S": "2"},
                # Ingress refuses a run for an agent it does not know, at the door.
                "ingress": {"WRIT_AGENTS_DIR": str(agents)},
                "planner": {
                    "WRIT_PROVIDER": "openai",
                    "WRIT_MODEL_URL": f"{fake.url}/v1",
                    "WRIT_MODEL_NAME": "fake-model",
                    "WRIT_MODEL_KEY_FILE": str(key),
                    "WRIT_AGENTS_DIR": str(agents),
                    "WRIT_RUN_SWEEP_STALL_S": str(STALL_S),
                    "WRIT_RUN_SWEEP_EVERY_S": "1",
                },
                "admission": {
                    "WRIT_ANSWER_SWEEP_STALL_S": str(STALL_S),
                    "WRIT_ANSWER_SWEEP_EVERY_S": "1",
                },
            },
        )
        try:
            deployment.start_all()
            yield deployment
        finally:
            deployment.stop()


@pytest.fixture
def model(llm: tuple[FakeLlm, str]) -> Iterator[httpx.Client]:
    fake, token = llm
    with httpx.Client(
        base_url=fake.url, timeout=5, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        # A reply a test scripted only to show the model was not asked is left for no other.
        client.post("/_control/reset").raise_for_status()
        yield client


@pytest.fixture
async def db(stack: Stack) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(stack.database_dsn)
    yield conn
    await conn.close()


def _script(model: httpx.Client, body: str) -> None:
    replies = [
        {
            "next": {
                "decision": "select_capability",
                "capability": "crm.note.create",
                "arguments": json.dumps({"customer_id": "ACME-42", "body": body}),
            }
        },
        {"next": {"decision": "answer_directly", "answer": f"Noted: {body}"}},
    ]
    model.post(
        "/_control/replies", json={"replies": [{"content": json.dumps(c)} for c in replies]}
    ).raise_for_status()


def _calls(model: httpx.Client) -> int:
    return len(model.get("/_control/requests").json())


async def _killed_before_proposing(
    stack: Stack, host: Host, db: asyncpg.Connection, body: str
) -> tuple[str, str]:
    """A run whose decision and proposal are committed and unpublished, its planner dead:
    (request id, run id)."""
    faults = Path(stack.extra_env["*"]["WRIT_FAULTS_FILE"])
    await anyio.Path(faults).write_text("planner.before_proposal")
    request = host.request(text=f"Note that {body}")
    await host.publish(request, msg_id=request.request_id)
    planner = stack.procs["planner"]
    with anyio.fail_after(30):
        while planner.poll() is None:
            await anyio.sleep(0.05)
    assert planner.returncode == CRASH_STATUS, stack.log_tail("planner")
    run_id = await db.fetchval(
        "SELECT run_id FROM planner.runs WHERE request_id = $1", request.request_id
    )
    assert run_id is not None
    assert await db.fetchval("SELECT status FROM planner.runs WHERE run_id = $1", run_id) == (
        "running"
    )
    assert await db.fetchval("SELECT count(*) FROM planner.steps WHERE run_id = $1", run_id) == 1
    return request.request_id, str(run_id)


async def _planner_restarted(stack: Stack) -> None:
    stack.stop_process("planner")
    await _restarted(stack, "planner")


async def _done_once(db: asyncpg.Connection, run_id: str) -> None:
    kinds = await db.fetch("SELECT kind FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id)
    assert [k["kind"] for k in kinds] == ["decision", "observation", "decision"]
    commands = await db.fetch("SELECT state FROM admission.commands WHERE run_id = $1", run_id)
    assert [c["state"] for c in commands] == ["succeeded"]  # one command, one operation id
    attempts = await db.fetchval(
        "SELECT count(*) FROM dispatcher.attempts a JOIN admission.commands c "
        "USING (tenant, operation_id) WHERE c.run_id = $1",
        run_id,
    )
    assert attempts == 1  # the connector called once


async def _restarted(stack: Stack, service: str) -> float:
    """Start `service` again and wait until it is ready: when the fault healed."""
    stack.start_instance(service, service)
    await stack.wait_ready((service,))
    return time.monotonic()


async def _swept(stack: Stack, host: Host, request_id: str, status: str | None = None) -> RunResult:
    """The run's result within the bound; past it, what the planner logged meanwhile."""
    try:
        return await host.wait_result(request_id, status=status, timeout=BOUND_S)
    except TimeoutError:
        raise AssertionError(
            f"no result within {BOUND_S} s:\n{stack.log_tail('planner', 6000)}"
        ) from None


async def _delete_the_outcome(host: Host, db: asyncpg.Connection, run_id: str) -> None:
    """Once the run's command succeeded, delete its outcome from the stream, unhandled."""
    with anyio.fail_after(30):
        while (
            await db.fetchval("SELECT state FROM admission.commands WHERE run_id = $1", run_id)
            != "succeeded"
        ):
            await anyio.sleep(0.05)
    outcome = subjects.outcome("acme", "run")
    with anyio.fail_after(10):
        while True:
            try:
                last = await host.js.get_last_msg("WRIT_INT", outcome)
            except nats.js.errors.NotFoundError:
                last = None
            if last is not None and f'"run_id":"{run_id}"'.encode() in (last.data or b""):
                break
            await anyio.sleep(0.05)
    assert last.seq is not None
    await host.js.delete_msg("WRIT_INT", last.seq)


async def test_a_run_whose_message_was_deleted_is_finished_by_the_sweeper(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    before = _calls(model)
    _script(model, "called back about order 51.")
    body = "called back about order 51."
    request_id, run_id = await _killed_before_proposing(stack, host, db, body)
    # The administrator deletes the run's start: nothing on the bus will drive the run again.
    last = await host.js.get_last_msg("WRIT_INT", subjects.evidence("acme"))
    assert last.seq is not None
    await host.js.delete_msg("WRIT_INT", last.seq)

    await _planner_restarted(stack)
    healed = time.monotonic()
    result = await host.wait_result(request_id, timeout=BOUND_S)

    assert time.monotonic() - healed < BOUND_S
    assert result.status == "succeeded", (result, stack.log_tail("planner"))
    assert result.answer == "Noted: called back about order 51."
    await _done_once(db, run_id)
    assert _calls(model) - before == 2  # once per decision
    assert f"sweeper drives run acme:{run_id}" in (stack.logs / "planner.log").read_text()


async def test_a_run_swept_while_its_message_is_redelivered_takes_no_step_twice(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    before = _calls(model)
    _script(model, "called back about order 52.")
    body = "called back about order 52."
    request_id, run_id = await _killed_before_proposing(stack, host, db, body)
    start = (await host.js.get_last_msg("WRIT_INT", subjects.evidence("acme"))).seq

    await _planner_restarted(stack)
    result = await host.wait_result(request_id, timeout=BOUND_S)
    assert result.status == "succeeded", (result, stack.log_tail("planner"))
    # The start is still in the stream, unacknowledged (the killed planner never acked it):
    # once its ack wait is over it is delivered again, to a run the sweeper already drove,
    # and acked only after that delivery was handled.
    with anyio.fail_after(90):
        while True:
            info = await host.js.consumer_info("WRIT_INT", "planner")
            if info.ack_floor.stream_seq >= start and info.num_ack_pending == 0:
                break
            await anyio.sleep(0.5)
    await anyio.sleep(2)  # what the redelivery published, if anything, has landed

    await _done_once(db, run_id)
    assert _calls(model) - before == 2  # the model was not asked again by either
    assert f"sweeper drives run acme:{run_id}" in (stack.logs / "planner.log").read_text()
    assert await db.fetchval("SELECT status FROM planner.runs WHERE run_id = $1", run_id) == (
        "succeeded"
    )


async def test_a_run_whose_outcome_was_deleted_observes_it_from_the_registry(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    before = _calls(model)
    body = "called back about order 53."
    _script(model, body)
    request = host.request(text=f"Note that {body}")
    planner, dispatcher = stack.procs["planner"], stack.procs["dispatcher"]
    # The planner is frozen once its proposal is admitted, so the outcome is never handled.
    # The dispatcher is frozen meanwhile: no outcome can reach the planner before it is.
    dispatcher.send_signal(signal.SIGSTOP)
    try:
        await host.publish(request, msg_id=request.request_id)
        with anyio.fail_after(30):
            while not await db.fetchval(
                "SELECT count(*) FROM admission.commands c JOIN planner.runs r USING (run_id) "
                "WHERE r.request_id = $1",
                request.request_id,
            ):
                await anyio.sleep(0.02)
        planner.send_signal(signal.SIGSTOP)
    finally:
        dispatcher.send_signal(signal.SIGCONT)
    run_id = await db.fetchval(
        "SELECT run_id FROM planner.runs WHERE request_id = $1", request.request_id
    )
    await _delete_the_outcome(host, db, str(run_id))
    stack.stop_process("planner", kill=True)  # what it had fetched dies with it
    assert await db.fetchval("SELECT status FROM planner.runs WHERE run_id = $1", run_id) == (
        "running"
    )

    healed = await _restarted(stack, "planner")
    result = await _swept(stack, host, request.request_id)

    assert time.monotonic() - healed < BOUND_S
    assert result.status == "succeeded", (result, stack.log_tail("planner"))
    await _done_once(db, str(run_id))
    assert _calls(model) - before == 2


async def test_a_run_whose_persons_answer_was_deleted_is_resumed_from_the_record(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    before = _calls(model)
    lookup = {
        "next": {
            "decision": "select_capability",
            "capability": "tool:crm.customer.get",
            "arguments": json.dumps({"customer_id": "ACME-42"}),
        }
    }
    model.post(
        "/_control/replies",
        json={
            "replies": [
                {"content": json.dumps(c)}
                for c in (lookup, {"next": {"decision": "answer_directly", "answer": "Active."}})
            ]
        },
    ).raise_for_status()
    request = host.request(agent="lookup-assistant", text="Is ACME-42 still a customer?")
    await host.publish(request, msg_id=request.request_id)
    try:
        stopped = await host.wait_result(request.request_id, status="awaiting_human", timeout=60)
    except TimeoutError:
        raise AssertionError(
            (await host.results(request.request_id), stack.log_tail("planner"))
        ) from None
    assert stopped.pending_id is not None and stopped.run_id is not None
    run_id = stopped.run_id
    # The planner is frozen: the person's answer is recorded and announced, never handled.
    planner = stack.procs["planner"]
    planner.send_signal(signal.SIGSTOP)
    assert (await host.decide(stopped.pending_id, "once")).accepted
    with anyio.fail_after(10):
        while True:
            try:
                last = await host.js.get_last_msg("WRIT_INT", subjects.answered("acme"))
            except nats.js.errors.NotFoundError:
                last = None
            if last is not None and stopped.pending_id.encode() in (last.data or b""):
                break
            await anyio.sleep(0.05)
    assert last.seq is not None
    await host.js.delete_msg("WRIT_INT", last.seq)  # the announcement is gone
    stack.stop_process("planner", kill=True)  # what it had fetched dies with it
    assert await db.fetchval("SELECT status FROM planner.runs WHERE run_id = $1", run_id) == (
        "awaiting_human"
    )

    healed = await _restarted(stack, "planner")
    result = await _swept(stack, host, request.request_id, status="succeeded")

    assert time.monotonic() - healed < BOUND_S
    assert result.answer == "Active.", (result, stack.log_tail("planner"))
    kinds = await db.fetch("SELECT kind FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id)
    assert [k["kind"] for k in kinds] == ["decision", "observation", "decision"]
    decided = await db.fetch(
        "SELECT verdict FROM governance.decisions WHERE run_id = $1 ORDER BY decided_at", run_id
    )
    # Asked, answered, read once with the answer as its approval: nothing twice.
    assert [d["verdict"] for d in decided] == ["ask", "allow", "allow"]
    assert _calls(model) - before == 2
    assert f"sweeper drives run acme:{run_id}" in (stack.logs / "planner.log").read_text()
    # Swept once more after it ended, nothing changes: it waits on nothing now.
    await anyio.sleep(2 * STALL_S + 1)
    assert len(await db.fetch("SELECT 1 FROM planner.steps WHERE run_id = $1", run_id)) == 3


async def test_an_approved_wait_whose_outcome_was_deleted_observes_it_from_the_registry(
    stack: Stack,
    host: Host,
    db: asyncpg.Connection,
    model: httpx.Client,
    payments: httpx.Client,
) -> None:
    before = _calls(model)
    refund = {
        "next": {
            "decision": "select_capability",
            "capability": "payment.refund",
            "arguments": json.dumps({"payment_id": "pay_7781", "line_id": "L2"}),
        }
    }
    answer = {"next": {"decision": "answer_directly", "answer": "Refunded."}}
    model.post(
        "/_control/replies",
        json={"replies": [{"content": json.dumps(c)} for c in (refund, answer)]},
    ).raise_for_status()
    request = host.request(agent="refund-assistant", text="Refund the sibling discount.")
    await host.publish(request, msg_id=request.request_id)
    waiting = await host.wait_result(request.request_id, status="awaiting_human", timeout=60)
    assert waiting.proposal is not None and waiting.run_id is not None, waiting
    run_id = waiting.run_id
    # The planner is frozen: the approved refund is made, its outcome never handled.
    planner = stack.procs["planner"]
    planner.send_signal(signal.SIGSTOP)
    await host.approve(waiting.proposal.proposal_id)
    await _delete_the_outcome(host, db, str(run_id))
    stack.stop_process("planner", kill=True)
    assert await db.fetchval("SELECT status FROM planner.runs WHERE run_id = $1", run_id) == (
        "awaiting_human"
    )

    healed = await _restarted(stack, "planner")
    result = await _swept(stack, host, request.request_id, status="succeeded")

    assert time.monotonic() - healed < BOUND_S
    assert result.answer == "Refunded.", (result, stack.log_tail("planner"))
    kinds = await db.fetch("SELECT kind FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id)
    assert [k["kind"] for k in kinds] == ["decision", "observation", "decision"]
    refunds = [r for r in payments.get("/_control/refunds").json() if r["payment_id"] == "pay_7781"]
    assert len(refunds) == 1  # made once, observed once
    assert _calls(model) - before == 2
    assert f"sweeper drives run acme:{run_id}" in (stack.logs / "planner.log").read_text()


async def test_a_rejected_proposal_whose_refusal_was_deleted_ends_the_run_from_the_record(
    stack: Stack,
    host: Host,
    db: asyncpg.Connection,
    model: httpx.Client,
    payments: httpx.Client,
) -> None:
    before = _calls(model)
    refund = {
        "next": {
            "decision": "select_capability",
            "capability": "payment.refund",
            "arguments": json.dumps({"payment_id": "pay_7781", "line_id": "L2"}),
        }
    }
    # A second decision is scripted only to be seen if the model were asked for one.
    answer = {"next": {"decision": "answer_directly", "answer": "Refunded anyway."}}
    model.post(
        "/_control/replies",
        json={"replies": [{"content": json.dumps(c)} for c in (refund, answer)]},
    ).raise_for_status()
    request = host.request(agent="refund-assistant", text="Refund the duplicated line.")
    await host.publish(request, msg_id=request.request_id)
    waiting = await host.wait_result(request.request_id, status="awaiting_human", timeout=60)
    assert waiting.proposal is not None and waiting.run_id is not None, waiting
    run_id = waiting.run_id
    # The planner is frozen: a person rejects the refund, admission records it and tells the
    # run, and the administrator deletes that refusal before anyone handled it.
    planner = stack.procs["planner"]
    planner.send_signal(signal.SIGSTOP)
    await host.approve(waiting.proposal.proposal_id, answer="reject", reason="not this line")
    refused = subjects.refused("acme")
    with anyio.fail_after(30):
        while True:
            try:
                last = await host.js.get_last_msg("WRIT_INT", refused)
            except nats.js.errors.NotFoundError:
                last = None
            data = (last.data or b"") if last is not None else b""
            # The refusal, not the ask before it (both are the run's, on the same subject).
            if f'"run_id":"{run_id}"'.encode() in data and b'"verdict":"rejected"' in data:
                break
            await anyio.sleep(0.05)
    assert last is not None and last.seq is not None and last.data is not None
    await host.js.delete_msg("WRIT_INT", last.seq)
    stack.stop_process("planner", kill=True)  # what it had fetched dies with it
    assert await db.fetchval("SELECT status FROM planner.runs WHERE run_id = $1", run_id) == (
        "awaiting_human"
    )

    healed = await _restarted(stack, "planner")
    result = await _swept(stack, host, request.request_id, status="failed")

    assert time.monotonic() - healed < BOUND_S
    assert result.error is not None and result.error.code == "REJECTED", result
    assert "rejected by ops@acme.example: not this line" in result.error.message
    kinds = await db.fetch(
        "SELECT kind, payload FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id
    )
    assert [k["kind"] for k in kinds] == ["decision", "observation"]  # observed once
    assert json.loads(kinds[1]["payload"])["refused"] == "rejected"
    refunds = [r for r in payments.get("/_control/refunds").json() if r["payment_id"] == "pay_7781"]
    assert refunds == []  # nothing ran
    assert _calls(model) - before == 1  # once per decision: none after the refusal
    assert f"sweeper drives run acme:{run_id}" in (stack.logs / "planner.log").read_text()
    # The refusal arriving late, as a redelivery would, changes nothing; nor does a sweep.
    await host.js.publish(refused, last.data, headers={"Nats-Msg-Id": f"late-{run_id}"})
    await anyio.sleep(2 * STALL_S + 1)
    assert len(await db.fetch("SELECT 1 FROM planner.steps WHERE run_id = $1", run_id)) == 2
    assert await db.fetchval("SELECT status FROM planner.runs WHERE run_id = $1", run_id) == (
        "failed"
    )
    assert _calls(model) - before == 1


def _new_payment(payments: httpx.Client) -> str:
    """A payment of its own, whose line L2's discount no test refunded yet: its id."""
    payment_id = f"pay_{secrets.token_hex(6)}"
    line = {"line_id": "L2", "product": "Junior programme", "participant": "Léo Martin"}
    discount = {"discount_id": "D-SIB", "name": "Sibling discount", "amount_cents": 1500}
    payments.post(
        "/_control/payments",
        json={
            "payment_id": payment_id,
            "customer_id": "ACME-42",
            "currency": "EUR",
            "status": "captured",
            "method": {"kind": "card", "last4": "4242", "usable": True},
            "lines": [{**line, "amount_cents": 12000, "discount": discount}],
        },
    ).raise_for_status()
    return payment_id


def _refunds(payments: httpx.Client, payment_id: str) -> list[dict[str, object]]:
    return [r for r in payments.get("/_control/refunds").json() if r["payment_id"] == payment_id]


async def _last_on(host: Host, subject: str, *needles: bytes, timeout: float = 30) -> RawStreamMsg:
    """The last message on `subject` in WRIT_INT once it holds every one of `needles`."""
    with anyio.fail_after(timeout):
        while True:
            try:
                last = await host.js.get_last_msg("WRIT_INT", subject)
            except nats.js.errors.NotFoundError:
                last = None
            data = (last.data or b"") if last is not None else b""
            if last is not None and all(n in data for n in needles):
                return last
            await anyio.sleep(0.02)


async def test_an_invalid_proposal_whose_refusal_was_deleted_is_observed_from_the_record(
    stack: Stack,
    host: Host,
    db: asyncpg.Connection,
    model: httpx.Client,
    payments: httpx.Client,
) -> None:
    before = _calls(model)
    # A line the payment does not have: admission refuses the proposal as invalid.
    refund = {
        "next": {
            "decision": "select_capability",
            "capability": "payment.refund",
            "arguments": json.dumps({"payment_id": "pay_7781", "line_id": "L9"}),
        }
    }
    # A second decision is scripted only to be seen if the model were asked for one.
    answer = {"next": {"decision": "answer_directly", "answer": "Refunded anyway."}}
    model.post(
        "/_control/replies",
        json={"replies": [{"content": json.dumps(c)} for c in (refund, answer)]},
    ).raise_for_status()
    request = host.request(agent="refund-assistant", text="Refund line L9.")
    planner, admission = stack.procs["planner"], stack.procs["admission"]
    # Admission is frozen until the planner is: the refusal cannot reach the planner before.
    admission.send_signal(signal.SIGSTOP)
    try:
        await host.publish(request, msg_id=request.request_id)
        with anyio.fail_after(30):
            while (
                run_id := await db.fetchval(
                    "SELECT run_id FROM planner.runs WHERE request_id = $1", request.request_id
                )
            ) is None:
                await anyio.sleep(0.02)
        await _last_on(host, subjects.proposal("acme"), f'"run_id":"{run_id}"'.encode())
        planner.send_signal(signal.SIGSTOP)
    finally:
        admission.send_signal(signal.SIGCONT)
    # The refusal is published, and deleted before anyone handled it.
    refused = await _last_on(
        host, subjects.refused("acme"), f'"run_id":"{run_id}"'.encode(), b'"verdict":"invalid"'
    )
    assert refused.seq is not None
    await host.js.delete_msg("WRIT_INT", refused.seq)
    stack.stop_process("planner", kill=True)  # what it had fetched dies with it
    assert await db.fetchval("SELECT status FROM planner.runs WHERE run_id = $1", run_id) == (
        "running"
    )

    healed = await _restarted(stack, "planner")
    result = await _swept(stack, host, request.request_id, status="failed")

    assert time.monotonic() - healed < BOUND_S
    assert result.error is not None and result.error.code == "INVALID_PROPOSAL", result
    assert "has no line L9" in result.error.message
    kinds = await db.fetch(
        "SELECT kind, payload FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id
    )
    assert [k["kind"] for k in kinds] == ["decision", "observation"]  # observed once
    assert json.loads(kinds[1]["payload"])["refused"] == "invalid"
    assert "has no line L9" in kinds[1]["payload"]
    refunds = [r for r in payments.get("/_control/refunds").json() if r["payment_id"] == "pay_7781"]
    assert refunds == []
    assert _calls(model) - before == 1  # once per decision: none after the refusal
    assert f"sweeper drives run acme:{run_id}" in (stack.logs / "planner.log").read_text()


async def test_an_approval_governance_recorded_and_admission_never_claimed_is_swept(
    stack: Stack,
    host: Host,
    db: asyncpg.Connection,
    model: httpx.Client,
    payments: httpx.Client,
) -> None:
    before = _calls(model)
    payment_id = _new_payment(payments)
    refund = {
        "next": {
            "decision": "select_capability",
            "capability": "payment.refund",
            "arguments": json.dumps({"payment_id": payment_id, "line_id": "L2"}),
        }
    }
    answer = {"next": {"decision": "answer_directly", "answer": "Refunded."}}
    model.post(
        "/_control/replies",
        json={"replies": [{"content": json.dumps(c)} for c in (refund, answer)]},
    ).raise_for_status()
    request = host.request(agent="refund-assistant", text="Refund the sibling discount again.")
    await host.publish(request, msg_id=request.request_id)
    waiting = await host.wait_result(request.request_id, status="awaiting_human", timeout=60)
    assert waiting.proposal is not None and waiting.run_id is not None, waiting
    run_id, proposal_id = waiting.run_id, waiting.proposal.proposal_id
    # Admission dies once governance recorded the approval and before it claimed the proposal;
    # the administrator deletes the approval's message, so it is never delivered again.
    faults = Path(stack.extra_env["*"]["WRIT_FAULTS_FILE"])
    await anyio.Path(faults).write_text("admission.after_answer")
    approval = await host.approve(proposal_id)
    admission = stack.procs["admission"]
    with anyio.fail_after(30):
        while admission.poll() is None:
            await anyio.sleep(0.05)
    assert admission.returncode == CRASH_STATUS, stack.log_tail("admission")
    recorded = await _last_on(host, subjects.proposal_answer("acme"), approval.encode())
    assert recorded.seq is not None
    await host.js.delete_msg("WRIT_INT", recorded.seq)
    assert await db.fetchval(
        "SELECT answer FROM governance.pending p JOIN admission.proposals a "
        "ON a.decision_id = p.pending_id WHERE a.public_id = $1",
        proposal_id,
    ) == ("once")
    assert await db.fetchval(
        "SELECT state FROM admission.proposals WHERE public_id = $1", proposal_id
    ) == ("pending")

    healed = await _restarted(stack, "admission")
    try:
        result = await host.wait_result(request.request_id, status="succeeded", timeout=BOUND_S)
    except TimeoutError:
        raise AssertionError(
            f"no result within {BOUND_S} s:\n{stack.log_tail('admission', 6000)}"
        ) from None

    assert time.monotonic() - healed < BOUND_S
    assert result.answer == "Refunded.", result
    kinds = await db.fetch("SELECT kind FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id)
    assert [k["kind"] for k in kinds] == ["decision", "observation", "decision"]
    commands = await db.fetch("SELECT state FROM admission.commands WHERE run_id = $1", run_id)
    assert [c["state"] for c in commands] == ["succeeded"]  # one command
    assert len(_refunds(payments, payment_id)) == 1  # one refund
    assert _calls(model) - before == 2
    log = (stack.logs / "admission.log").read_text()
    assert "sweeper acts on the answer to proposal acme:" in log
    # Swept again, nothing changes: the proposal is no longer pending.
    await anyio.sleep(2 * STALL_S + 1)
    assert len(await db.fetch("SELECT 1 FROM admission.commands WHERE run_id = $1", run_id)) == 1
    assert len(_refunds(payments, payment_id)) == 1


async def test_a_run_that_ended_unannounced_has_its_result_published_by_the_sweeper(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    before = _calls(model)
    body = "called back about order 54."
    _script(model, body)
    # The planner dies once the run's end is committed, before its result is published; the
    # administrator deletes the outcome that drove it there, so no delivery repeats it.
    faults = Path(stack.extra_env["*"]["WRIT_FAULTS_FILE"])
    await anyio.Path(faults).write_text("planner.before_result")
    request = host.request(text=f"Note that {body}")
    await host.publish(request, msg_id=request.request_id)
    planner = stack.procs["planner"]
    with anyio.fail_after(60):
        while planner.poll() is None:
            await anyio.sleep(0.05)
    assert planner.returncode == CRASH_STATUS, stack.log_tail("planner")
    run_id = await db.fetchval(
        "SELECT run_id FROM planner.runs WHERE request_id = $1", request.request_id
    )
    assert await db.fetchval("SELECT status FROM planner.runs WHERE run_id = $1", run_id) == (
        "succeeded"
    )
    outcome = await _last_on(host, subjects.outcome("acme", "run"), f'"run_id":"{run_id}"'.encode())
    assert outcome.seq is not None
    await host.js.delete_msg("WRIT_INT", outcome.seq)
    assert not [r for r in await host.results(request.request_id) if isinstance(r, RunResult)]

    healed = await _restarted(stack, "planner")
    result = await _swept(stack, host, request.request_id)

    assert time.monotonic() - healed < BOUND_S
    assert result.status == "succeeded", result
    assert result.answer == f"Noted: {body}"
    await _done_once(db, str(run_id))
    assert _calls(model) - before == 2  # once per decision
    log = (stack.logs / "planner.log").read_text()
    assert f"sweeper publishes the result of run acme:{run_id} again" in log
    # Published once, and owed no more: later sweeps leave it alone.
    await anyio.sleep(2 * STALL_S + 1)
    results = [r for r in await host.results(request.request_id) if isinstance(r, RunResult)]
    assert len(results) == 1, results
    assert not await db.fetchval("SELECT result_due FROM planner.runs WHERE run_id = $1", run_id)
    log = (stack.logs / "planner.log").read_text()
    assert log.count(f"sweeper publishes the result of run acme:{run_id}") == 1


async def test_an_expiry_whose_announcement_was_deleted_is_acted_on_from_the_record(
    stack: Stack,
    host: Host,
    db: asyncpg.Connection,
    model: httpx.Client,
    payments: httpx.Client,
) -> None:
    payment_id = _new_payment(payments)
    refund = {
        "next": {
            "decision": "select_capability",
            "capability": "payment.refund",
            "arguments": json.dumps({"payment_id": payment_id, "line_id": "L2"}),
        }
    }
    model.post(
        "/_control/replies", json={"replies": [{"content": json.dumps(refund)}]}
    ).raise_for_status()
    request = host.request(agent="refund-assistant", text="Refund the discount if approved.")
    await host.publish(request, msg_id=request.request_id)
    waiting = await host.wait_result(request.request_id, status="awaiting_human", timeout=60)
    assert waiting.proposal is not None and waiting.run_id is not None, waiting
    run_id, pending_id = waiting.run_id, waiting.pending_id
    assert pending_id is not None
    # Admission is frozen; the proposal's time runs out (brought forward here, as the clock
    # would), governance denies it as nobody answered, and its announcement is deleted.
    admission = stack.procs["admission"]
    admission.send_signal(signal.SIGSTOP)
    try:
        await db.execute(
            "UPDATE admission.proposals SET expires_at = now() - interval '1 second' "
            "WHERE public_id = $1",
            waiting.proposal.proposal_id,
        )
        await db.execute(
            "UPDATE governance.pending SET deadline = now() WHERE pending_id = $1::uuid",
            pending_id,
        )
        announced = await _last_on(host, subjects.answered("acme"), pending_id.encode())
        assert announced.seq is not None
        await host.js.delete_msg("WRIT_INT", announced.seq)
    finally:
        admission.send_signal(signal.SIGCONT)
    stack.stop_process("admission", kill=True)  # what it had fetched dies with it
    assert await db.fetchval(
        "SELECT state FROM admission.proposals WHERE public_id = $1", waiting.proposal.proposal_id
    ) == ("pending")

    healed = await _restarted(stack, "admission")
    try:
        result = await host.wait_result(request.request_id, status="failed", timeout=BOUND_S)
    except TimeoutError:
        raise AssertionError(
            f"no result within {BOUND_S} s:\n{stack.log_tail('admission', 6000)}"
        ) from None

    assert time.monotonic() - healed < BOUND_S
    assert result.error is not None and result.error.code == "REJECTED", result
    assert "expired unanswered" in result.error.message
    assert await db.fetchval(
        "SELECT state FROM admission.proposals WHERE public_id = $1", waiting.proposal.proposal_id
    ) == ("expired")
    kinds = await db.fetch("SELECT kind FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id)
    assert [k["kind"] for k in kinds] == ["decision", "observation"]  # observed once
    assert _refunds(payments, payment_id) == []
    assert (
        "sweeper acts on the answer to proposal acme:" in (stack.logs / "admission.log").read_text()
    )


async def test_a_host_command_whose_outcome_was_deleted_is_answered_from_the_registry(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    command = host.command()
    admission, dispatcher = stack.procs["admission"], stack.procs["dispatcher"]
    # The dispatcher is frozen until the command is admitted and relayed, then admission is:
    # the command runs, and its outcome is never handled.
    dispatcher.send_signal(signal.SIGSTOP)
    try:
        await host.submit(command)
        with anyio.fail_after(30):
            while (
                operation_id := await db.fetchval(
                    "SELECT operation_id::text FROM admission.commands "
                    "WHERE tenant = 'acme' AND operation_key = $1",
                    command.operation_key,
                )
            ) is None or await db.fetchval(
                "SELECT count(*) FROM admission.outbox WHERE operation_id = $1::uuid",
                operation_id,
            ):
                await anyio.sleep(0.02)
        admission.send_signal(signal.SIGSTOP)
    finally:
        dispatcher.send_signal(signal.SIGCONT)
    try:
        outcome = await _last_on(
            host, subjects.outcome("acme", "host"), operation_id.encode(), b"succeeded"
        )
        assert outcome.seq is not None
        await host.js.delete_msg("WRIT_INT", outcome.seq)
    finally:
        admission.send_signal(signal.SIGCONT)
    stack.stop_process("admission", kill=True)  # what it had fetched dies with it
    assert not [
        r
        for r in await host.results(command.request_id)
        if isinstance(r, CommandResult) and r.status == "succeeded"
    ]

    healed = await _restarted(stack, "admission")
    try:
        result = await host.wait_command(command.request_id, timeout=BOUND_S)
    except TimeoutError:
        raise AssertionError(
            f"no result within {BOUND_S} s:\n{stack.log_tail('admission', 6000)}"
        ) from None

    assert time.monotonic() - healed < BOUND_S
    assert result.status == "succeeded" and result.operation_id == operation_id, result
    attempts = await db.fetchval(
        "SELECT count(*) FROM dispatcher.attempts "
        "WHERE tenant = 'acme' AND operation_id = $1::uuid",
        operation_id,
    )
    assert attempts == 1  # the connector called once
    log = (stack.logs / "admission.log").read_text()
    assert f"sweeper tells the host of command acme:{operation_id}" in log
    # Told once: later sweeps leave it alone.
    await anyio.sleep(2 * STALL_S + 1)
    final = [
        r
        for r in await host.results(command.request_id)
        if isinstance(r, CommandResult) and r.status == "succeeded"
    ]
    assert len(final) == 1, final
    log = (stack.logs / "admission.log").read_text()
    assert log.count(f"sweeper tells the host of command acme:{operation_id}") == 1
