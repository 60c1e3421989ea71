"""`writ`: the command-line tool of operators and developers.

    writ run                  start everything locally and run the demo (what `make run` does)
    writ service <name>       run one service process (what a Kubernetes Deployment runs)
    writ migrate              provision the service roles and apply migrations (--check [--wait])
    writ schemas --write      regenerate the committed JSON Schemas and the OpenAPI/AsyncAPI files
    writ token ...            mint a host token with a tenant's demo key (or --key)
    writ tenant add T --public-key PEM   register a tenant and its issuer's key
    writ reconcile list       commands whose outcome nobody knows (`unknown`)
    writ reconcile resolve    record what an operator established, with its evidence
    writ pending              decisions waiting for a person
    writ decide <id> <answer> answer one: once | always | deny
    writ approve <proposal>   approve a proposal by its id (what it does is what was shown)
    writ reject <proposal>    reject it, with --reason
    writ review <id> <answer> answer a review a run asked for: approve | reject
    writ policy sign          sign an organisation policy file
    writ audit verify         check every service's audit journal: chain, checkpoints, signatures
    writ audit export         append the checkpoints recorded outside the database to a file
    writ eval build|run|record  score a candidate model on a versioned set (writ/eval/)
    writ audit replay RUN     walk a run's (or a chat session's turns') captured model responses
                              and tool outputs offline
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from writ.stack import JOURNALS, SERVICES

__all__ = ["main"]


def _service(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"services.{args.name}.__main__")
    module.main()
    return 0


def _run(args: argparse.Namespace) -> int:
    from writ.demo import run_demo

    return run_demo(Path(args.home), serve=not args.once)


def _chat(args: argparse.Namespace) -> int:
    from writ.chat import chat_main

    return chat_main(args)


def _schemas(args: argparse.Namespace) -> int:
    from writ.contracts import check_contracts, write_contracts
    from writ.schemas_io import check_schemas, write_schemas

    if args.write:
        for path in [*write_schemas(), *write_contracts()]:
            print(f"wrote {path}")
        return 0
    drift = check_schemas() + check_contracts()
    for line in drift:
        print(line, file=sys.stderr)
    return 1 if drift else 0


def _token(args: argparse.Namespace) -> int:
    from writ.stack import Stack, mint_token

    stack = Stack(Path(args.home))
    roles = {"roles": args.roles.split(",")} if args.roles else {}
    if args.key:  # a tenant registered with `writ tenant add`, signing with its own key
        print(mint_token(Path(args.key).read_bytes(), tenant=args.tenant,
                         principal=args.principal, ttl_s=args.ttl,
                         issuer=args.issuer or stack.issuer(args.tenant), **roles))
        return 0
    print(stack.token(args.tenant, args.principal, ttl_s=args.ttl, **roles))
    return 0


def _console(args: argparse.Namespace) -> int:
    from writ.stack import Stack

    stack = Stack(Path(args.home))
    try:
        link = stack.console_link(tenant=args.tenant, principal=args.principal,
                                  roles=tuple(r for r in args.roles.split(",") if r),
                                  ttl_s=args.ttl)
    except FileNotFoundError:
        print(f"no running Writ under {args.home} (start it with `make run`)", file=sys.stderr)
        return 1
    print("Open this link once to sign in to the approval console (a second use is refused; "
          f"the session ends with the token, in {int(args.ttl)} s):\n{link}")
    return 0


def _tenant(args: argparse.Namespace) -> int:
    from writ.tenants import TenantError, add_tenant, remove_tenant

    try:
        if args.action == "add":
            issuer = add_tenant(Path(args.home), args.tenant, Path(args.public_key).read_text(),
                                issuer=args.issuer)
            print(f"tenant {args.tenant} added (issuer {issuer}); ingress picks it up within "
                  "seconds, no restart")
        else:
            remove_tenant(Path(args.home), args.tenant)
            print(f"tenant {args.tenant} removed")
    except (TenantError, OSError) as exc:
        print(f"writ tenant: {exc}", file=sys.stderr)
        return 1
    return 0


def _nats_url(args: argparse.Namespace) -> str:
    import os

    url = os.environ.get("WRIT_NATS_URL") or args.nats_url
    if url:
        return str(url)
    local = Path(args.home) / "nats.url"
    if local.exists():  # written by `writ run`
        return local.read_text().strip()
    raise SystemExit("no NATS server: set WRIT_NATS_URL or start `writ run`")


def _reconcile(args: argparse.Namespace) -> int:
    import anyio

    from writ.operator import list_unknown, resolve

    url = _nats_url(args)
    if args.action == "list":
        return anyio.run(list_unknown, url, args.tenant)
    return anyio.run(resolve, url, args.tenant, args.operation_id, args.state, args.receipt,
                     args.evidence, args.by)


def _mcp(args: argparse.Namespace) -> int:
    """`writ mcp add|list|classify`: federation reads (writ/mcp.py)."""
    import anyio

    from writ import mcp

    if args.action == "add":
        mcp.add_server(Path(args.home), args.tenant, args.server, url=args.url,
                       credential_file=str(Path(args.credential_file).resolve()),
                       tools=args.tool, facts=dict(f.split("=", 1) for f in args.facts),
                       transport=args.transport, auth=args.auth)
        print(f"{args.server} registered for {args.tenant}; retrieval picks it up, no restart")
        return 0
    if args.action == "list":
        listing = anyio.run(mcp.list_server, _nats_url(args), args.tenant, args.server)
        return 0 if listing.ok else 1
    answer = anyio.run(mcp.classify, _nats_url(args), args.tenant, args.server, args.tool,
                       args.family, args.by)
    return 0 if answer.ok else 1


def _pending(args: argparse.Namespace) -> int:
    import anyio

    from writ.operator import list_pending

    return anyio.run(list_pending, _nats_url(args), args.tenant)


def _approver_token(args: argparse.Namespace) -> str:
    """`--token`, or for local use a token signed as the tenant's host would, approver role."""
    if args.token:
        return str(args.token)
    from writ.stack import Stack

    return Stack(Path(args.home)).token(args.tenant, args.principal, roles=["approver"])


def _decide(args: argparse.Namespace) -> int:
    import anyio

    from writ.operator import answer_pending

    return anyio.run(answer_pending, _nats_url(args), args.tenant, args.pending_id,
                     args.answer, args.reason, _approver_token(args))


def _approve(args: argparse.Namespace) -> int:
    import anyio

    from writ.operator import answer_proposal

    return anyio.run(answer_proposal, _nats_url(args), args.tenant, args.proposal_id,
                     args.answer, args.reason, _approver_token(args))


def _review(args: argparse.Namespace) -> int:
    import anyio

    from writ.operator import answer_review

    return anyio.run(answer_review, _nats_url(args), args.tenant, args.pending_id,
                     args.answer, args.comment, _approver_token(args))


def _policy_sign(args: argparse.Namespace) -> int:
    import msgspec
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from services.governance.policy import PolicyDocument, sign_policy

    document = msgspec.json.decode(Path(args.input).read_bytes(), type=PolicyDocument)
    key = load_pem_private_key(Path(args.key).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise SystemExit("the signing key must be an Ed25519 private key (PEM)")
    Path(args.output).write_bytes(sign_policy(document, key, args.key_id))
    print(f"signed {document.tenant} policy {document.version} -> {args.output}")
    return 0


async def _ignore(_exc: Exception) -> None:
    """nats-py logs every failed connect itself; the caller says what failed."""


# Connect once, fail fast (nats-py's 0 attempts means "retry forever").
_ONCE: dict[str, Any] = {"allow_reconnect": False, "max_reconnect_attempts": 1,
                         "connect_timeout": 5, "error_cb": _ignore}


def _audit_dsn(args: argparse.Namespace) -> str:
    import os

    dsn_file = Path(args.home) / "secrets" / "audit.dsn"  # written by `writ run`
    dsn = args.dsn or os.environ.get("WRIT_AUDIT_DATABASE_URL") or (
        dsn_file.read_text().strip() if dsn_file.exists() else "")
    if not dsn:
        raise SystemExit("no database: pass --dsn, set WRIT_AUDIT_DATABASE_URL or run `writ run`")
    return dsn


def _audit_nats_url(args: argparse.Namespace) -> str:
    import os

    url_file = Path(args.home) / "nats.url"  # written by `writ run`
    return args.nats_url or os.environ.get("WRIT_NATS_URL") or (
        url_file.read_text().strip() if url_file.exists() else "")


def _audit(args: argparse.Namespace) -> int:
    import functools
    import os

    import anyio

    from libs.journal import DataKeys, load_verify_keys

    home = Path(args.home)
    dsn = _audit_dsn(args)
    keys_file = Path(args.keys or os.environ.get("WRIT_JOURNAL_VERIFY_KEYS_FILE")
                     or home / "config" / "journal-keys.json")
    keys = load_verify_keys(keys_file.read_text())
    data_keys = None
    if args.data_keys:
        if len(args.service or []) != 1:
            raise SystemExit("--data-keys authenticates one service's payloads: name it with "
                             "--service")
        data_keys = DataKeys.from_json(Path(args.data_keys).read_text())
    nats_url = "" if args.no_record or args.record_file else _audit_nats_url(args)
    if not (nats_url or args.record_file or args.no_record):
        raise SystemExit("no record of the checkpoints to hold the database against: pass "
                         "--nats-url (or set WRIT_NATS_URL), --record-file, or --no-record "
                         "(then a cut tail or a re-hashed chain is not detected)")
    return anyio.run(functools.partial(_audit_verify, args, dsn, keys, data_keys, nats_url))


async def _audit_verify(args: argparse.Namespace, dsn: str, keys: Any, data_keys: Any,
                        nats_url: str) -> int:
    """Verify each service's journal; 0 if all check out, 1 naming the first bad entry."""
    from datetime import timedelta

    import asyncpg
    import nats
    import nats.errors

    from libs.journal import FileRecord, JetStreamRecord, Journal, RecordError, verify

    try:
        nc = await nats.connect(nats_url, **_ONCE) \
            if nats_url else None
    except (OSError, nats.errors.Error) as exc:
        print(f"cannot reach the record of checkpoints at {nats_url}: {exc!r} (pass "
              "--record-file <export> or, knowingly, --no-record)", file=sys.stderr)
        return 2
    record: Any = (JetStreamRecord(nc.jetstream()) if nc is not None
                   else FileRecord(args.record_file) if args.record_file else None)
    conn = await asyncpg.connect(dsn)
    try:
        services = args.service or [r["table_schema"] for r in await conn.fetch(
            "SELECT table_schema FROM information_schema.tables WHERE table_name = 'journal' "
            "ORDER BY table_schema")]
        if not services:
            print("no audit journal in this database", file=sys.stderr)
            return 1
        failed = False
        for service in services:
            journal = (Journal(service=service, keys=data_keys) if data_keys else None)
            try:
                report = await verify(conn, service=service, keys=keys, tenant=args.tenant,
                                      grace=timedelta(seconds=args.grace_s), journal=journal,
                                      record=record)
            except RecordError as exc:
                print(f"{service}: cannot read its record: {exc}", file=sys.stderr)
                return 2
            counts = (f"{report.entries} entries, {report.checkpoints} signed checkpoints, "
                      f"{report.unsealed} not sealed yet")
            if report.recorded is not None:
                counts += f", {report.recorded} recorded outside the database"
            else:
                counts += ", NOT checked against a record"
            if report.pending is not None:
                counts += f"; checkpoint {report.pending} recorded, being committed"
            if args.tenant is not None:
                counts += f"; {report.tenant_entries} of tenant {args.tenant}"
            if report.ok:
                print(f"{service}: intact ({counts})")
                continue
            failed = True
            print(f"{service}: FAILED at {report.problems[0]} ({counts})")
            for problem in report.problems[1:6]:
                print(f"    then {problem}")
            if len(report.problems) > 6:
                print(f"    and {len(report.problems) - 6} more")
        return 1 if failed else 0
    finally:
        await conn.close()
        if nc is not None:
            await nc.close()


def _audit_export(args: argparse.Namespace) -> int:
    import anyio

    nats_url = _audit_nats_url(args)
    if not nats_url:
        raise SystemExit("no NATS: pass --nats-url or set WRIT_NATS_URL")
    return anyio.run(_audit_export_run, args, nats_url)


async def _audit_export_run(args: argparse.Namespace, nats_url: str) -> int:
    """Append the checkpoints recorded since the export file was last written."""
    import nats

    from libs.journal import FileRecord, JetStreamRecord

    nc = await nats.connect(nats_url, **_ONCE)
    try:
        added = await FileRecord(args.out).export(JetStreamRecord(nc.jetstream()),
                                                  args.service or JOURNALS)
    finally:
        await nc.close()
    print(f"{added} checkpoint(s) appended to {args.out}")
    return 0


def _audit_replay(args: argparse.Namespace) -> int:
    """Replay a run offline from the planner's journal: 0 identical, 1 divergent, 2 incomplete,
    3 if it cannot be replayed (no database, no keys, no such run)."""
    import functools
    import os

    import anyio

    from libs.errors import ConfigError
    from libs.journal import DataKeys

    home = Path(args.home)
    dsn_file = home / "secrets" / "audit.dsn"  # written by `writ run`
    dsn = args.dsn or os.environ.get("WRIT_AUDIT_DATABASE_URL") or (
        dsn_file.read_text().strip() if dsn_file.exists() else "")
    keys_file = Path(args.data_keys or home / "secrets" / "journal-planner-data.json")
    if not dsn:
        print("no database: pass --dsn, set WRIT_AUDIT_DATABASE_URL or run `writ run`",
              file=sys.stderr)
        return 3
    try:
        data_keys = DataKeys.from_json(keys_file.read_text())
    except (OSError, ConfigError) as exc:
        print(f"cannot read the planner's data keys ({keys_file}): {exc}", file=sys.stderr)
        return 3
    return anyio.run(functools.partial(_audit_replay_run, args, dsn, data_keys))


async def _audit_replay_run(args: argparse.Namespace, dsn: str, data_keys: Any) -> int:
    import asyncpg

    from libs.journal import Journal
    from services.planner.replay import render, replay_run
    from services.planner.store import read_replay

    journal = Journal(service="planner", keys=data_keys)
    conn = await asyncpg.connect(dsn)
    try:
        # A chat session (`ses-...`): each of its turns is a run, replayed in turn order.
        runs = [args.run_id]
        if args.run_id.startswith("ses-") and "-t" not in args.run_id.removeprefix("ses-"):
            runs = sorted({r["run_id"] for r in await conn.fetch(
                "SELECT DISTINCT run_id FROM planner.journal WHERE run_id LIKE $1 "
                "AND run_id NOT LIKE '%.%'", f"{args.run_id}-t%")},
                key=lambda r: int(r.rpartition("-t")[2]))
            if not runs:
                print(f"session {args.run_id}: no turn in the planner's journal",
                      file=sys.stderr)
                return 3
        tenant = args.tenant
        if tenant is None:  # the run's tenant, from the ids in clear in the journal
            tenants = [r["tenant"] for r in await conn.fetch(
                "SELECT DISTINCT tenant FROM planner.journal WHERE run_id = $1", runs[0])]
            if len(tenants) != 1:
                print(f"run {runs[0]}: " + ("not in the planner's journal" if not tenants
                      else f"journaled for several tenants ({', '.join(tenants)}): "
                           "pass --tenant"), file=sys.stderr)
                return 3
            tenant = tenants[0]
        read = [(run_id, await read_replay(conn, journal, tenant=tenant, run_id=run_id))
                for run_id in runs]
    finally:
        await conn.close()
    worst = 0
    for run_id, (entries, record, unsealed) in read:
        if not entries and record is None:
            print(f"run {run_id}: no such run of tenant {tenant}", file=sys.stderr)
            return 3
        report = replay_run(run_id, entries, record=record, unsealed=unsealed)
        print(render(report))
        worst = max(worst, {"identical": 0, "divergent": 1}.get(report.verdict, 2))
    return worst


def _nats_auth(args: argparse.Namespace) -> int:
    """Print the nats-server `authorization` block for these tenants (libs/natsauth.py),
    generating the users' password files that do not exist yet."""
    from libs.natsauth import auth_config, ensure_passwords

    folder = Path(args.passwords)
    folder.mkdir(parents=True, exist_ok=True)
    tenants = args.tenant or ["acme"]
    print(auth_config(ensure_passwords(folder, tenants), tenants), end="")
    return 0


def _operator_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", default=".writ")
    p.add_argument("--nats-url", default="")
    p.add_argument("--tenant", default="acme")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `writ` command."""
    parser = argparse.ArgumentParser(prog="writ", description="A governed runtime for AI agents")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("service", help="run one service process")
    p.add_argument("name", choices=SERVICES)
    p.set_defaults(func=_service)

    from writ.migrate import add_parser as add_migrate

    add_migrate(sub)
    from writ.eval.cli import add_parser as add_eval

    add_eval(sub)

    p = sub.add_parser("run", help="start Writ locally and run the demo request")
    p.add_argument("--home", default=".writ", help="data folder (default: .writ)")
    p.add_argument("--once", action="store_true", help="stop after the demo run")
    p.set_defaults(func=_run)

    p = sub.add_parser("chat", help="chat with an agent in the terminal (a session over HTTP)")
    p.add_argument("agent")
    p.add_argument("--home", default=".writ", help="writ run's folder: API port, demo keys")
    p.add_argument("--url", default="", help="the API's base URL (default: WRIT_API_URL, or "
                                             "writ run's)")
    p.add_argument("--tenant", default="acme")
    p.add_argument("--principal", default="alice@acme.example")
    p.add_argument("--key", default="", help="the tenant's host key (PEM) if not a demo one")
    p.add_argument("--issuer", default="", help="the issuer registered for the tenant")
    p.add_argument("--plan-mode", action="store_true", help="plans first, for your approval")
    p.add_argument("--session", default="", help="go on with this session instead")
    p.add_argument("--roles", default="", help="comma-separated roles of the token (approver: "
                                               "answer the decisions the chat asks)")
    p.set_defaults(func=_chat)

    p = sub.add_parser("schemas", help="check (default) or --write the committed JSON Schemas")
    p.add_argument("--write", action="store_true")
    p.set_defaults(func=_schemas)

    p = sub.add_parser("nats-auth", help="print NATS users and permissions for a deployment")
    p.add_argument("--tenant", action="append", default=[], help="a tenant (repeat for more)")
    p.add_argument("--passwords", required=True,
                   help="folder of the users' password files (missing ones are generated)")
    p.set_defaults(func=_nats_auth)

    p = sub.add_parser("token", help="mint a host token with a tenant's demo key")
    p.add_argument("--home", default=".writ")
    p.add_argument("--tenant", default="acme")
    p.add_argument("--principal", default="alice@acme.example")
    p.add_argument("--ttl", type=float, default=300.0)
    p.add_argument("--roles", default="", help="comma-separated: approver, auditor")
    p.add_argument("--key", default="", help="the tenant's private key (PEM) if not a demo one")
    p.add_argument("--issuer", default="", help="the issuer registered for the tenant")
    p.set_defaults(func=_token)

    p = sub.add_parser("console", help="print a one-time sign-in link to the approval console")
    p.add_argument("--home", default=".writ")
    p.add_argument("--tenant", default="acme")
    p.add_argument("--principal", default="ops@acme.example")
    p.add_argument("--roles", default="approver,auditor", help="comma-separated")
    p.add_argument("--ttl", type=float, default=3600.0, help="the session's life, in seconds")
    p.set_defaults(func=_console)

    p = sub.add_parser("tenant", help="register (or remove) a tenant and its issuer's key")
    p.add_argument("--home", default=".writ")
    ten = p.add_subparsers(dest="action", required=True)
    add = ten.add_parser("add", help="a tenant and its issuer's Ed25519 public key (PEM)")
    add.add_argument("tenant")
    add.add_argument("--public-key", required=True, help="a file holding the PEM public key")
    add.add_argument("--issuer", default="", help="the `iss` its tokens carry "
                                                  "(default https://<tenant>.example/host)")
    rm = ten.add_parser("remove", help="forget a tenant: its tokens are refused from then on")
    rm.add_argument("tenant")
    p.set_defaults(func=_tenant)

    p = sub.add_parser("reconcile", help="list and resolve commands in state unknown")
    p.add_argument("--home", default=".writ")
    p.add_argument("--nats-url", default="")
    p.add_argument("--tenant", default="acme")
    rec = p.add_subparsers(dest="action", required=True)
    rec.add_parser("list", help="commands whose outcome nobody knows")
    r = rec.add_parser("resolve", help="record the established outcome of an unknown command")
    r.add_argument("operation_id")
    r.add_argument("--state", choices=["succeeded", "failed"], required=True)
    r.add_argument("--receipt", default=None, help="the provider's proof, if it succeeded")
    r.add_argument("--evidence", required=True, help="what was checked, and where")
    r.add_argument("--by", required=True, help="who established it")
    p.set_defaults(func=_reconcile)

    p = sub.add_parser("mcp", help="a tenant's host MCP servers: register, list, classify")
    p.add_argument("--home", default=".writ")
    p.add_argument("--nats-url", default="")
    p.add_argument("--tenant", default="acme")
    m = p.add_subparsers(dest="action", required=True)
    a = m.add_parser("add", help="register a server: URL, credential file, exposed tools")
    a.add_argument("server")
    a.add_argument("--url", required=True)
    a.add_argument("--credential-file", required=True, help="a secret only retrieval reads")
    a.add_argument("--tool", action="append", default=[], help="a tool Writ exposes")
    a.add_argument("--facts", action="append", default=[],
                   help="KIND=TOOL: the tool previews read a host record with")
    a.add_argument("--transport", default="auto", choices=["auto", "streamable_http", "sse"],
                   help="auto: Streamable HTTP, falling back to legacy HTTP+SSE on a 4xx")
    a.add_argument("--auth", default="bearer", choices=["bearer", "client_credentials"],
                   help="client_credentials: the credential file is JSON {client_id, "
                        "client_secret, token_url[, scope]}")
    m2 = m.add_parser("list", help="list the server's tools now (journaled), with each one's "
                                   "standing and the server's hints")
    m2.add_argument("server")
    c = m.add_parser("classify", help="classify a tool's family as last listed")
    c.add_argument("server")
    c.add_argument("tool")
    c.add_argument("--family", required=True,
                   choices=["read", "read_personal", "write_delete", "send_external",
                            "execute_code"])
    c.add_argument("--by", required=True, help="the operator who classified it")
    p.set_defaults(func=_mcp)

    p = sub.add_parser("pending", help="decisions waiting for a person")
    _operator_args(p)
    p.set_defaults(func=_pending)

    p = sub.add_parser("decide", help="answer a pending decision as an approver")
    _operator_args(p)
    p.add_argument("pending_id")
    p.add_argument("answer", choices=["once", "always", "deny"])
    p.add_argument("--reason", default="")
    p.add_argument("--token", default="", help="the approver's token (default: local demo key)")
    p.add_argument("--principal", default="ops@acme.example")
    p.set_defaults(func=_decide)

    for verb, answer, helptext in (("approve", "approve", "approve a proposal by its id"),
                                   ("reject", "reject", "reject a proposal by its id")):
        p = sub.add_parser(verb, help=helptext)
        _operator_args(p)
        p.add_argument("proposal_id")
        p.add_argument("--reason", default="", required=answer == "reject")
        p.add_argument("--token", default="",
                       help="the approver's token (default: local demo key)")
        p.add_argument("--principal", default="ops@acme.example")
        p.set_defaults(func=_approve, answer=answer)

    p = sub.add_parser("review", help="approve or reject the review a run asked for")
    _operator_args(p)
    p.add_argument("pending_id", help="the run's review-<run>-<step>")
    p.add_argument("answer", choices=["approve", "reject"])
    p.add_argument("--comment", default="", help="what the run sees with the answer")
    p.add_argument("--token", default="", help="the approver's token (default: local demo key)")
    p.add_argument("--principal", default="ops@acme.example")
    p.set_defaults(func=_review)

    p = sub.add_parser("policy", help="organisation policy files")
    pol = p.add_subparsers(dest="action", required=True)
    s = pol.add_parser("sign", help="sign a policy document with the organisation's key")
    s.add_argument("input", help="the policy document (JSON)")
    s.add_argument("--key", required=True, help="Ed25519 private key (PEM)")
    s.add_argument("--key-id", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(func=_policy_sign)

    p = sub.add_parser("audit", help="the audit journal")
    aud = p.add_subparsers(dest="action", required=True)
    v = aud.add_parser("verify", help="check the whole chain, every checkpoint and signature, "
                                      "against the record outside the database; exit 1 naming "
                                      "the first bad entry, 2 if the record cannot be read")
    v.add_argument("--home", default=".writ")
    v.add_argument("--dsn", default="", help="an auditor's (read-only) DSN of Writ's database "
                                             "(default: WRIT_AUDIT_DATABASE_URL, or writ run's)")
    v.add_argument("--service", action="append", choices=SERVICES,
                   help="verify this service's journal (repeatable; default: every journal)")
    v.add_argument("--tenant", default=None, help="also count this tenant's entries (the "
                                                  "chain is always verified whole)")
    v.add_argument("--keys", default="", help="public keys, {service: {key id: PEM}} (default: "
                                              "WRIT_JOURNAL_VERIFY_KEYS_FILE, or writ run's)")
    v.add_argument("--data-keys", default="", help="the service's data key file: also "
                                                   "authenticate every payload")
    v.add_argument("--grace-s", type=float, default=10.0,
                   help="how long a committed row may wait to be sealed (default 10 s)")
    v.add_argument("--nats-url", default="", help="the NATS holding the record of checkpoints "
                                                  "(default: WRIT_NATS_URL, or writ run's)")
    v.add_argument("--record-file", default="", help="hold the database against this export "
                                                     "of the record instead (writ audit export)")
    v.add_argument("--no-record", action="store_true",
                   help="check the database alone (a cut tail is then not detected)")
    v.set_defaults(func=_audit)
    x = aud.add_parser("export", help="append the checkpoints recorded since the last export "
                                      "to a file an auditor keeps")
    x.add_argument("--out", required=True, help="the export (JSON lines), appended to")
    x.add_argument("--home", default=".writ")
    x.add_argument("--nats-url", default="", help="default: WRIT_NATS_URL, or writ run's")
    x.add_argument("--service", action="append", choices=JOURNALS,
                   help="this service's checkpoints (repeatable; default: every journal)")
    x.set_defaults(func=_audit_export)
    r = aud.add_parser("replay", help="walk a run's captured model responses and tool outputs "
                                      "offline (no model, no tool); exit 0 identical, "
                                      "1 divergent, 2 incomplete")
    r.add_argument("run_id")
    r.add_argument("--tenant", default=None, help="the run's tenant (default: the one its "
                                                  "journal entries name)")
    r.add_argument("--home", default=".writ")
    r.add_argument("--dsn", default="", help="an auditor's DSN of Writ's database (default: "
                                             "WRIT_AUDIT_DATABASE_URL, or writ run's)")
    r.add_argument("--data-keys", default="", help="the planner's journal data key file "
                                                   "(default: writ run's)")
    r.set_defaults(func=_audit_replay)

    args = parser.parse_args(argv)
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
