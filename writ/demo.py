"""`writ run`: start Writ locally, submit the demo request, and print its timeline.

The scenario is the reference architecture's: an agent adds a note to a customer record. The demo
plays the host with the SDK (`writ_client`: it signs a token with the tenant's key and starts the
run over the HTTP API, `POST /api/v1/runs`, then waits for its `RunResult`) and watches the bus. The
demo agent (`research-assistant`) asks for its catalog, reads the tenant's documents through
retrieval (`documents.search`, decided by governance; what it returns is untrusted data), proposes
the note, observes its outcome, and its answer is verified by a critic before the run ends.
The planner's own steps are printed from what it announces on `writ.events.planner.<tenant>`.
Then a short chat in plan mode (`chat-assistant`): the agent proposes a plan, the user approves
it by its id, the planned note is decided, admitted and dispatched, and Writ writes its outcome
into the session.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import msgspec
import nats

from libs import lifetime
from libs.journal import load_verify_keys, verify
from schemas import subjects
from schemas.host import RunResult
from services.ingress.logic import SIGN_IN_WINDOW_S
from writ.stack import SERVICES, Stack
from writ.supervisor import Supervisor
from writ_client import Client, Issuer
from writ_client.types import PlanProposed, TextDelta, TurnEnded

__all__ = ["run_demo"]

DEMO_AGENT = "research-assistant"
CHAT_AGENT = "chat-assistant"
CHAT_INPUT = "Please note that Acme wants the shipment update of order 7781 by Friday."
DEMO_INPUT = (
    "Look up what our documents say about ACME-42's delayed shipment and add a note to "
    "the customer's record summarising today's call."
)


def _line(started: float, what: str, detail: str) -> None:
    print(f"  {time.monotonic() - started:7.3f}s  {what:<18} {detail}", flush=True)


def _describe(subject: str, data: bytes) -> tuple[str, str] | None:
    try:
        body: dict[str, Any] = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    kind = body.get("type")
    if subject.startswith(subjects.request.prefix):
        return "request", f"{body.get('request_id')} from the host on {subject}"
    if kind == "SearchEvidence":
        return "verified", (
            f"tenant={body['tenant']} run={body['run_id']}: the host's token "
            f"verified, the run registered, its evidence asked of retrieval"
        )
    if kind == "EvidenceGathered":
        titles = ", ".join(e["title"] for e in body["evidence"]) or "none"
        return "evidence", (
            f"principal={body['principal']}: {len(body['evidence'])} documents, "
            f"all untrusted: {titles}"
        )
    if kind == "StepRecorded":
        return _step(body)
    if kind == "ReadCapability":
        return "read", (
            f"retrieval reads {body['tool']} "
            f"{msgspec.json.encode(body['arguments']).decode()[:70]} "
            f"(governance decides first) on {subject}"
        )
    if kind == "ProposeCommand":
        return "proposal", (
            f"to admission: {body['action']} {msgspec.json.encode(body['arguments']).decode()[:80]}"
        )
    if kind == "CommandAdmitted":
        return "admitted", (
            f"operation {body['operation_id']} allowed by decide line "
            f"{body['decision_line']} (policy {body['policy_version']}), "
            f"hash {body['request_hash'][:12]}…"
        )
    if kind == "ProposalRefused":
        return "refused", f"{body['verdict']}: {body['reason']}"
    if kind == "DispatchCommand":
        return "relayed", f"outbox -> {subject} (Nats-Msg-Id {body['tenant']}:…)"
    if kind == "CommandOutcome":
        return "dispatched", (
            f"{body['state']} receipt={body.get('receipt')} "
            f"(Idempotency-Key {body['tenant']}:{body['operation_id']})"
        )
    if kind == "RunResult":
        error = body.get("error") or {}
        return "result", (
            f"{body['status']} {body.get('answer') or ''}"
            f"{error.get('code', '')} {error.get('message', '')}"
        ).strip()
    return None


def _step(body: dict[str, Any]) -> tuple[str, str] | None:
    """A planner step, as the planner announced it once it was committed."""
    if body["kind"] == "critic":
        return "critic", f"verdict {body.get('verdict')} on the answer"
    if body["kind"] == "observation":
        return "observation", body.get("summary") or "recorded"
    decision = body.get("decision")
    if decision == "request_capabilities":
        return "capabilities", "model asks for the catalog (request_capabilities)"
    if decision == "select_capability":
        return "select", f"model selects {body.get('target')} (checked: in uses, signature)"
    if decision == "answer_directly":
        return "answer", "model answers (answer_directly)"
    if decision == "request_human_review":
        return "review", "model asks for a person's review"
    return None


def _model_line(environ: Mapping[str, str]) -> str:
    """Where the demo agents' decisions come from (their manifests say `provider: default`)."""
    if environ.get("WRIT_PROVIDER", "scripted") == "openai":
        return (
            f"The planner asks the model {environ.get('WRIT_MODEL_NAME', '?')} at "
            f"{environ.get('WRIT_MODEL_URL', '?')}: what follows is what that model decided, "
            "checked by Writ as any model's decisions are."
        )
    return (
        "The planner's decisions are scripted (writ/demo/decisions.json), so the demo runs "
        "offline; WRIT_PROVIDER=openai points it at a model (docs/configuration.md)."
    )


async def _demo(stack: Stack, started: float) -> int:
    print(f"Writ is up: NATS {stack.public_nats_url}, simulated CRM {stack.crm_url}")
    print(_model_line(os.environ))
    nc = await nats.connect(stack.nats_url)
    done = anyio.Event()
    status: list[str] = []

    async def watch(msg: Any) -> None:
        described = _describe(msg.subject, msg.data)
        if described is None:
            return
        _line(started, *described)
        if described[0] == "result":
            status.append(msgspec.json.decode(msg.data, type=RunResult).status)
            done.set()

    sub = await nc.subscribe("writ.>", cb=watch)
    watching, chat_ok = True, False
    issuer = Issuer.from_file(
        stack.secrets / "host-acme.pem", tenant="acme", issuer=stack.issuer("acme")
    )
    try:
        async with Client(stack.api_url, issuer, "alice@acme.example") as host:
            request_id = f"demo-{uuid.uuid4().hex[:8]}"
            print(f"\nTimeline of request {request_id}:")
            _line(
                started,
                "request",
                f"{request_id} from the host: POST {stack.api_url}/runs "
                "(writ_client, Idempotency-Key = the request id)",
            )
            accepted = await host.start_run(DEMO_AGENT, DEMO_INPUT, request_id=request_id)
            result = await host.wait(accepted.run_id, timeout_s=60)
            with anyio.fail_after(10):
                await done.wait()
            await anyio.sleep(0.2)
            await sub.unsubscribe()  # the chat's turn prints its own timeline
            watching = False
            chat_ok = await _chat(host, started)
    finally:
        if watching:
            await sub.unsubscribe()
        await nc.close()
    status = [result.status] if status == [result.status] else status
    journals_ok = await _verify_journals(stack)
    return 0 if status == ["succeeded"] and chat_ok and journals_ok else 1


async def _chat(host: Client, started: float) -> bool:
    """A short scripted chat in plan mode: the agent proposes a plan, the user approves it by
    its id, the step runs (still decided by governance) and Writ writes its outcome in."""
    print("\nA chat session (plan mode):")
    session = await host.open_session(CHAT_AGENT, plan_mode=True)
    _line(started, "chat", f"session {session.session_id} with {CHAT_AGENT}: POST /api/v1/sessions")
    ended: TurnEnded | None = None
    approved = False
    with anyio.fail_after(60):
        async for event in session.turn(CHAT_INPUT):
            if isinstance(event, TextDelta):
                continue  # the text is shown whole with the turn's end
            _line(started, "chat", _chat_line(event))
            if isinstance(event, PlanProposed) and not approved:
                approved = True
                await session.approve_plan(event.plan.plan_id)
                _line(
                    started,
                    "chat",
                    f"the user approves plan {event.plan.plan_id} by its "
                    "id: POST /api/v1/plans/{id}/approve",
                )
            if isinstance(event, TurnEnded):
                ended = event
    return ended is not None and ended.status == "succeeded" and approved


def _chat_line(event: Any) -> str:
    kind = type(event).__name__
    if isinstance(event, PlanProposed):
        steps = ", ".join(s.capability for s in event.plan.steps)
        return f"#{event.n} plan proposed: {steps} (sha256 {event.plan.digest[:12]}…)"
    if isinstance(event, TurnEnded):
        return f"#{event.n} turn {event.turn} {event.status}: {event.answer}"
    detail = next(
        (
            str(getattr(event, f))
            for f in ("text", "capability", "summary", "answer", "run_id")
            if getattr(event, f, None)
        ),
        "",
    )
    return f"#{event.n} {kind} {detail}"[:160]


async def _verify_journals(stack: Stack) -> bool:
    """What `writ audit verify` says once the run's entries are sealed: every service's chain,
    checkpoint and signature, with the public keys only."""
    keys = load_verify_keys((stack.config / "journal-keys.json").read_text())
    conn = await asyncpg.connect(stack.database_dsn)
    try:
        services = [
            r["table_schema"]
            for r in await conn.fetch(
                "SELECT table_schema FROM information_schema.tables WHERE table_name = 'journal' "
                "ORDER BY table_schema"
            )
        ]
        unsealed = " + ".join(
            f"(SELECT count(*) FROM {s}.journal j WHERE NOT EXISTS (SELECT 1 FROM "
            f"{s}.journal_seals x WHERE x.entry_id = j.id))"
            for s in services
        )
        for _ in range(50):  # each sealer seals within a poll or two
            if not services or not await conn.fetchval(f"SELECT {unsealed}"):
                break
            await anyio.sleep(0.2)
        print("\nAudit journal (what `writ audit verify` checks):")
        ok = True
        for service in services:
            report = await verify(conn, service=service, keys=keys)
            ok = ok and report.ok
            verdict = "intact" if report.ok else f"FAILED at {report.problems[0]}"
            print(
                f"  {service:<11} {verdict} ({report.entries} entries, "
                f"{report.checkpoints} signed checkpoints)"
            )
        return ok
    finally:
        await conn.close()


# How long Ctrl-C waits for the processes to drain before it kills them.
_STOP_TIMEOUT_S = 5.0


def run_demo(home: Path, *, serve: bool) -> int:
    """Start everything, run the demo, then keep serving until Ctrl-C if `serve`."""
    stack = Stack(
        home,
        nats_url=os.environ.get("WRIT_NATS_URL") or None,
        admin_dsn=os.environ.get("WRIT_DATABASE_URL") or None,
        http_port=int(os.environ.get("WRIT_HTTP_PORT") or 0),
    )
    stack.inherit(os.environ)  # OTEL_* and WRIT_* settings reach the services
    supervisor: Supervisor | None = None
    # However `writ run` ends, its children end with it (SIGKILL included), and Ctrl-C (or a
    # SIGTERM) at any moment, start-up and demo included, stops everything within seconds.
    lifetime.tie_children()
    stopping = threading.Event()
    exit_code = [130]  # interrupted; once serving, the demo's own outcome

    def stop_now(signum: int, frame: object) -> None:
        if stopping.is_set():  # a second Ctrl-C: leave at once, the children die with us
            os._exit(128 + signum)
        stopping.set()

        def stop_all() -> None:
            try:
                print("\nStopping…", flush=True)
                if supervisor is not None:
                    supervisor.stop()
                stack.stop(timeout=_STOP_TIMEOUT_S)
            finally:
                os._exit(exit_code[0] if signum == signal.SIGINT else 128 + signum)

        threading.Thread(target=stop_all, name="writ-stop", daemon=True).start()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop_now)
    try:
        print(
            "Starting NATS, PostgreSQL, the simulated CRM, payment provider and helpdesk, and "
            "ingress, retrieval, planner, governance, admission, dispatcher…",
            flush=True,
        )
        stack.start_all()
        started = time.monotonic()
        # A service that dies shows in the timeline at once, and comes back with backoff.
        supervisor = Supervisor(stack, report=lambda what, detail: _line(started, what, detail))
        supervisor.start()
        code = anyio.run(_demo, stack, started)
        if code == 0:  # scenario C: the host federates (writ/demo_federation.py)
            from writ.demo_federation import scenario_c

            code = 0 if anyio.run(scenario_c, stack, started, _describe) else 1
        if serve:
            print("\nPrometheus can scrape:")
            for name in SERVICES:
                print(f"  {name:<11} http://127.0.0.1:{stack.metrics_port(name)}/metrics")
            print(
                f"\nServing. Each tenant's host finds what it is given in "
                f"{stack.home / 'hosts'}/<tenant>/ (nats.url with its own NATS user, "
                "nats.inbox, api.url, issuer, signing.pem): it publishes on "
                f"{subjects.request('<tenant>')} at {stack.public_nats_url}, or calls the HTTP "
                f"API:\n  base URL  {stack.api_url}\n  OpenAPI   {stack.api_url}/openapi.json\n"
                f"Approvers sign in to the console with this link (the demo approver): it "
                f"works once, and only within the next {SIGN_IN_WINDOW_S / 60:.0f} minutes; "
                f"the session lasts an hour. `writ console` prints a new one:\n"
                f"  {stack.console_link()}\n"
                f"Operators run `writ pending`; logs in {stack.logs}. A service that dies is "
                "reported here and restarted. Ctrl-C stops everything.",
                flush=True,
            )
            exit_code[0] = code
            while True:  # until Ctrl-C or SIGTERM: `stop_now` stops everything and exits
                time.sleep(3600)
        return code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        print(f"writ run failed: {exc!r}", file=sys.stderr)
        for name in stack.procs:
            tail = stack.log_tail(name, 1500)
            if tail:
                print(f"--- {name} ---\n{tail}", file=sys.stderr)
        return 1
    finally:
        if stopping.is_set():  # `stop_now` is stopping everything, then ends the process
            threading.Event().wait()
        if supervisor is not None:
            supervisor.stop()
        stack.stop()
