"""Hostile input on every host subject: thousands of generated malformed or hostile
messages, each answered with its error code as data (one naming two request ids is dropped and
counted instead), nothing stored, nothing dead-lettered,
every service alive after — and a real proposal, whose approval with a NUL in its reason used to
kill governance, still approvable afterwards.

The messages come from a seeded generator (`hostile_messages`), so a failure names a message
that can be made again. Each is refused by ingress before anything is stored or forwarded.
"""

from __future__ import annotations

import random
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import asyncpg
import httpx
import jwt
import msgspec
import nats
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from schemas import subjects
from schemas.host import (
    ApprovalResult,
    CommandResult,
    DecisionResult,
    ReviewResult,
    RunResult,
)
from tests.e2e.conftest import Host
from tests.e2e.test_proposals import _payment
from writ.stack import SERVICES, Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SEED = 12
COUNT = 2_400
TENANT = "acme"
KINDS = ("requests", "commands", "decisions", "approvals", "reviews")
TYPES = {
    "requests": "RunRequest",
    "commands": "SubmitCommand",
    "decisions": "HumanDecision",
    "approvals": "ApproveProposal",
    "reviews": "ReviewDecision",
}
# The text fields an outside party fills, per kind (request_id is every kind's too).
TEXT = {
    "requests": ("input", "agent"),
    "commands": (
        "agent",
        "operation_key",
        "action",
        "expected_revision",
        "arguments.body",
        "arguments.customer_id",
        "arguments.<key>",
    ),
    "decisions": ("pending_id", "reason"),
    "approvals": ("proposal_id", "reason"),
    "reviews": ("pending_id", "comment"),
}
RESULT = RunResult | CommandResult | DecisionResult | ApprovalResult | ReviewResult


@dataclass
class Hostile:
    """One generated message: where it goes, its bytes, and the code its answer must carry."""

    kind: str
    request_id: str  # the id its answer comes under
    header_id: str
    body: bytes
    code: str | None  # None: dropped unanswered, and counted
    what: str


class Tokens:
    """The tokens the generator signs, honest and hostile, for the deployment's tenant."""

    def __init__(self, stack: Stack) -> None:
        self.key, self.issuer = stack.host_key(TENANT), stack.issuer(TENANT)
        self.other_key = stack.host_key("globex")
        self.user = stack.token(TENANT, "mallory@acme.example")
        self.approver = stack.token(TENANT, "mallory@acme.example", roles=["approver"])

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(datetime.now(UTC).timestamp())
        claims = {
            "iss": self.issuer,
            "aud": "writ",
            "sub": "mallory@acme.example",
            "tenant": TENANT,
            "iat": now,
            "exp": now + 300,
            "jti": secrets.token_hex(8),
            "roles": ["approver"],
            **overrides,
        }
        return {k: v for k, v in claims.items() if v is not None}

    def signed(self, key: bytes | None = None, **overrides: Any) -> str:
        return jwt.encode(self.claims(**overrides), key or self.key, algorithm="EdDSA")


def _valid(kind: str, request_id: str, tokens: Tokens) -> dict[str, Any]:
    body: dict[str, Any] = {"type": TYPES[kind], "request_id": request_id}
    if kind == "requests":
        body |= {"token": tokens.user, "agent": "crm-assistant", "input": "Note the call."}
    elif kind == "commands":
        body |= {
            "token": tokens.user,
            "agent": "crm-assistant",
            "operation_key": f"hostile-{request_id}",
            "action": "crm.note.create",
            "arguments": {"customer_id": "ACME-42", "body": "Called back."},
        }
    elif kind == "decisions":
        body |= {"token": tokens.approver, "pending_id": str(uuid.uuid4()), "answer": "once"}
    elif kind == "approvals":
        body |= {
            "token": tokens.approver,
            "proposal_id": f"prop_{uuid.uuid4().hex}",
            "answer": "approve",
        }
    else:
        body |= {
            "token": tokens.approver,
            "pending_id": f"review-{uuid.uuid4()}-1",
            "answer": "approve",
        }
    return body


def _set(body: dict[str, Any], field: str, value: Any) -> None:
    if field == "arguments.<key>":
        body["arguments"][value] = "x"
    elif field.startswith("arguments."):
        body["arguments"][field.split(".", 1)[1]] = value
    else:
        body[field] = value


def _unstorable(rng: random.Random) -> str:
    return rng.choice(["ok\u0000", "\u0000", "a\u0000b" * 3, "\u0000" * 40])


Mutation = Callable[[random.Random, str, dict[str, Any], Tokens], tuple[Any, str | None, str]]


def m_nul(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str, str]:
    field = rng.choice(TEXT[kind])
    _set(body, field, _unstorable(rng))
    return body, "INVALID_REQUEST", f"U+0000 in {field}"


def m_nul_request_id(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str, str]:
    body["request_id"] += "\u0000"  # the header's id is what the answer comes under
    return body, "INVALID_REQUEST", "U+0000 in request_id"


def m_surrogate(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str, str]:
    field = rng.choice(TEXT[kind])
    marker = "SURROGATE-MARK"
    _set(body, field, marker)
    raw = msgspec.json.encode(body).replace(
        marker.encode(), rng.choice([b"\\ud800", b"x\\udfff", b"\xed\xa0\x80", b"\xff"])
    )
    return raw, "INVALID_REQUEST", f"lone surrogate or invalid UTF-8 in {field}"


def m_deep(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str, str]:
    field = rng.choice(TEXT[kind])
    depth = rng.choice([40, 2_000, 20_000])
    _set(body, field, "DEEP-MARK")
    raw = msgspec.json.encode(body).replace(b'"DEEP-MARK"', b"[" * depth + b"]" * depth)
    return raw, "INVALID_REQUEST", f"{field} nested {depth} deep"


def m_no_type(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str, str]:
    del body["type"]
    return body, "INVALID_REQUEST", "no type"


def m_wrong_type(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str, str]:
    body["type"] = rng.choice([t for k, t in TYPES.items() if k != kind] + ["Nope", "", 7])
    return body, "INVALID_REQUEST", f"type {body['type']!r}"


def m_unknown_field(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str, str]:
    body[rng.choice(["tenant", "principal", "admin", "__proto__", "run_id"])] = "globex"
    return body, "INVALID_REQUEST", "unknown field"


def m_wrong_shape(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str, str]:
    field = rng.choice([f for f in TEXT[kind] if not f.startswith("arguments.")] or ["token"])
    optional = field == "expected_revision"
    body[field] = rng.choice([1, 1.5, True, [], {"$gt": ""}, ["a"]] + [None] * (not optional))
    if kind == "commands" and rng.random() < 0.3:
        body["arguments"] = rng.choice([[], "x", 3, None])
    return body, "INVALID_REQUEST", f"{field} of the wrong type"


def m_too_long(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str, str]:
    # The fields ingress bounds itself (an action's arguments are bounded by its contract,
    # in admission).
    field = rng.choice([f for f in TEXT[kind] if not f.startswith("arguments.")])
    _set(body, field, "x" * (20_000 if field == "input" else 600))
    return body, "INVALID_REQUEST", f"{field} too long"


def m_too_large(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str, str]:
    body["padding"] = "p" * (70 * 1024)
    return body, "TOO_LARGE", "over 64 KiB"


def m_not_json(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str, str]:
    raw = rng.choice(
        [
            b"",
            b"null",
            b"[]",
            b"{",
            b"\x00\x00",
            b"<xml/>",
            rng.randbytes(40),
            msgspec.json.encode(body)[:-3],
            b'{"type": "RunRequest"}',
        ]
    )
    return raw, "INVALID_REQUEST", "not a message"


def m_token(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str, str]:
    now = int(datetime.now(UTC).timestamp())
    token, code, what = rng.choice(
        [
            (tokens.signed(exp=str(now + 300)), "INVALID_TOKEN", "exp a numeric string"),
            (tokens.signed(iat=str(now)), "INVALID_TOKEN", "iat a numeric string"),
            (tokens.signed(nbf=str(now)), "INVALID_TOKEN", "nbf a numeric string"),
            (tokens.signed(exp=now + 86_400), "INVALID_TOKEN", "a token for a day"),
            (tokens.signed(iat=now - 7_000, exp=now + 100), "INVALID_TOKEN", "lived two hours"),
            (tokens.signed(exp=now - 600, iat=now - 900), "TOKEN_EXPIRED", "expired"),
            (tokens.signed(nbf=now + 600), "INVALID_TOKEN", "not valid yet"),
            (tokens.signed(key=tokens.other_key), "BAD_SIGNATURE", "globex's key"),
            (tokens.signed(tenant="globex"), "WRONG_TENANT", "another tenant's claim"),
            (tokens.signed(aud="someone-else"), "INVALID_TOKEN", "wrong audience"),
            (tokens.signed(sub="alice smith"), "INVALID_TOKEN", "sub not a principal"),
            (tokens.signed(roles="approver"), "INVALID_TOKEN", "roles not a list"),
            ("not-a-jwt", "INVALID_TOKEN", "garbage"),
            (_alg_none(tokens.claims()), "INVALID_TOKEN", "alg none"),
        ]
    )
    body["token"] = token
    return body, code, f"token: {what}"


def m_no_role(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str | None, str]:
    if kind == "requests" or kind == "commands":  # not an approver kind: a wrong header
        return m_header(rng, kind, body, tokens)
    body["token"] = tokens.user
    return body, "FORBIDDEN", "an approver's answer without the role"


def m_header(
    rng: random.Random, kind: str, body: dict[str, Any], tokens: Tokens
) -> tuple[Any, str | None, str]:
    # Two request ids: an answer under either could contradict that id's result.
    return body, None, "Nats-Msg-Id other than request_id"


def _alg_none(claims: dict[str, Any]) -> str:
    import base64
    import json

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    return (
        f"{b64(json.dumps({'alg': 'none', 'typ': 'JWT'}).encode())}."
        f"{b64(json.dumps(claims).encode())}."
    )


MUTATIONS: list[tuple[Mutation, int]] = [
    (m_nul, 6),
    (m_nul_request_id, 1),
    (m_surrogate, 2),
    (m_deep, 1),
    (m_no_type, 2),
    (m_wrong_type, 2),
    (m_unknown_field, 2),
    (m_wrong_shape, 2),
    (m_too_long, 2),
    (m_too_large, 1),
    (m_not_json, 2),
    (m_token, 4),
    (m_no_role, 2),
    (m_header, 1),
]


def hostile_messages(tokens: Tokens, count: int = COUNT, seed: int = SEED) -> Iterator[Hostile]:
    """`count` hostile messages, spread over every host subject, from a seeded generator."""
    rng = random.Random(seed)
    mutations, weights = zip(*MUTATIONS, strict=True)
    for index in range(count):
        kind = KINDS[index % len(KINDS)]
        request_id = f"hostile-{seed}-{index}-{uuid.uuid4().hex[:6]}"
        mutate = rng.choices(mutations, weights)[0]
        body, code, what = mutate(rng, kind, _valid(kind, request_id, tokens), tokens)
        header_id = request_id
        if mutate is m_header or (mutate is m_no_role and kind in ("requests", "commands")):
            header_id = f"{request_id}-other"
        raw = body if isinstance(body, bytes) else msgspec.json.encode(body)
        yield Hostile(
            kind=kind,
            request_id=request_id,
            header_id=header_id,
            body=raw,
            code=code,
            what=f"{mutate.__name__}: {what}",
        )


AMBIGUOUS = 'writ_ingress_dropped_total{reason="ambiguous_id"}'


def metric(stack: Stack, service: str, sample: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{stack.metrics_port(service)}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(sample)
    )


def code_of(result: Any) -> str | None:
    if isinstance(result, (RunResult, CommandResult)):
        return result.error.code if result.error else None
    return result.code


async def _counts(db: asyncpg.Connection) -> dict[str, int]:
    tables = (
        "planner.runs",
        "planner.steps",
        "admission.proposals",
        "admission.commands",
        "admission.outbox",
        "governance.pending",
        "governance.decisions",
        "governance.runs",
    )
    return {t: await db.fetchval(f"SELECT count(*) FROM {t}") for t in tables}  # noqa: S608


async def _alive(stack: Stack) -> set[str]:
    """The services answering `$SRV.PING` (the documented health check)."""
    nc = await nats.connect(stack.nats_url)
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish("$SRV.PING", b"", reply=inbox)
        seen: set[str] = set()
        with anyio.move_on_after(1.0):
            while True:
                msg = await sub.next_msg(timeout=1.0)
                if msg.data:
                    seen.add(msgspec.json.decode(msg.data)["name"])
        return seen
    finally:
        await nc.close()


async def test_thousands_of_hostile_messages_each_get_their_error_and_change_nothing(
    stack: Stack, host: Host, db: asyncpg.Connection, payments: httpx.Client
) -> None:
    # A real proposal, waiting for a person: defect 1 approved it with "ok\u0000".
    payment_id = f"pay_{uuid.uuid4().hex[:12]}"
    payments.post("/_control/payments", json=_payment(payment_id)).raise_for_status()
    refund = host.command(
        action="payment.refund",
        agent="refund-assistant",
        arguments={"payment_id": payment_id, "line_id": "L2"},
    )
    await host.submit(refund)
    waiting = await host.wait_command(refund.request_id)
    assert waiting.status == "awaiting_human" and waiting.proposal is not None, waiting
    proposal_id = waiting.proposal.proposal_id

    tokens = Tokens(stack)
    messages = list(hostile_messages(tokens))
    poisoned = f"nul-approval-{uuid.uuid4().hex[:8]}"
    messages.append(
        Hostile(
            kind="approvals",
            request_id=poisoned,
            header_id=poisoned,
            code="INVALID_REQUEST",
            what="defect 1: a real proposal approved with a NUL in its reason",
            body=msgspec.json.encode(
                {
                    "type": "ApproveProposal",
                    "request_id": poisoned,
                    "token": tokens.approver,
                    "proposal_id": proposal_id,
                    "answer": "approve",
                    "reason": "ok\u0000",
                }
            ),
        )
    )
    assert len({m.request_id for m in messages}) == len(messages)

    before = await _counts(db)
    dlq_before = (await host.js.stream_info("WRIT_DLQ")).state.messages
    results_from = (await host.js.stream_info(subjects.out_stream(TENANT))).state.last_seq + 1
    ambiguous_before = metric(stack, "ingress", AMBIGUOUS)

    tenant_js = await host.tenant_js(TENANT)  # as the tenant's host, with its permissions
    for message in messages:
        await tenant_js.publish(
            f"writ.in.{message.kind}.{TENANT}",
            message.body,
            headers={"Nats-Msg-Id": message.header_id},
        )

    wanted = {m.request_id: m for m in messages if m.code is not None}
    dropped = {m.request_id for m in messages if m.code is None}
    answers: dict[str, Any] = {}
    sub = await host.js.subscribe(
        subjects.result(TENANT),
        ordered_consumer=True,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=results_from
        ),
    )
    try:
        with anyio.fail_after(240):
            while len(answers) < len(wanted):
                msg = await sub.next_msg(timeout=60)
                result = msgspec.json.decode(msg.data, type=RESULT)
                assert result.request_id not in dropped, ("answered, not dropped", result)
                if result.request_id in wanted:
                    assert result.request_id not in answers, ("answered twice", result)
                    answers[result.request_id] = result
    finally:
        await sub.unsubscribe()

    # Every message with two request ids was taken, and dropped and counted, not answered.
    with anyio.fail_after(60):
        while metric(stack, "ingress", AMBIGUOUS) - ambiguous_before < len(dropped):
            await anyio.sleep(0.2)
    assert metric(stack, "ingress", AMBIGUOUS) - ambiguous_before == len(dropped)
    wrong = [
        (m.what, m.code, code_of(answers[m.request_id]), answers[m.request_id])
        for m in messages
        if m.code is not None and code_of(answers[m.request_id]) != m.code
    ]
    assert not wrong, f"{len(wrong)} answered with another code, e.g. {wrong[:5]}"
    assert all(
        isinstance(
            answers[m.request_id],
            {
                "requests": RunResult,
                "commands": CommandResult,
                "decisions": DecisionResult,
                "approvals": ApprovalResult,
                "reviews": ReviewResult,
            }[m.kind],
        )
        for m in messages
        if m.code is not None
    )
    # Nothing stored, nothing forwarded, nothing dead-lettered, every service alive.
    assert await _counts(db) == before
    assert (await host.js.stream_info("WRIT_DLQ")).state.messages == dlq_before
    assert await _alive(stack) >= {f"writ-{name}" for name in SERVICES}
    assert all(stack.procs[name].poll() is None for name in SERVICES)

    # The approval defect 1 lost: approving it properly still works, once.
    approved = await host.wait_approval(await host.approve(proposal_id))
    assert approved.status == "claimed", approved
    with anyio.fail_after(60):
        while not [
            r
            for r in await host.results(refund.request_id)
            if isinstance(r, CommandResult) and r.status == "succeeded"
        ]:
            await anyio.sleep(0.2)


async def test_a_request_id_sent_again_under_another_msg_id_keeps_its_one_result(
    stack: Stack, host: Host
) -> None:
    """A host re-sends a request that succeeded, and a command, under other `Nats-Msg-Id`s:
    JetStream cannot see them as duplicates, and ingress answers neither under either id
    (each id's results stay what they were: one `succeeded` for the run)."""
    request = host.request()
    await host.publish(request, msg_id=request.request_id)
    assert (await host.wait_result(request.request_id)).status == "succeeded"
    command = host.command()
    await host.submit(command)
    assert (await host.wait_command(command.request_id)).status == "succeeded"
    run_results = await host.results(request.request_id)
    command_results = await host.results(command.request_id)
    assert [r.status for r in run_results] == ["succeeded"]

    before = metric(stack, "ingress", AMBIGUOUS)
    js = await host.tenant_js(TENANT)
    await js.publish(
        subjects.request(TENANT),
        msgspec.json.encode(request),
        headers={"Nats-Msg-Id": f"{request.request_id}-again"},
    )
    await js.publish(
        subjects.command_request(TENANT),
        msgspec.json.encode(command),
        headers={"Nats-Msg-Id": f"{command.request_id}-again"},
    )
    with anyio.fail_after(60):
        while metric(stack, "ingress", AMBIGUOUS) - before < 2:
            await anyio.sleep(0.2)
    assert await host.results(request.request_id) == run_results
    assert await host.results(command.request_id) == command_results
    for other in (f"{request.request_id}-again", f"{command.request_id}-again"):
        assert await host.results(other) == []
