"""The planner against a real model API (fakes/llm.py, an OpenAI-compatible loopback server that
counts its calls), in a deployment of this module's own: a planner killed right after recording
a model decision resumes from it on restart without asking the model again, and proposes once;
a run whose provider-call budget (governance's WRIT_BUDGETS_FILE) runs out during a critic's
replan fails BUDGET_EXHAUSTED naming it, without another model call; a read governance asks a
person about stops the run, whose host is told the pending decision, until an approver allows
it and the run reads and goes on; a branch run (another agent called) proposes a note that
admission admits under the root run's grant and the dispatcher executes, its outcome observed
by the branch and its answer by the caller; a model answer that is no decision fails the run
(`MODEL_FAILED`), never left running; and the tightest of governance's limits, the host's
`RunRequest.budget` and the agent's manifest budgets is the run's budget.
"""

from __future__ import annotations

import json
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fakes.llm import FakeLlm
from libs.faults import CRASH_STATUS
from schemas.governance import RunBudget
from services.governance.spend import ActionPrice, Cap, ModelPrice, PriceTable, sign_prices
from tests.e2e.conftest import Host, proposals_of, replayed
from writ.stack import POLICY_KEY_ID, Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

FRUGAL_CALLS = 2


async def _budget_settled(db: asyncpg.Connection, run_id: str, timeout: float = 20) -> None:
    """Wait until nothing of the run's budget is open: a finished run's lease is settled just
    after its result goes out (`budgeting.py`, `deferring`), not before it."""
    with anyio.fail_after(timeout):
        while await db.fetchval(
            "SELECT count(*) FROM governance.reservations WHERE run_id = $1 AND status = 'open'",
            run_id,
        ) or await db.fetchval(
            "SELECT count(*) FROM planner.reservations WHERE run_id = $1 AND state <> 'closed'",
            run_id,
        ):
            await anyio.sleep(0.05)


def _manifest(name: str, *, critic: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "version": "1.0.0",
        "provider": "openai",
        "critic": critic,
        "responsibility": "Record customer calls as CRM notes on the customer's record.",
        "uses": [{"kind": "action", "name": "crm.note.create"}],
    }


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
    with tempfile.TemporaryDirectory(prefix="writ-resume-") as home:
        root = Path(home)
        agents = root / "agents"
        agents.mkdir()
        lookup = {
            **_manifest("lookup-assistant"),
            "uses": [{"kind": "tool", "name": "crm.customer.get"}],
            "budgets": {"provider_calls": 5, "capability_calls": 3},
        }
        desk = {
            **_manifest("desk-assistant"),
            "uses": [
                {"kind": "agent", "name": "notes-assistant", "description": "Writes CRM notes."}
            ],
        }
        notes = {**_manifest("notes-assistant"), "callable_by": ["desk-assistant"]}
        billing = {
            **_manifest("billing-assistant"),
            "responsibility": "Charge customers for what they asked for.",
            "uses": [{"kind": "action", "name": "payment.charge.create"}],
        }
        for manifest in (
            billing,
            _manifest("crm-assistant"),
            _manifest("frugal-assistant", critic=True),
            lookup,
            desk,
            notes,
        ):
            (agents / f"{manifest['name']}.json").write_text(json.dumps(manifest))
        key = root / "model.key"
        key.write_text(token)
        budgets = root / "budgets.json"
        budgets.write_text(
            json.dumps({"agents": {"frugal-assistant": {"provider_calls": FRUGAL_CALLS}}})
        )
        faults = root / "faults"
        faults.write_text("")
        deployment = Stack(
            root / "stack",
            database="resume",
            durable_pg=False,
            extra_env={
                "*": {"WRIT_FAULTS_FILE": str(faults), "WRIT_DRAIN_TIMEOUT_S": "2"},
                "governance": {"WRIT_BUDGETS_FILE": str(budgets)},
                # Ingress refuses a run for an agent it does not know, at the door.
                "ingress": {"WRIT_AGENTS_DIR": str(agents)},
                "planner": {
                    "WRIT_PROVIDER": "openai",
                    "WRIT_MODEL_URL": f"{fake.url}/v1",
                    "WRIT_MODEL_NAME": "fake-model",
                    "WRIT_MODEL_KEY_FILE": str(key),
                    "WRIT_AGENTS_DIR": str(agents),
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
        yield client


@pytest.fixture
async def db(stack: Stack) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(stack.database_dsn)
    yield conn
    await conn.close()


def script(model: httpx.Client, *contents: dict[str, Any]) -> None:
    model.post(
        "/_control/replies", json={"replies": [{"content": json.dumps(c)} for c in contents]}
    ).raise_for_status()


def arm(faults: Path, point: str) -> None:
    faults.write_text(point)


def armed(faults: Path) -> str:
    return faults.read_text().strip()


def calls(model: httpx.Client) -> int:
    return len(model.get("/_control/requests").json())


async def steps(db: asyncpg.Connection, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    rows = await db.fetch(
        "SELECT kind, payload FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id
    )
    return [(r["kind"], json.loads(r["payload"])) for r in rows]


async def run_id_of(db: asyncpg.Connection, request_id: str, timeout: float = 30) -> str:
    with anyio.fail_after(timeout):
        while (
            run_id := await db.fetchval(
                "SELECT run_id FROM planner.runs WHERE request_id = $1", request_id
            )
        ) is None:
            await anyio.sleep(0.05)
    return str(run_id)


async def _killed(stack: Stack, faults: Path) -> None:
    """Until the armed crash point killed the planner."""
    planner = stack.procs["planner"]
    with anyio.fail_after(30):
        while planner.poll() is None:
            await anyio.sleep(0.05)
    assert planner.returncode == CRASH_STATUS, stack.log_tail("planner")
    assert armed(faults) == "", "the crash point was not taken"


async def _restarted(stack: Stack) -> None:
    stack.stop_process("planner")
    stack.start_instance("planner", "planner")
    await stack.wait_ready(("planner",))


async def test_a_planner_killed_before_publishing_a_proposal_resumes_without_asking_again(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    before = calls(model)
    script(
        model,
        {
            "next": {
                "decision": "select_capability",
                "capability": "crm.note.create",
                "arguments": json.dumps(
                    {"customer_id": "ACME-42", "body": "Called back about order 7781."}
                ),
            }
        },
        {"next": {"decision": "answer_directly", "answer": "Noted the call on ACME-42."}},
    )
    faults = Path(stack.extra_env["*"]["WRIT_FAULTS_FILE"])
    # The decision and the proposal it became are committed in one transaction, and the
    # proposal is published only after it.
    arm(faults, "planner.before_proposal")
    request = host.request(text="Note that I called ACME back about order 7781")
    await host.publish(request, msg_id=request.request_id)

    await _killed(stack, faults)
    run_id = await run_id_of(db, request.request_id)
    # Killed with the decision and its proposal recorded and nothing sent.
    assert [k for k, _ in await steps(db, run_id)] == ["decision"]
    assert (
        await db.fetchval("SELECT count(*) FROM admission.proposals WHERE run_id = $1", run_id) == 0
    )
    assert (
        await db.fetchval(
            "SELECT state FROM planner.reservations WHERE run_id = $1 AND step_key = $2",
            run_id,
            f"{run_id}:0:capability",
        )
        == "open"
    )
    assert calls(model) - before == 1

    await _restarted(stack)
    result = await host.wait_result(request.request_id, timeout=60)

    assert result.status == "succeeded", (result, stack.log_tail("planner"))
    assert result.answer == "Noted the call on ACME-42."
    recorded = await steps(db, run_id)
    assert [k for k, _ in recorded] == ["decision", "observation", "decision"]
    assert calls(model) - before == 2  # once per recorded decision, never again for one
    commands = await db.fetch(
        "SELECT operation_id, state FROM admission.commands WHERE run_id = $1", run_id
    )
    assert [c["state"] for c in commands] == ["succeeded"]  # one command, one operation id
    assert recorded[1][1]["operation_id"] == str(commands[0]["operation_id"])
    await _budget_settled(db, run_id)
    reservations = await db.fetch(
        "SELECT step_key, status FROM governance.reservations "
        "WHERE run_id = $1 ORDER BY reserved_at",
        run_id,
    )
    # The run's three steps drew on one lease, settled once (`budgeting.py`).
    assert [(r["step_key"].removeprefix(f"{run_id}:"), r["status"]) for r in reservations] == [
        ("lease:1", "settled")
    ]
    draws = await db.fetch(
        "SELECT step_key, state FROM planner.reservations "
        "WHERE run_id = $1 AND lease IS NOT NULL ORDER BY step_key",
        run_id,
    )
    assert [(r["step_key"].removeprefix(f"{run_id}:"), r["state"]) for r in draws] == [
        ("0:capability", "closed"),
        ("0:model", "closed"),
        ("2:model", "closed"),
    ]


async def test_a_planner_killed_after_a_read_decision_resumes_without_asking_again(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    before = calls(model)
    script(model, LOOKUP, {"next": {"decision": "answer_directly", "answer": "ACME-42 is active."}})
    faults = Path(stack.extra_env["*"]["WRIT_FAULTS_FILE"])
    # A read is made after the transaction that records its decision: a read that fails, or
    # a planner killed before it, reads again without asking the model again.
    arm(faults, "planner.after_decision")
    request = host.request(agent="lookup-assistant", text="Is ACME-42 still a customer?")
    await host.publish(request, msg_id=request.request_id)

    await _killed(stack, faults)
    run_id = await run_id_of(db, request.request_id)
    assert [k for k, _ in await steps(db, run_id)] == ["decision"]
    assert (
        await db.fetchval("SELECT count(*) FROM governance.decisions WHERE run_id = $1", run_id)
        == 0
    )  # nothing asked about the read yet
    assert calls(model) - before == 1

    await _restarted(stack)
    stopped = await host.wait_result(request.request_id, status="awaiting_human", timeout=60)
    assert stopped.pending_id is not None
    assert (await host.decide(stopped.pending_id, "once")).accepted
    result = await host.wait_result(request.request_id, status="succeeded", timeout=60)

    assert result.answer == "ACME-42 is active."
    recorded = await steps(db, run_id)
    assert [k for k, _ in recorded] == ["decision", "observation", "decision"]
    assert [i["id"] for i in recorded[1][1]["items"]] == ["ACME-42"]
    assert calls(model) - before == 2  # once per recorded decision, never again for one


async def test_a_critic_replan_past_the_budget_fails_the_run_naming_it(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    before = calls(model)
    script(
        model,
        {"next": {"decision": "answer_directly", "answer": "Done."}},
        {"critic": {"verdict": "replan", "reason": "The answer does not say what was recorded."}},
    )
    request = host.request(agent="frugal-assistant")
    await host.publish(request, msg_id=request.request_id)
    result = await host.wait_result(request.request_id, timeout=60)

    assert result.status == "failed", (result, stack.log_tail("planner"))
    assert result.error is not None and result.error.code == "BUDGET_EXHAUSTED"
    assert result.error.message.startswith("provider_calls: ")
    assert calls(model) - before == FRUGAL_CALLS  # the model was not asked to go on
    assert result.run_id is not None
    assert [k for k, _ in await steps(db, result.run_id)] == ["decision", "critic", "observation"]
    # The critic input carried no tool and asked for a verdict under a strict schema.
    critic_request = model.get("/_control/requests").json()[-1]["body"]
    assert "tools" not in critic_request
    assert critic_request["response_format"]["json_schema"]["name"] == "writ_critic_verdict"

    report = await replayed(host, db, result.run_id)
    assert (report.verdict, report.divergences, report.missing) == ("identical", [], [])


LOOKUP = {
    "next": {
        "decision": "select_capability",
        "capability": "tool:crm.customer.get",
        "arguments": json.dumps({"customer_id": "ACME-42"}),
    }
}


async def test_a_read_a_person_must_allow_stops_the_run_until_an_approver_allows_it(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    script(model, LOOKUP, {"next": {"decision": "answer_directly", "answer": "ACME-42 is active."}})
    request = host.request(agent="lookup-assistant", text="Is ACME-42 still a customer?")
    await host.publish(request, msg_id=request.request_id)
    try:
        stopped = await host.wait_result(request.request_id, status="awaiting_human", timeout=60)
    except TimeoutError:
        raise AssertionError(
            (
                await host.results(request.request_id),
                stack.log_tail("planner"),
                stack.log_tail("ingress"),
            )
        ) from None

    assert stopped.error is not None and stopped.error.code == "AWAITING_HUMAN", stopped
    assert stopped.pending_id is not None and stopped.run_id is not None
    assert [k for k, _ in await steps(db, stopped.run_id)] == ["decision"]  # nothing read yet
    pending = await db.fetchrow(
        "SELECT tool, first_argument, run_id FROM governance.pending WHERE pending_id::text = $1",
        stopped.pending_id,
    )
    assert tuple(pending) == ("crm.customer.get", "ACME-42", stopped.run_id)

    taken = await host.decide(stopped.pending_id, "once")
    assert taken.accepted, taken
    result = await host.wait_result(request.request_id, status="succeeded", timeout=60)
    assert result.answer == "ACME-42 is active."
    recorded = await steps(db, stopped.run_id)
    assert [k for k, _ in recorded] == ["decision", "observation", "decision"]
    assert [i["id"] for i in recorded[1][1]["items"]] == ["ACME-42"]
    decided = await db.fetch(
        "SELECT tool, verdict, line FROM governance.decisions "
        "WHERE run_id = $1 ORDER BY decided_at",
        stopped.run_id,
    )
    assert [(d["tool"], d["verdict"]) for d in decided] == [
        ("crm.customer.get", "ask"),
        ("crm.customer.get", "allow"),
        ("crm.customer.get", "allow"),
    ]


async def test_the_tightest_of_governance_the_host_and_the_manifest_is_the_runs_budget(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    before = calls(model)
    script(model, LOOKUP)
    # The host asks fewer capability calls than anyone else and more provider calls than the
    # manifest's 5: it gets its own 0 and the manifest's 5.
    request = host.request(
        agent="lookup-assistant",
        text="Is ACME-42 still a customer?",
        budget=RunBudget(capability_calls=0, provider_calls=40),
    )
    await host.publish(request, msg_id=request.request_id)
    result = await host.wait_result(request.request_id, timeout=60)

    assert result.status == "failed", result
    assert result.error is not None and result.error.code == "BUDGET_EXHAUSTED"
    assert result.error.message.startswith("capability_calls: "), result.error
    assert calls(model) - before == 1  # the model chose the read; nothing was read
    limits = await db.fetchrow(
        "SELECT provider_calls, capability_calls, wall_time_s "
        "FROM governance.budgets WHERE run_id = $1",
        result.run_id,
    )
    assert tuple(limits) == (5, 0, 300)  # manifest, host, manifest (the default 300 s)
    assert (
        await db.fetchval(
            "SELECT count(*) FROM governance.pending WHERE run_id = $1", result.run_id
        )
        == 0
    )


async def test_a_model_answer_that_is_no_decision_fails_the_run_saying_so(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    # Arguments as an object where the strict schema has a JSON string: never guessed at.
    script(
        model,
        {
            "next": {
                "decision": "select_capability",
                "capability": "tool:crm.customer.get",
                "arguments": {"customer_id": "ACME-42"},
            }
        },
    )
    request = host.request(agent="lookup-assistant", text="Is ACME-42 still a customer?")
    await host.publish(request, msg_id=request.request_id)
    result = await host.wait_result(request.request_id, timeout=60)

    assert result.status == "failed", result
    assert result.error is not None and result.error.code == "MODEL_FAILED"
    assert result.error.message.startswith("MalformedDecision: ")
    assert result.run_id is not None
    assert await steps(db, result.run_id) == []  # nothing of it was taken as a decision
    run = await db.fetchrow(
        "SELECT status, error_code FROM planner.runs WHERE run_id = $1", result.run_id
    )
    assert tuple(run) == ("failed", "MODEL_FAILED")
    # The model call is paid for, and nothing else is held.
    await _budget_settled(db, result.run_id)
    reservations = await db.fetch(
        "SELECT step_key, status FROM governance.reservations WHERE run_id = $1", result.run_id
    )
    assert [
        (r["step_key"].removeprefix(f"{result.run_id}:"), r["status"]) for r in reservations
    ] == [("lease:1", "settled")]


async def test_a_branch_proposes_under_the_root_runs_grant_and_observes_the_outcome(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    note = {"customer_id": "ACME-42", "body": "Called back about order 7781."}
    # In call order: the caller picks the other agent; the branch proposes the note, then
    # answers once it observed the outcome; the caller answers with what it observed.
    script(
        model,
        {
            "next": {
                "decision": "select_capability",
                "capability": "agent:notes-assistant",
                "arguments": json.dumps({"request": "Note the call back on ACME-42"}),
            }
        },
        {
            "next": {
                "decision": "select_capability",
                "capability": "action:crm.note.create",
                "arguments": json.dumps(note),
            }
        },
        {"next": {"decision": "answer_directly", "answer": "Noted on ACME-42."}},
        {"next": {"decision": "answer_directly", "answer": "The call back is noted."}},
    )
    request = msgspec.structs.replace(
        host.request(agent="desk-assistant", text="Note today's call back"), grants=["write_delete"]
    )  # the host grants writes for this run: its branches included
    await host.publish(request, msg_id=request.request_id)
    result = await host.wait_result(request.request_id, timeout=60)

    assert result.status == "succeeded", (result, stack.log_tail("planner"))
    assert result.answer == "The call back is noted." and result.run_id is not None
    branch_id = f"{result.run_id}.b0"
    command = await db.fetchrow(
        "SELECT run_id, agent, action, state FROM admission.commands WHERE run_id = $1", branch_id
    )
    assert tuple(command) == (branch_id, "notes-assistant", "crm.note.create", "succeeded")
    decided = await db.fetch(
        "SELECT tool, verdict, line FROM governance.decisions WHERE run_id = $1", branch_id
    )
    assert [(d["tool"], d["verdict"]) for d in decided] == [("crm.note.create", "allow")]
    branch_steps = await steps(db, branch_id)
    assert [k for k, _ in branch_steps] == ["decision", "observation", "decision"]
    assert branch_steps[1][1]["state"] == "succeeded"
    caller = await steps(db, result.run_id)
    assert caller[1][1]["answer"] == "Noted on ACME-42."
    # The branch's capability call is the root run's to pay, and it was paid.
    await _budget_settled(db, result.run_id)
    assert (
        await db.fetchval(
            "SELECT status FROM governance.reservations WHERE run_id = $1 AND step_key = $2",
            result.run_id,
            f"{branch_id}:0:capability",
        )
        == "settled"
    )


# A token costs 0.001 (input and output alike, so the charge is the usage the model reported
# whatever its split); a customer read 0.50 a call. The cap covers the lookup agent only.
PRICED_TOKEN_MICROS = 1_000


def _install_prices(stack: Stack, *, capped: bool) -> None:
    """Sign and install acme's price table (`prices/acme.json`), with or without its cap."""
    key = serialization.load_pem_private_key(
        (stack.secrets / "policy-signing.pem").read_bytes(), password=None
    )
    assert isinstance(key, Ed25519PrivateKey)
    table = PriceTable(
        tenant="acme",
        version="resume-capped" if capped else "resume-uncapped",
        currency="EUR",
        models={"openai/fake-model": ModelPrice(input_per_mtok="1000", output_per_mtok="1000")},
        actions={"crm.customer.get": ActionPrice(per_call="0.50")},
        caps=[Cap(name="lookups-day", window="day", limit="100", agent="lookup-assistant")]
        if capped
        else [],
    )
    folder = stack.policies / "prices"
    folder.mkdir(exist_ok=True)
    tmp = folder / ".acme.json.tmp"
    tmp.write_bytes(sign_prices(table, key, POLICY_KEY_ID))
    tmp.replace(folder / "acme.json")


async def _prices_loaded(stack: Stack, version: str) -> None:
    with anyio.fail_after(30):
        while f"price table {version} loaded for acme" not in stack.log_tail("governance", 20000):
            await anyio.sleep(0.1)


async def _spend_charges(db: asyncpg.Connection, run_id: str) -> list[tuple[str, str, int | None]]:
    """Each reservation of the run held against a cap, in order: a model call or a read, its
    status, and what it was charged (None: not yet)."""
    rows = await db.fetch(
        "SELECT r.tokens, r.status, c.used_micros FROM governance.reservations r "
        "JOIN governance.spend_charges c ON c.reservation_id = r.reservation_id "
        "WHERE r.run_id = $1 ORDER BY r.reserved_at",
        run_id,
    )
    return [("model" if r["tokens"] else "read", r["status"], r["used_micros"]) for r in rows]


async def test_a_planner_killed_between_a_model_call_and_its_settlement_is_charged_once(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    _install_prices(stack, capped=True)
    await _prices_loaded(stack, "resume-capped")
    try:
        first = len(model.get("/_control/requests").json())
        script(
            model, LOOKUP, {"next": {"decision": "answer_directly", "answer": "ACME-42 is active."}}
        )
        faults = Path(stack.extra_env["*"]["WRIT_FAULTS_FILE"])
        # The model's decision is committed with what the call used (due), and its settlement
        # waits for the read's reservation, in the next transaction: killed in between.
        arm(faults, "planner.after_decision")
        request = host.request(agent="lookup-assistant", text="Is ACME-42 still a customer?")
        await host.publish(request, msg_id=request.request_id)
        await _killed(stack, faults)
        run_id = await run_id_of(db, request.request_id)
        # The model call is held against the cap, not settled: governance never heard of it.
        assert await _spend_charges(db, run_id) == [("model", "open", None)]

        await _restarted(stack)
        stopped = await host.wait_result(request.request_id, status="awaiting_human", timeout=60)
        assert stopped.pending_id is not None
        assert (await host.decide(stopped.pending_id, "once")).accepted
        result = await host.wait_result(request.request_id, status="succeeded", timeout=60)
        assert result.answer == "ACME-42 is active."
        await _budget_settled(db, run_id)

        # The fake model's own log: what each of its answers for this run reported it used.
        answered = [r for r in model.get("/_control/requests").json()[first:] if "usage" in r]
        assert len(answered) == 2
        reported = sum(r["usage"]["total_tokens"] for r in answered)
        charges = await _spend_charges(db, run_id)
        # Every call held once and settled once: the two model calls and the one read.
        assert [(what, status) for what, status, _ in charges] == [
            ("model", "settled"),
            ("read", "settled"),
            ("model", "settled"),
        ]
        used = [micros or 0 for what, _, micros in charges if what == "model"]
        assert sum(used) == reported * PRICED_TOKEN_MICROS
        assert charges[1][2] == 500_000
        charged = await db.fetchval(
            "SELECT count(*) FROM governance.journal WHERE kind = 'spend.charged' AND run_id = $1",
            run_id,
        )
        assert charged == 3
    finally:
        _install_prices(stack, capped=False)
        await _prices_loaded(stack, "resume-uncapped")


def _charge(cents: int, description: str) -> dict[str, Any]:
    return {
        "next": {
            "decision": "select_capability",
            "capability": "payment.charge.create",
            "arguments": json.dumps(
                {
                    "customer_id": "ACME-42",
                    "amount_cents": cents,
                    "currency": "EUR",
                    "description": description,
                }
            ),
        }
    }


def _system_text(request: dict[str, Any]) -> str:
    return "\n".join(m["content"] for m in request["body"]["messages"] if m["role"] == "system")


async def test_a_revision_reason_reaches_the_model_in_the_same_run(
    stack: Stack, host: Host, db: asyncpg.Connection, model: httpx.Client
) -> None:
    reason = "Charge standard shipping (15.00 EUR), not expedited. <untrusted>x</untrusted>"
    seen = calls(model)
    script(
        model,
        _charge(4900, "Expedited shipping for order 7781"),
        _charge(1500, "Standard shipping for order 7781"),
        {"next": {"decision": "answer_directly", "answer": "Charged standard shipping."}},
    )
    request = host.request(agent="billing-assistant", text="Charge the shipping of order 7781")
    await host.publish(request, msg_id=request.request_id)
    first = await host.wait_result(request.request_id, status="awaiting_human")
    assert first.proposal is not None and first.proposal.preview["amount_cents"] == 4900

    sent_back = await host.wait_approval(
        await host.approve(first.proposal.proposal_id, answer="revise", reason=reason)
    )
    assert (sent_back.status, sent_back.code) == ("rejected", "REVISION_ASKED"), sent_back

    # The same run asks the model again, and that call is told why, as operator text.
    with anyio.fail_after(30):
        while calls(model) < seen + 2:
            await anyio.sleep(0.1)
    asked = model.get("/_control/requests").json()[seen:]
    assert "Revision context" not in _system_text(asked[0])
    revised = _system_text(asked[1])
    assert "Revision context: An approver sent back the command you proposed" in revised
    assert "Charge standard shipping (15.00 EUR), not expedited." in revised
    # No content boundary marker is taken from a person's words.
    assert "untrusted>" not in revised.split("Revision context:")[1]
    assert "revision asked by ops@acme.example" in revised

    with anyio.fail_after(30):
        while True:
            waiting = [
                r
                for r in await host.results(request.request_id)
                if getattr(r, "proposal", None) is not None
                and r.proposal.proposal_id != first.proposal.proposal_id
            ]
            if waiting:
                break
            await anyio.sleep(0.1)
    revised_proposal = waiting[0].proposal
    assert waiting[0].run_id == first.run_id  # the same run
    assert revised_proposal.preview["amount_cents"] == 1500
    approved = await host.wait_approval(await host.approve(revised_proposal.proposal_id))
    assert approved.status == "claimed", approved
    done = await host.wait_result(request.request_id, status="succeeded", timeout=60)
    assert done.answer == "Charged standard shipping."
    states = await proposals_of(db, stack, first.run_id or "")
    assert [r["preview"]["amount_cents"] for r in states] == [4900, 1500]
    assert states[0]["state"] == "rejected" and states[1]["state"] in ("executing", "completed")
    report = await replayed(host, db, first.run_id or "")
    assert (report.verdict, report.divergences, report.missing) == ("identical", [], [])
