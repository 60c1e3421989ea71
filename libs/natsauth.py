"""Who may use which subject: NATS accounts, users and permissions, generated per deployment.

NATS enforces them, not Writ. The accounts are the authority boundary (docs/bus.md):

- `WRIT`: Writ's streams, each service's user, the shadow evaluation's (`eval`), the
  provisioning identity (`provision`, libs/provision.py) and the administrator (`admin`, no
  limits: operators' tooling and the tests' inspection).
- `HOST_<tenant>`, one per tenant, holding its host's user `host-<tenant>`. It imports from
  `WRIT` exactly what the host contract names: the services `writ.in.<kind>.<tenant>` and
  `writ.api.<tenant>.*`, the reads of its own result stream (`WRIT_OUT_<tenant>`: info, get a
  message by sequence), and the streams `writ.out.results.<tenant>` and
  `writ.events.planner.<tenant>`. Every other subject a host names, `$JS.API.>` and reply
  subjects included, resolves in its own account, where nothing answers: an answer or a
  JetStream acknowledgement to a host's request goes back through the import to the host's
  account, whatever reply subject the host gave.

- `AUDIT`: the audit record (`WRIT_AUDIT`) alone, with its own provisioning identity
  (`provision-audit`) and administrator (`audit-admin`: operators' verify, export, re-anchor).
  No runtime identity is in it, and `WRIT` imports nothing from it: a JetStream
  acknowledgement a service's publish steers to a checkpoint subject is published in `WRIT`,
  where that subject reaches nothing.
- `SEAL_<service>`, one per journal, holding its sealer's user (`seal-<service>`, a second
  connection of that service). No JetStream of its own; it imports from `AUDIT` exactly its
  journal's checkpoint subject and the record's message reads (under `SEAL_JS_API`). One
  account each, because an answer or acknowledgement delivered into an account goes through
  that account's imports: a sealer that steered the record's reply to another journal's
  subject would store it there if the subject were imported beside its own. So nothing but a
  journal's sealer stores anything on that journal's record.

Accounts live in the server's configuration file, so a tenant added later is one more account
and one more set of exports, applied with `nats-server --signal reload` (SIGHUP).

Within `WRIT`:

- A service publishes only where it produces, subscribes only to its endpoints, and reaches
  JetStream's API only to read Writ's streams and bind to, fetch from and acknowledge its own
  durable consumer, which provisioning created: no service may create, update, delete or purge
  a stream, nor create a consumer (ingress alone creates ephemeral ordered consumers on the
  chat sessions' stream, for server-sent events). It answers requests only on an inbox
  (`_INBOX.>`, or `_R_.>` for a host's request through its import): no `allow_responses`,
  which would let it publish on any reply subject it is sent, a JetStream API call included.
  `libs.replies` refuses the rest in code too, and counts them.
- The evaluation's shadow runs (`writ eval shadow`, user `eval`) read a copy of the runs that
  start (its own provisioned durable consumer `eval` on WRIT_INT, for the evidence each run is
  handed to the planner with) and publish only under `writ.eval.>`: nothing under
  `writ.int.>`, `writ.cmd.>` or `writ.in.>`, and no request to governance, admission or the
  dispatcher, so no proposal of a shadow run can be admitted or dispatched.
- `provision` holds JetStream's API and nothing else.
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
    "AUDIT_ACCOUNT",
    "AUDIT_ADMIN",
    "EVAL",
    "INGRESS_RUNS",
    "PROVISION",
    "PROVISION_AUDIT",
    "seal_account",
    "SEAL_JS_API",
    "WRIT_ACCOUNT",
    "account_of",
    "seal_imports",
    "seal_user",
    "host_account",
    "host_imports",
    "identity_table",
    "EVAL_SUBJECTS",
    "HOST_JS_API",
    "JOURNALED",
    "SERVICE_SUBJECTS",
    "accounts",
    "auth_config",
    "ensure_passwords",
    "host_user",
    "inbox_prefix",
    "permissions",
    "users",
]

ADMIN: Final = "admin"
EVAL: Final = "eval"
# Ingress's consumer of each tenant's run requests, beside its `ingress` one (libs/provision.py).
INGRESS_RUNS: Final = "ingress-runs"
# Provisioning's identity (libs/provision.py): JetStream's API, for nothing else.
PROVISION: Final = "provision"
WRIT_ACCOUNT: Final = "WRIT"
# The audit record's account, its provisioning identity and its administrator.
AUDIT_ACCOUNT: Final = "AUDIT"
PROVISION_AUDIT: Final = "provision-audit"
AUDIT_ADMIN: Final = "audit-admin"
# Where a sealer (in its own account, without JetStream) reaches the record's reads.
SEAL_JS_API: Final = "$JS.AUDIT.API"
# Where a service may answer a request: a Writ identity's inbox, or a host's request's reply
# subject as its import maps it (`_R_.<...>`, which routes back to the host's account only).
_REPLIES: Final = ("_INBOX.>", "_R_.>")
# Where the shadow evaluation publishes its would-be asks, proposals and reports.
EVAL_SUBJECTS: Final = subjects.EVAL_FAMILY
_JS: Final = "$JS.API"
# Where a host reaches the reads of its own result stream (JetStream's API, imported).
HOST_JS_API: Final = "$JS.WRIT.API"
_STATIC_STREAMS: Final = tuple(spec.name for spec in subjects.STREAMS)

# service -> (its durable consumer's stream, None for per-tenant streams or "" for none, what
# it publishes, the request/reply endpoints it serves). Request/reply calls are publishes too.
SERVICE_SUBJECTS: Final[dict[str, tuple[str | None, tuple[str, ...], tuple[str, ...]]]] = {
    "ingress": (
        None,
        (
            # A run starts registered with governance, its evidence asked of retrieval, and
            # handed to the planner with both (libs/runstart.py).
            subjects.result.filter,
            subjects.evidence.filter,
            subjects.REGISTER_RUN,
            subjects.SEARCH,
            subjects.proposal_answer.filter,
            subjects.proposal.filter,
            subjects.answer.filter,
            REVIEW,
            # The HTTP door: cancellations, the reads other services answer, and the
            # Idempotency-Key bucket (its KV stream).
            subjects.run_cancel.filter,
            reads.RUN_STATUS,
            reads.RUN_EVENTS,
            reads.COMMAND_STATUS,
            reads.REVIEWS_LIST,
            reads.PROPOSALS_LIST,
            reads.PROPOSAL_GET,
            subjects.PENDING_LIST,
            subjects.SPEND_LIST,
            subjects.REPLAY,
            subjects.UNKNOWN_LIST,
            subjects.RECONCILE,
            *(reads.journal_verify(s) for s in reads.JOURNALED),
            # The console's MCP pages, for operators (the role Writ's own key gives): list a
            # server now, classify what was shown, and which servers are registered.
            subjects.MCP_LIST,
            subjects.MCP_CLASSIFY,
            subjects.MCP_SERVERS,
            "$KV.WRIT_IDEMPOTENCY.>",
            "$JS.API.STREAM.INFO.KV_WRIT_IDEMPOTENCY",
            "$JS.API.STREAM.MSG.GET.KV_WRIT_IDEMPOTENCY",
            "$JS.API.DIRECT.GET.KV_WRIT_IDEMPOTENCY",
            "$JS.API.DIRECT.GET.KV_WRIT_IDEMPOTENCY.>",
            # The approval console's sessions and used sign-in links (its KV stream).
            # Who first used each request id and operation key (its KV stream).
            "$KV.WRIT_OWNERS.>",
            "$JS.API.STREAM.INFO.KV_WRIT_OWNERS",
            "$JS.API.STREAM.MSG.GET.KV_WRIT_OWNERS",
            "$JS.API.DIRECT.GET.KV_WRIT_OWNERS",
            "$JS.API.DIRECT.GET.KV_WRIT_OWNERS.>",
            "$KV.WRIT_CONSOLE.>",
            "$JS.API.STREAM.INFO.KV_WRIT_CONSOLE",
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
        (subjects.result.filter, host_read("*", "*")),
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
            subjects.MCP_SERVERS,
            subjects.HOST_FACTS,
            subjects.MCP_CATALOG,
        ),
    ),
    "planner": (
        "WRIT_INT",
        (
            subjects.branch.filter,
            subjects.result.filter,
            subjects.proposal.filter,
            subjects.planner_progress.filter,
            subjects.READ,
            subjects.DECIDE,
            subjects.RESERVE,
            subjects.SETTLE,
            subjects.MCP_CATALOG,
            # Chat sessions: a turn is registered and started like a host's run, and each
            # session's events go on its own subject; a plan step's preview stands on the facts
            # its action reads, asked of their readers as admission asks (no credential here).
            subjects.evidence.filter,
            subjects.REGISTER_TURN,  # never REGISTER_RUN: a turn carries no grants
            subjects.SEARCH,
            subjects.chat_subject.filter,
            TURN_CANCELLING,  # a close tells every replica to abandon the turn's model call
            subjects.FACTS,
            subjects.HOST_FACTS,
            subjects.PLAN_FACTS,  # a proposed plan's facts, read and kept by admission
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
        (subjects.result.filter, subjects.answered.filter),
        (
            subjects.DECIDE,
            subjects.DECIDE_BATCH,
            subjects.REGISTER_RUN,
            subjects.REGISTER_TURN,
            subjects.PENDING_LIST,
            subjects.ANSWER,
            subjects.RESERVE,
            subjects.SETTLE,
            subjects.SPEND_LIST,
            reads.journal_verify("governance"),
            subjects.MCP_LISTING,
            subjects.MCP_CLASSIFY,
        ),
    ),
    "admission": (
        "WRIT_INT",
        (
            subjects.result.filter,
            subjects.refused.filter,
            subjects.command.filter,
            subjects.admitted.filter,
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
            subjects.PLAN_FACTS,
            reads.journal_verify("admission"),
        ),
    ),
    "dispatcher": (
        "WRIT_CMD",
        (subjects.outcome("*", "*"), subjects.DECIDE),
        (
            subjects.UNKNOWN_LIST,
            subjects.RECONCILE,
            subjects.FACTS,
            reads.journal_verify("dispatcher"),
        ),
    ),
}


# The services that keep an audit journal: each one's sealer (`seal_user`) appends its own
# checkpoints to the record (`WRIT_AUDIT`) and reads its own last one back, and nobody else's.
JOURNALED: Final = ("planner", "governance", "admission", "dispatcher")


def seal_user(service: str) -> str:
    """The NATS user of a journal's sealer (in `seal_account(service)`)."""
    return f"seal-{service}"


def seal_account(service: str) -> str:
    """The NATS account of a journal's sealer: its own, importing its subject alone."""
    return f"SEAL_{service}"


def host_user(tenant: str) -> str:
    """The NATS user of a tenant's host."""
    return f"host-{tenant}"


def inbox_prefix(user: str) -> str:
    """Where `user`'s replies arrive: pass it as nats-py's `inbox_prefix`."""
    return f"_INBOX.{user}"


def users(tenants: Iterable[str]) -> tuple[str, ...]:
    """Every user of a deployment: the administrator, each service, each tenant's host, the
    record's provisioning and administrator, each journal's sealer."""
    return (
        ADMIN,
        PROVISION,
        *SERVICE_SUBJECTS,
        EVAL,
        *(host_user(t) for t in tenants),
        PROVISION_AUDIT,
        AUDIT_ADMIN,
        *(seal_user(s) for s in JOURNALED),
    )


def account_of(user: str) -> str:
    """The account `user` is in."""
    if user.startswith("host-"):
        return host_account(user.removeprefix("host-"))
    if user in (PROVISION_AUDIT, AUDIT_ADMIN):
        return AUDIT_ACCOUNT
    for service in JOURNALED:
        if user == seal_user(service):
            return seal_account(service)
    return WRIT_ACCOUNT


def host_account(tenant: str) -> str:
    """The NATS account of a tenant's host."""
    return f"HOST_{tenant}"


def _consumer(stream: str, durable: str) -> list[str]:
    """What a durable pull consumer's owner needs of JetStream: bind, fetch, ack. Not create:
    provisioning creates it (a create request could make it deliver anywhere)."""
    return [
        f"{_JS}.CONSUMER.INFO.{stream}.{durable}",
        f"{_JS}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _stream_info(names: Iterable[str]) -> list[str]:
    """Reading Writ's streams' state, and nothing else of their management."""
    return [f"{_JS}.STREAM.INFO.{name}" for name in names]


def _service(name: str, tenants: tuple[str, ...]) -> dict[str, object]:
    stream, publishes, endpoints = SERVICE_SUBJECTS[name]
    pub = [
        f"{_JS}.INFO",
        *_stream_info(_STATIC_STREAMS),
        *publishes,
        subjects.dead_letter(name),
        *_REPLIES,
    ]
    if stream is None:  # ingress: one consumer per tenant's host stream
        tenant_streams = [subjects.in_stream(t) for t in tenants]
        pub += _stream_info([*tenant_streams, *(subjects.out_stream(t) for t in tenants)])
        for s in tenant_streams:  # its run requests' consumer, and the rest's
            pub += [*_consumer(s, name), *_consumer(s, INGRESS_RUNS)]
        pub.append(subjects.dead_letter(INGRESS_RUNS))  # the run requests' dead letters
    elif stream:
        pub += _consumer(stream, name)
    return {
        "publish": {"allow": pub},
        "subscribe": {"allow": [*endpoints, "$SRV.>", f"{inbox_prefix(name)}.>"]},
    }


def host_imports(tenant: str) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """What a tenant's host account imports from Writ's: (services as (Writ's subject, the
    host's subject), streams). The host contract, and nothing more: its requests and reads,
    its result stream's state and messages by sequence (no consumer: a consumer's
    configuration names where it delivers), its results and progress events as they happen.

    JetStream's API is imported under `HOST_JS_API` (`nc.jetstream(prefix=HOST_JS_API)`):
    nats-server answers `$JS.API.>` itself in an account without JetStream, before imports."""
    out = subjects.out_stream(tenant)
    services = (
        *((s, s) for s in subjects.host_subjects(tenant)),
        (host_read(tenant, "*"),) * 2,
        *(
            (f"{_JS}.{api}", f"{HOST_JS_API}.{api}")
            for api in (
                f"STREAM.INFO.{out}",
                f"STREAM.MSG.GET.{out}",
                f"DIRECT.GET.{out}",
                f"DIRECT.GET.{out}.>",
            )
        ),
    )
    return services, (subjects.result(tenant), subjects.planner_progress(tenant))


# The record's reads a sealer makes (its subject's last message, a message by sequence),
# imported into each sealer's account under `SEAL_JS_API`: nats-server answers `$JS.API.>`
# itself in an account without JetStream. Nothing that creates a consumer: a consumer
# delivers where its configuration says.
_RECORD_READS: Final = (f"STREAM.MSG.GET.{subjects.JOURNAL_RECORD_STREAM}",)


def seal_imports(service: str) -> tuple[tuple[str, str], ...]:
    """What a journal's sealer's account imports from `AUDIT`, as services (the record's
    subject, the sealer's subject): its journal's checkpoint subject and the record's reads."""
    return (
        (subjects.journal_checkpoints(service),) * 2,
        *((f"{_JS}.{api}", f"{SEAL_JS_API}.{api}") for api in _RECORD_READS),
    )


def _seal(service: str) -> dict[str, object]:
    """A journal's sealer: its own checkpoint subject and the record's reads, nothing else."""
    pub = [
        subjects.journal_checkpoints(service),
        *(f"{SEAL_JS_API}.{api}" for api in _RECORD_READS),
    ]
    sub = [f"{inbox_prefix(seal_user(service))}.>"]
    return {"publish": {"allow": pub}, "subscribe": {"allow": sub}}


def _provision_audit() -> dict[str, object]:
    """The record is created (append-only) by its own provisioning identity."""
    return {
        "publish": {"allow": [f"{_JS}.>"]},
        "subscribe": {"allow": [f"{inbox_prefix(PROVISION_AUDIT)}.>"]},
    }


def _host(tenant: str) -> dict[str, object]:
    services, streams = host_imports(tenant)
    sub = [*streams, f"{inbox_prefix(host_user(tenant))}.>"]
    return {"publish": {"allow": [local for _, local in services]}, "subscribe": {"allow": sub}}


def _provision() -> dict[str, object]:
    """Streams, consumers and buckets are created and changed by provisioning alone."""
    return {
        "publish": {"allow": [f"{_JS}.>"]},
        "subscribe": {"allow": [f"{inbox_prefix(PROVISION)}.>"]},
    }


def _eval() -> dict[str, object]:
    """The shadow evaluation: a copy of what starts, its own subjects, and no way in."""
    pub = [
        f"{_JS}.INFO",
        f"{_JS}.STREAM.INFO.WRIT_INT",
        *_consumer("WRIT_INT", EVAL),
        EVAL_SUBJECTS,
    ]
    return {
        "publish": {"allow": pub, "deny": list(subjects.WORK_FAMILIES)},
        "subscribe": {"allow": [EVAL_SUBJECTS, f"{inbox_prefix(EVAL)}.>"]},
    }


def permissions(tenants: Iterable[str]) -> dict[str, dict[str, object] | None]:
    """Each user's NATS permissions (None: the administrator, unrestricted)."""
    tenants = tuple(tenants)
    for tenant in tenants:
        if not subjects.valid_tenant(tenant):
            raise ValueError(f"invalid tenant name {tenant!r}")
    found: dict[str, dict[str, object] | None] = {ADMIN: None, PROVISION: _provision()}
    for name in SERVICE_SUBJECTS:
        found[name] = _service(name, tenants)
    found[EVAL] = _eval()
    for tenant in tenants:
        found[host_user(tenant)] = _host(tenant)
    found[PROVISION_AUDIT] = _provision_audit()
    found[AUDIT_ADMIN] = None
    for service in JOURNALED:
        found[seal_user(service)] = _seal(service)
    return found


def accounts(passwords: Mapping[str, str], tenants: Iterable[str]) -> dict[str, object]:
    """The server's accounts: Writ's, with its users and what it exports to each tenant's host
    account, and one account per tenant with its host's user and its imports."""
    tenants = tuple(tenants)
    perms = permissions(tenants)

    def user(name: str) -> dict[str, object]:
        entry: dict[str, object] = {"user": name, "password": passwords[name]}
        if perms[name] is not None:
            entry["permissions"] = perms[name]
        return entry

    exports: list[dict[str, object]] = []
    found: dict[str, object] = {}
    for tenant in tenants:
        account = host_account(tenant)
        services, streams = host_imports(tenant)
        exports += [{"service": s, "accounts": [account]} for s, _ in services]
        exports += [{"stream": s, "accounts": [account]} for s in streams]
        found[account] = {
            "users": [user(host_user(tenant))],
            "imports": [
                *(
                    {"service": {"account": WRIT_ACCOUNT, "subject": s}, "to": local}
                    for s, local in services
                ),
                *({"stream": {"account": WRIT_ACCOUNT, "subject": s}} for s in streams),
            ],
        }
    writ_users = [ADMIN, PROVISION, *SERVICE_SUBJECTS, EVAL]
    seals = {s: seal_imports(s) for s in JOURNALED}
    return {
        WRIT_ACCOUNT: {
            "jetstream": "enabled",
            "users": [user(name) for name in writ_users],
            "exports": exports,
        },
        **found,
        # The record's account: nothing of Writ's runtime connects to it or imports from it.
        AUDIT_ACCOUNT: {
            "jetstream": "enabled",
            "users": [user(PROVISION_AUDIT), user(AUDIT_ADMIN)],
            "exports": [
                *(
                    {"service": subjects.journal_checkpoints(s), "accounts": [seal_account(s)]}
                    for s in JOURNALED
                ),
                *(
                    {"service": f"{_JS}.{api}", "accounts": [seal_account(s) for s in JOURNALED]}
                    for api in _RECORD_READS
                ),
            ],
        },
        # Each sealer's account: no JetStream, so no acknowledgement is ever published in it
        # but the record's own, routed back to the sealer that published.
        **{
            seal_account(s): {
                "users": [user(seal_user(s))],
                "imports": [
                    {"service": {"account": AUDIT_ACCOUNT, "subject": subject}, "to": local}
                    for subject, local in seals[s]
                ],
            }
            for s in JOURNALED
        },
    }


def auth_config(passwords: Mapping[str, str], tenants: Iterable[str]) -> str:
    """The server's `accounts` block (NATS configuration accepts JSON): a reload
    (`nats-server --signal reload`) applies a changed one, a new tenant's account included."""
    return "accounts " + json.dumps(accounts(passwords, tenants), indent=2) + "\n"


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


def identity_table(tenant: str = "acme") -> str:
    """docs/bus.md's table of identities: each user's account and what it may publish and
    subscribe to, for one example tenant (tests/unit/test_natsauth.py keeps the page equal)."""
    perms = permissions([tenant])
    rows = [
        "| identity | account | may publish (requests included) | may subscribe |",
        "|---|---|---|---|",
    ]
    for name, perm in perms.items():
        account = account_of(name)
        if perm is None:
            rows.append(f"| `{name}` | `{account}` | everything | everything |")
            continue
        publish = perm["publish"]["allow"]  # type: ignore[index]
        subscribe = perm["subscribe"]["allow"]  # type: ignore[index]
        rows.append(
            f"| `{name}` | `{account}` | {', '.join(f'`{s}`' for s in publish)} "
            f"| {', '.join(f'`{s}`' for s in subscribe)} |"
        )
    return "\n".join(rows) + "\n"
