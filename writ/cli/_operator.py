"""The operators' commands: `writ reconcile`, `mcp`, `pending`, `decide`, `approve`,
`reject`, `review` and `policy sign` (what they do is in writ/operator.py and writ/mcp.py)."""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
from pathlib import Path
from typing import Any

__all__ = ["add_parsers"]


def _nats_url(args: argparse.Namespace) -> str:
    import os

    url = os.environ.get("WRIT_NATS_URL") or args.nats_url
    if url:
        return str(url)
    local = Path(args.home) / "nats-admin.url"
    if local.exists():  # written by `writ run`
        return local.read_text().strip()
    raise SystemExit("no NATS server: set WRIT_NATS_URL or start `writ run`")


def _reconcile(args: argparse.Namespace) -> int:
    import anyio

    from writ.operator import list_unknown, resolve

    url = _nats_url(args)
    if args.action == "list":
        return anyio.run(list_unknown, url, args.tenant)
    return anyio.run(
        resolve,
        url,
        args.tenant,
        args.operation_id,
        args.state,
        args.receipt,
        args.evidence,
        args.by,
    )


def _mcp(args: argparse.Namespace) -> int:
    """`writ mcp add|list|show|classify|grant`: federation reads (writ/mcp.py)."""
    import anyio

    from libs.errors import ConfigError
    from writ import mcp

    if args.action == "grant":
        return _mcp_grant(args)

    if args.action == "add":
        pairs = {
            "--facts": args.facts,
            "--env": args.env,
            "--env-file": args.env_file,
            "--resource": args.resource,
        }
        for flag, values in pairs.items():
            if any("=" not in v for v in values):
                print(f"{flag} takes NAME=VALUE")
                return 2
        try:
            mcp.add_server(
                Path(args.home),
                args.tenant,
                args.server,
                url=args.url,
                credential_file=str(Path(args.credential_file).resolve())
                if args.credential_file
                else "",
                tools=args.tool,
                facts=dict(f.split("=", 1) for f in args.facts),
                transport=args.transport,
                auth=args.auth,
                command=shlex.split(args.command) if args.command else [],
                resources=dict(r.split("=", 1) for r in args.resource),
                auth_origins=args.auth_origin,
                env=dict(e.split("=", 1) for e in args.env),
                env_files={
                    k: str(Path(v).resolve()) for k, v in (e.split("=", 1) for e in args.env_file)
                },
            )
        except (ConfigError, OSError, ValueError) as exc:
            print(exc)
            return 2
        print(f"{args.server} registered for {args.tenant}; retrieval picks it up, no restart")
        return 0
    try:
        if args.action == "list":
            listing = anyio.run(mcp.list_server, _nats_url(args), args.tenant, args.server)
            return 0 if listing.ok else 1
        if args.action == "show":
            listing = anyio.run(mcp.show_tool, _nats_url(args), args.tenant, args.server, args.tool)
            return 0 if listing.ok else 1
        if args.digest is not None and not re.fullmatch(r"[0-9a-f]{64}", args.digest):
            print("--digest is the 64 hex digits `writ mcp show` printed")
            return 2
        answer = anyio.run(
            functools.partial(
                mcp.classify,
                _nats_url(args),
                args.tenant,
                args.server,
                args.tool,
                args.family,
                args.by,
                digest=args.digest,
                description=args.description,
            )
        )
    except ConfigError as exc:
        print(exc)
        return 1
    return 0 if answer.ok else 1


def _mcp_grant(args: argparse.Namespace) -> int:
    """`writ mcp grant`: an agent's standing grant for an MCP tool or server, pinned to the
    digests classified now (an administrator's, written to governance's table)."""
    import anyio

    from schemas.mcp import parse_capability
    from writ import mcp

    server = args.source[:-2] if args.source.endswith("/*") else None
    if parse_capability(args.source) is None and (
        server is None or parse_capability(f"{server}/x") is None
    ):
        print("the source is mcp:<server>/<tool> or mcp:<server>/*")
        return 2
    dsn = args.dsn or os.environ.get("WRIT_DATABASE_URL", "")
    if not dsn:
        print("no database: pass --dsn or set WRIT_DATABASE_URL")
        return 2
    try:
        digests = anyio.run(
            mcp.grant_pinned, dsn, args.tenant, args.agent, args.family, args.source, args.by
        )
    except Exception as exc:  # unreachable, refused, or no such table: said, not a traceback
        print(f"nothing granted: {type(exc).__name__}: {exc}")
        return 1
    if not digests:
        print(
            f"nothing granted: no tool of {args.source} is classified {args.family} "
            "(or the grant exists already)"
        )
        return 1
    for digest in digests:
        print(f"granted {args.agent} {args.family} on {args.source} pinned to {digest}")
    return 0


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

    return anyio.run(
        answer_pending,
        _nats_url(args),
        args.tenant,
        args.pending_id,
        args.answer,
        args.reason,
        _approver_token(args),
        10.0,
        args.proposal,
    )


def _approve(args: argparse.Namespace) -> int:
    import anyio

    from writ.operator import answer_proposal

    return anyio.run(
        answer_proposal,
        _nats_url(args),
        args.tenant,
        args.proposal_id,
        args.answer,
        args.reason,
        _approver_token(args),
        10.0,
        "always" if getattr(args, "always", False) else "once",
    )


def _review(args: argparse.Namespace) -> int:
    import anyio

    from writ.operator import answer_review

    return anyio.run(
        answer_review,
        _nats_url(args),
        args.tenant,
        args.pending_id,
        args.answer,
        args.comment,
        _approver_token(args),
    )


def _policy_sign(args: argparse.Namespace) -> int:
    import msgspec
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from services.governance.policy import PolicyDocument, sign_policy

    try:
        document = msgspec.json.decode(Path(args.input).read_bytes(), type=PolicyDocument)
    except msgspec.DecodeError as exc:
        raise SystemExit(f"{args.input} is not a valid policy, nothing signed: {exc}") from None
    key = load_pem_private_key(Path(args.key).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise SystemExit("the signing key must be an Ed25519 private key (PEM)")
    Path(args.output).write_bytes(sign_policy(document, key, args.key_id))
    print(f"signed {document.tenant} policy {document.version} -> {args.output}")
    return 0


def _spend(args: argparse.Namespace) -> int:
    import anyio

    from writ.operator import list_spend

    url, tenant = _nats_url(args), args.tenant
    return anyio.run(
        lambda: list_spend(url, tenant, cap=args.cap, agent=args.agent, window=args.window)
    )


def _prices_sign(args: argparse.Namespace) -> int:
    import msgspec
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from services.governance.spend import PriceTable, sign_prices

    table = msgspec.json.decode(Path(args.input).read_bytes(), type=PriceTable)
    key = load_pem_private_key(Path(args.key).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise SystemExit("the signing key must be an Ed25519 private key (PEM)")
    Path(args.output).write_bytes(sign_prices(table, key, args.key_id))
    print(f"signed {table.tenant} price table {table.version} -> {args.output}")
    return 0


def _operator_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", default=".writ")
    p.add_argument("--nats-url", default="")
    p.add_argument("--tenant", default="acme")


def add_parsers(sub: Any) -> None:
    """`writ reconcile`, `mcp`, `pending`, `decide`, `approve`, `reject`, `review`, `policy`."""
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
    a.add_argument("--url", default="", help="a remote server's http(s) URL")
    a.add_argument("--credential-file", default="", help="a secret only retrieval reads")
    a.add_argument(
        "--command",
        default="",
        help="stdio: the local server's command line (a trusted local server only)",
    )
    a.add_argument(
        "--env",
        action="append",
        default=[],
        help="stdio: NAME=VALUE, the server's environment (it gets no other)",
    )
    a.add_argument(
        "--env-file",
        action="append",
        default=[],
        help="stdio: NAME=PATH, a variable whose value is a secret file's content",
    )
    a.add_argument("--tool", action="append", default=[], help="a tool Writ exposes")
    a.add_argument(
        "--resource",
        action="append",
        default=[],
        help="NAME=URI: a resource Writ exposes, read as mcp:<server>/NAME",
    )
    a.add_argument(
        "--facts",
        action="append",
        default=[],
        help="KIND=TOOL: the tool previews read a host record with",
    )
    a.add_argument(
        "--transport",
        default="auto",
        choices=["auto", "streamable_http", "sse", "stdio"],
        help="auto: Streamable HTTP, falling back to legacy HTTP+SSE on a 4xx; stdio: a "
        "local server run by retrieval (--command)",
    )
    a.add_argument(
        "--auth",
        default="bearer",
        choices=["bearer", "client_credentials"],
        help="client_credentials: the credential file is JSON {client_id, "
        "client_secret, token_url[, scope]}",
    )
    a.add_argument(
        "--auth-origin",
        action="append",
        default=[],
        help="client_credentials: an origin (scheme://host[:port]) besides the server's own "
        "where its authorization metadata and server may be",
    )
    m2 = m.add_parser(
        "list",
        help="list the server's tools now (journaled), with each one's "
        "standing and the server's hints",
    )
    m2.add_argument("server")
    sh = m.add_parser(
        "show",
        help="list the server now and show one tool in full: description, parameters, "
        "annotations, digest, and a diff against what was classified",
    )
    sh.add_argument("server")
    sh.add_argument("tool")
    c = m.add_parser(
        "classify", help="classify a tool's family, bound to the digest you were shown"
    )
    c.add_argument("server")
    c.add_argument("tool")
    c.add_argument(
        "--digest",
        default=None,
        help="the digest `writ mcp show` printed (without it, the tool is shown now and "
        "what is shown is classified)",
    )
    c.add_argument(
        "--description",
        default="",
        help="your description of the tool for the model's catalog (the server's text "
        "never reaches the model's instructions)",
    )
    c.add_argument(
        "--family",
        required=True,
        choices=["read", "read_personal", "write_delete", "send_external", "execute_code"],
    )
    c.add_argument("--by", required=True, help="the operator who classified it")
    g = m.add_parser(
        "grant",
        help="an agent's standing grant for a tool (mcp:<server>/<tool>) or a server's tools "
        "(mcp:<server>/*) as classified now, pinned to their digests",
    )
    g.add_argument("source")
    g.add_argument("--agent", required=True)
    g.add_argument("--family", required=True, choices=["read", "read_personal", "write_delete"])
    g.add_argument("--by", required=True, help="the administrator who gives it")
    g.add_argument("--dsn", default="", help="the database (default: WRIT_DATABASE_URL)")
    p.set_defaults(func=_mcp)

    p = sub.add_parser("pending", help="decisions waiting for a person")
    _operator_args(p)
    p.set_defaults(func=_pending)

    p = sub.add_parser("decide", help="answer a pending decision as an approver")
    _operator_args(p)
    p.add_argument("pending_id")
    p.add_argument("answer", choices=["once", "always", "deny"])
    p.add_argument("--reason", default="")
    p.add_argument(
        "--proposal",
        default=None,
        help="the proposal the decision is about (required for one: `writ pending` shows it "
        "with its preview)",
    )
    p.add_argument("--token", default="", help="the approver's token (default: local demo key)")
    p.add_argument("--principal", default="ops@acme.example")
    p.set_defaults(func=_decide)

    for verb, answer, helptext in (
        ("approve", "approve", "approve a proposal by its id"),
        ("reject", "reject", "reject a proposal by its id"),
    ):
        p = sub.add_parser(verb, help=helptext)
        _operator_args(p)
        p.add_argument("proposal_id")
        p.add_argument("--reason", default="", required=answer == "reject")
        if answer == "approve":
            p.add_argument(
                "--always",
                action="store_true",
                help="also let this agent's calls of the family run without asking, where "
                "the decision offers it (never for money, access or sending outside)",
            )
        p.add_argument("--token", default="", help="the approver's token (default: local demo key)")
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
    from writ.whatif.cli import add_parsers as add_whatif

    add_whatif(pol)

    p = sub.add_parser("spend", help="a tenant's spend against its caps, per cap and window")
    _operator_args(p)
    p.add_argument("--cap", default=None, help="one cap only")
    p.add_argument("--agent", default=None, help="the caps of one agent only")
    p.add_argument("--window", choices=["day", "month"], default=None)
    p.set_defaults(func=_spend)

    p = sub.add_parser("prices", help="price tables and spend caps")
    pri = p.add_subparsers(dest="action", required=True)
    s = pri.add_parser("sign", help="sign a tenant's price table with the organisation's key")
    s.add_argument("input", help="the price table (JSON)")
    s.add_argument("--key", required=True, help="Ed25519 private key (PEM)")
    s.add_argument("--key-id", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(func=_prices_sign)
