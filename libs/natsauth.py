"""Who may use which subject: NATS users and permissions, generated per deployment.

NATS enforces them, not Writ: one account, one user per service and per tenant's host, each
allowed exactly the subjects it publishes and consumes, and an `admin` user (no limits) for
Writ's own operator tooling and the tests' inspection. Users and permissions in one account
rather than an account per tenant: Writ's streams are shared by the services, and JetStream
across accounts would need an export and an import per stream and per API subject, all of
which would be permissions again, with more to get wrong.

- A service publishes only where it produces, subscribes only to its endpoints, and reaches
  JetStream's API only for Writ's streams and its own durable consumer. Its request/reply
  answers go out with `allow_responses` (to a reply subject it was sent, once).
- A tenant's host publishes only `writ.in.<kind>.<tenant>`, reads only its own result stream
  (`WRIT_OUT_<tenant>`) and `writ.events.planner.<tenant>`, and nothing under `writ.int.>`,
  `writ.cmd.>` or another tenant's subjects.
- The evaluation's shadow runs (`writ eval shadow`, user `eval`) read a copy of the runs that
  start (its own durable consumer `eval` on WRIT_INT, for the evidence each run is handed to
  the planner with) and publish only under `writ.eval.>`: nothing under `writ.int.>`,
  `writ.cmd.>` or `writ.in.>`, and no request to governance, admission or the dispatcher, so no
  proposal of a shadow run can be admitted or dispatched.
- Every user's replies arrive under its own inbox prefix (`_INBOX.<user>`): nobody can
  subscribe to `_INBOX.>` and read the answers meant for someone else.

Passwords are generated per deployment and kept as secret files; the server's configuration
holds them and is written with the same care (mode 0600).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from schemas import reads, subjects
from schemas.host_reads import host_read
from schemas.planner import REVIEW
from schemas.sessions import CHAT_STREAM, SESSION_OPS, TURN_CANCELLING

__all__ = [
    "ADMIN",
    "EVAL",
    "EVAL_SUBJECTS",
    "JOURNALED",
    "SERVICE_SUBJECTS",
    "auth_config",
    "ensure_passwords",
    "host_user",
    "inbox_prefix",
    "permissions",
    "users",
]

ADMIN: Final = "admin"
EVAL: Final = "eval"
# Where the shadow evaluation publishes its would-be asks, proposals and reports.
EVAL_SUBJECTS: Final = "writ.eval.>"
_JS: Final = "$JS.API"
_STATIC_STREAMS: Final = tuple(spec.name for spec in subjects.STREAMS)

# service -> (its durable consumer's stream, None for per-tenant streams or "" for none, what
# it publishes, the request/reply endpoints it serves). Request/reply calls are publishes too.
SERVICE_SUBJECTS: Final[dict[str, tuple[str | None, tuple[str, ...], tuple[str, ...]]]] = {
    "ingress": (
        None,
        (
            # A run starts registered with governance, its evidence asked of retrieval, and
            # handed to the planner with both (libs/runstart.py).
            "writ.out.results.*",
            "writ.int.evidence.*",
            subjects.REGISTER_RUN,
            subjects.SEARCH,
            "writ.int.approvals.*",
            "writ.int.proposals.*",
            "writ.int.answers.*",
            REVIEW,
            # The HTTP door: cancellations, the reads other services answer, and the
            # Idempotency-Key bucket (its KV stream).
            "writ.int.runs.cancel.*",
            reads.RUN_STATUS,
            reads.RUN_EVENTS,
            reads.COMMAND_STATUS,
            reads.REVIEWS_LIST,
            reads.PROPOSALS_LIST,
            reads.PROPOSAL_GET,
            subjects.PENDING_LIST,
            subjects.REPLAY,
            subjects.UNKNOWN_LIST,
            subjects.RECONCILE,
            *(reads.journal_verify(s) for s in reads.JOURNALED),
            "$KV.WRIT_IDEMPOTENCY.>",
            "$JS.API.STREAM.INFO.KV_WRIT_IDEMPOTENCY",
            "$JS.API.STREAM.CREATE.KV_WRIT_IDEMPOTENCY",
            "$JS.API.STREAM.MSG.GET.KV_WRIT_IDEMPOTENCY",
            "$JS.API.DIRECT.GET.KV_WRIT_IDEMPOTENCY",
            "$JS.API.DIRECT.GET.KV_WRIT_IDEMPOTENCY.>",
            # The approval console's sessions and used sign-in links (its KV stream).
            "$KV.WRIT_CONSOLE.>",
            "$JS.API.STREAM.INFO.KV_WRIT_CONSOLE",
            "$JS.API.STREAM.CREATE.KV_WRIT_CONSOLE",
            "$JS.API.STREAM.MSG.GET.KV_WRIT_CONSOLE",
            "$JS.API.DIRECT.GET.KV_WRIT_CONSOLE",
            "$JS.API.DIRECT.GET.KV_WRIT_CONSOLE.>",
            # Chat sessions: the operations the planner answers, and each session's stream read
            # with an ordered consumer (SSE, `Last-Event-ID` resumes at the next sequence).
            # (unnamed and ephemeral: it goes away once the reader does).
            SESSION_OPS,
            f"$JS.API.CONSUMER.CREATE.{CHAT_STREAM}",
            f"$JS.FC.{CHAT_STREAM}.>",
        ),
        ("writ.out.results.*", host_read("*", "*")),
    ),
    # Retrieval answers requests only, and may start nothing: it reads untrusted content, so
    # who a run is for never passes through it. Federation: it has governance record each MCP
    # listing, and serves operators' listings and admission's host facts (it alone holds the
    # MCP credential).
    "retrieval": (
        "",
        (subjects.DECIDE, subjects.MCP_LISTING),
        (
            subjects.SEARCH,
            subjects.READ,
            subjects.MCP_LIST,
            subjects.HOST_FACTS,
            subjects.MCP_CATALOG,
        ),
    ),
    "planner": (
        "WRIT_INT",
        (
            "writ.int.runs.branch.*",
            "writ.out.results.*",
            "writ.int.proposals.*",
            "writ.events.planner.*",
            subjects.READ,
            subjects.DECIDE,
            subjects.RESERVE,
            subjects.SETTLE,
            subjects.MCP_CATALOG,
            # Chat sessions: a turn is registered and started like a host's run, and each
            # session's events go on its own subject; a plan step's preview stands on the facts
            # its action reads, asked of their readers as admission asks (no credential here).
            "writ.int.evidence.*",
            subjects.REGISTER_TURN,  # never REGISTER_RUN: a turn carries no grants
            subjects.SEARCH,
            "writ.chat.*.*",
            TURN_CANCELLING,  # a close tells every replica to abandon the turn's model call
            subjects.FACTS,
            subjects.HOST_FACTS,
        ),
        (
            subjects.REPLAY,
            REVIEW,
            reads.RUN_STATUS,
            reads.RUN_EVENTS,
            reads.REVIEWS_LIST,
            SESSION_OPS,
            reads.journal_verify("planner"),
            # (not an endpoint: admission's core-NATS progress events, which a chat session
            # shows as its `StepAdmitted`; the planner reads them and publishes nothing there)
            subjects.admitted("*"),
            TURN_CANCELLING,
        ),
    ),
    "governance": (
        "WRIT_INT",
        ("writ.out.results.*", "writ.int.answered.*"),
        (
            subjects.DECIDE,
            subjects.DECIDE_BATCH,
            subjects.REGISTER_RUN,
            subjects.REGISTER_TURN,
            subjects.PENDING_LIST,
            subjects.ANSWER,
            subjects.RESERVE,
            subjects.SETTLE,
            reads.journal_verify("governance"),
            subjects.MCP_LISTING,
            subjects.MCP_CLASSIFY,
        ),
    ),
    "admission": (
        "WRIT_INT",
        (
            "writ.out.results.*",
            "writ.int.refused.*",
            "writ.cmd.*",
            "writ.int.admitted.*",
            subjects.FACTS,
            subjects.HOST_FACTS,
            subjects.ANSWER,
            subjects.DECIDE,
            subjects.DECIDE_BATCH,
        ),
        (
            reads.COMMAND_STATUS,
            reads.PROPOSALS_LIST,
            reads.PROPOSAL_GET,
            reads.journal_verify("admission"),
        ),
    ),
    "dispatcher": (
        "WRIT_CMD",
        ("writ.int.outcomes.*.*", subjects.DECIDE),
        (
            subjects.UNKNOWN_LIST,
            subjects.RECONCILE,
            subjects.FACTS,
            reads.journal_verify("dispatcher"),
        ),
    ),
}


# The services that keep an audit journal: each appends its own checkpoints to the record
# (`WRIT_AUDIT`) and reads its own last one back, and nobody else's.
JOURNALED: Final = ("planner", "governance", "admission", "dispatcher")


def host_user(tenant: str) -> str:
    """The NATS user of a tenant's host."""
    return f"host-{tenant}"


def inbox_prefix(user: str) -> str:
    """Where `user`'s replies arrive: pass it as nats-py's `inbox_prefix`."""
    return f"_INBOX.{user}"


def users(tenants: Iterable[str]) -> tuple[str, ...]:
    """Every user of a deployment: the administrator, each service, each tenant's host."""
    return (ADMIN, *SERVICE_SUBJECTS, EVAL, *(host_user(t) for t in tenants))


def _consumer(stream: str, durable: str) -> list[str]:
    """What a durable pull consumer's owner needs of JetStream: create, bind, fetch, ack."""
    return [
        f"{_JS}.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"{_JS}.CONSUMER.CREATE.{stream}.{durable}",
        f"{_JS}.CONSUMER.CREATE.{stream}.{durable}.>",
        f"{_JS}.CONSUMER.INFO.{stream}.{durable}",
        f"{_JS}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _streams(names: Iterable[str]) -> list[str]:
    """Declaring Writ's own streams (every service does at start), and nothing else."""
    return [f"{_JS}.STREAM.{op}.{name}" for name in names for op in ("INFO", "CREATE", "UPDATE")]


def _service(name: str, tenants: tuple[str, ...]) -> dict[str, object]:
    stream, publishes, endpoints = SERVICE_SUBJECTS[name]
    pub = [f"{_JS}.INFO", *_streams(_STATIC_STREAMS), *publishes, subjects.dead_letter(name)]
    if stream is None:  # ingress: one consumer per tenant's host stream, which it declares
        tenant_streams = [subjects.in_stream(t) for t in tenants]
        pub += _streams([*tenant_streams, *(subjects.out_stream(t) for t in tenants)])
        for s in tenant_streams:
            pub += _consumer(s, name)
    elif stream:
        pub += _consumer(stream, name)
    if name in JOURNALED:
        pub += [
            subjects.journal_checkpoints(name),
            f"{_JS}.STREAM.MSG.GET.{subjects.JOURNAL_RECORD_STREAM}",
        ]
    return {
        "publish": {"allow": pub},
        "subscribe": {"allow": [*endpoints, "$SRV.>", f"{inbox_prefix(name)}.>"]},
        "allow_responses": True,
    }


def _host(tenant: str) -> dict[str, object]:
    out = subjects.out_stream(tenant)
    user = host_user(tenant)
    pub = [
        *subjects.host_subjects(tenant),
        host_read(tenant, "*"),
        f"{_JS}.INFO",
        f"{_JS}.STREAM.INFO.{out}",
        f"{_JS}.CONSUMER.CREATE.{out}",
        f"{_JS}.CONSUMER.CREATE.{out}.>",
        f"{_JS}.CONSUMER.DURABLE.CREATE.{out}.*",
        f"{_JS}.CONSUMER.INFO.{out}.*",
        f"{_JS}.CONSUMER.DELETE.{out}.*",
        f"{_JS}.CONSUMER.MSG.NEXT.{out}.*",
        f"{_JS}.STREAM.MSG.GET.{out}",
        f"{_JS}.DIRECT.GET.{out}",
        f"{_JS}.DIRECT.GET.{out}.>",
        f"$JS.ACK.{out}.>",
        f"$JS.FC.{out}.>",
    ]
    sub = [subjects.result(tenant), subjects.planner_progress(tenant), f"{inbox_prefix(user)}.>"]
    return {"publish": {"allow": pub}, "subscribe": {"allow": sub}}


def _eval() -> dict[str, object]:
    """The shadow evaluation: a copy of what starts, its own subjects, and no way in."""
    pub = [
        f"{_JS}.INFO",
        f"{_JS}.STREAM.INFO.WRIT_INT",
        *_consumer("WRIT_INT", EVAL),
        EVAL_SUBJECTS,
    ]
    return {
        "publish": {"allow": pub, "deny": ["writ.int.>", "writ.cmd.>", "writ.in.>", "writ.out.>"]},
        "subscribe": {"allow": [EVAL_SUBJECTS, f"{inbox_prefix(EVAL)}.>"]},
    }


def permissions(tenants: Iterable[str]) -> dict[str, dict[str, object] | None]:
    """Each user's NATS permissions (None: the administrator, unrestricted)."""
    tenants = tuple(tenants)
    for tenant in tenants:
        if not subjects.valid_tenant(tenant):
            raise ValueError(f"invalid tenant name {tenant!r}")
    found: dict[str, dict[str, object] | None] = {ADMIN: None}
    for name in SERVICE_SUBJECTS:
        found[name] = _service(name, tenants)
    found[EVAL] = _eval()
    for tenant in tenants:
        found[host_user(tenant)] = _host(tenant)
    return found


def auth_config(passwords: Mapping[str, str], tenants: Iterable[str]) -> str:
    """The server's `authorization` block (NATS configuration accepts JSON)."""
    entries = []
    for user, perms in permissions(tenants).items():
        entry: dict[str, object] = {"user": user, "password": passwords[user]}
        if perms is not None:
            entry["permissions"] = perms
        entries.append(entry)
    return "authorization " + json.dumps({"users": entries}, indent=2) + "\n"


def ensure_passwords(folder: Path, tenants: Iterable[str]) -> dict[str, str]:
    """Each user's password from `<folder>/nats-<user>.password`, generated (mode 0600) for
    users that have none yet; existing ones are kept, so a restart changes nothing."""
    passwords = {}
    for user in users(tenants):
        path = Path(folder) / f"nats-{user}.password"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(24))
        passwords[user] = path.read_text().strip()
    return passwords
