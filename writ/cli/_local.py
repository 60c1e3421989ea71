"""The commands of the local deployment and of development: `writ service`, `run`, `chat`,
`schemas`, `nats-auth`, `nats provision`, `token`, `console` and `tenant`."""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from pathlib import Path
from typing import Any

from writ.stack import SERVICES

__all__ = ["add_parsers", "add_service_parser"]


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
        print(
            mint_token(
                Path(args.key).read_bytes(),
                tenant=args.tenant,
                principal=args.principal,
                ttl_s=args.ttl,
                issuer=args.issuer or stack.issuer(args.tenant),
                **roles,
            )
        )
        return 0
    print(stack.token(args.tenant, args.principal, ttl_s=args.ttl, **roles))
    return 0


def _console(args: argparse.Namespace) -> int:
    from services.ingress.logic import SIGN_IN_WINDOW_S
    from writ.stack import Stack

    stack = Stack(Path(args.home))
    if args.operator:
        return _operator_link(stack, args)
    try:
        link = stack.console_link(
            tenant=args.tenant,
            principal=args.principal,
            roles=tuple(r for r in args.roles.split(",") if r),
            ttl_s=args.ttl,
        )
    except FileNotFoundError:
        print(f"no running Writ under {args.home} (start it with `make run`)", file=sys.stderr)
        return 1
    print(
        "Open this link once to sign in to the approval console, within "
        f"{SIGN_IN_WINDOW_S / 60:.0f} minutes (it expires then, and a second use is refused; "
        f"the session ends with the token, in {int(args.ttl)} s):\n{link}"
    )
    return 0


def _operator_link(stack: Any, args: argparse.Namespace) -> int:
    """`writ console --operator`: a link to the MCP pages, signed with the operators' key."""
    from services.ingress.console._operators import OperatorRefused
    from services.ingress.logic import SIGN_IN_WINDOW_S

    try:
        link = stack.operator_link(args.operator, tenant=args.tenant, ttl_s=args.ttl)
    except FileNotFoundError:
        print(f"no running Writ under {args.home} (start it with `make run`)", file=sys.stderr)
        return 1
    except OperatorRefused as exc:
        print(f"no link: {exc}", file=sys.stderr)
        return 2
    print(
        f"Open this link once to sign in as an operator of {args.tenant} (the MCP pages), "
        f"within {SIGN_IN_WINDOW_S / 60:.0f} minutes; the session ends in {int(args.ttl)} s:"
        f"\n{link}"
    )
    return 0


def _tenant(args: argparse.Namespace) -> int:
    """`writ tenant add|remove`: on the deployment under `--home`, live if it runs
    (writ/stack/_onboarding.py); with no deployment there, the registry alone."""
    import anyio

    from writ.stack import Stack
    from writ.stack._onboarding import offboard, onboard
    from writ.tenants import TenantError, add_tenant, remove_tenant

    home = Path(args.home)
    try:
        stack: Stack | None = Stack.attach(home)
    except FileNotFoundError:
        stack = None
    try:
        if args.action == "add":
            key = Path(args.public_key).read_text() if args.public_key else None
            if stack is None:
                if key is None:
                    print(
                        f"writ tenant: no deployment under {home}: pass --public-key to "
                        "register the key alone",
                        file=sys.stderr,
                    )
                    return 1
                issuer = add_tenant(
                    home, args.tenant, key, issuer=args.issuer, principals=args.principals
                )
                print(f"tenant {args.tenant} registered (issuer {issuer})")
                return 0
            done = anyio.run(
                functools.partial(
                    onboard,
                    stack,
                    args.tenant,
                    public_key_pem=key,
                    issuer=args.issuer,
                    principals=args.principals,
                )
            )
            when = "within seconds, no restart" if done.live else "when the deployment starts"
            print(
                f"tenant {args.tenant} added (issuer {done.issuer}); served on both doors "
                f"{when}. Its host's credentials: {done.credentials}"
            )
        elif stack is None:
            remove_tenant(home, args.tenant)
            print(f"tenant {args.tenant} removed")
        else:
            deleted = anyio.run(offboard, stack, args.tenant)
            print(
                f"tenant {args.tenant} removed: its tokens and NATS user are refused, "
                f"its streams deleted ({', '.join(deleted) or 'none'}) and its host's "
                "credentials with them"
            )
    except (TenantError, OSError) as exc:
        print(f"writ tenant: {exc}", file=sys.stderr)
        return 1
    return 0


def _nats_auth(args: argparse.Namespace) -> int:
    """Print the nats-server `accounts` block for these tenants (libs/natsauth.py),
    generating the users' password files that do not exist yet."""
    from libs.natsauth import auth_config, ensure_passwords

    folder = Path(args.passwords)
    folder.mkdir(parents=True, exist_ok=True)
    tenants = args.tenant or ["acme"]
    print(auth_config(ensure_passwords(folder, tenants), tenants), end="")
    return 0


def _nats_provision(args: argparse.Namespace) -> int:
    """Create or update every stream, durable consumer and bucket (libs/provision.py), as the
    NATS user `provision`; idempotent."""
    import json

    import anyio
    import nats

    from libs.natsauth import PROVISION, PROVISION_AUDIT
    from libs.provision import provision_bus, provision_record
    from libs.settings import read_secret

    url = args.url or os.environ.get("WRIT_NATS_URL", "")
    if not url:
        print("writ nats provision: no --url and no WRIT_NATS_URL", file=sys.stderr)
        return 2
    tenants = set(args.tenant)
    if args.tenant_keys:
        tenants |= set(json.loads(Path(args.tenant_keys).read_text()))
    password_file = args.password_file or os.environ.get("WRIT_NATS_PASSWORD_FILE", "")
    options = {"user": args.user, "password": read_secret(password_file)} if password_file else {}
    # The audit record is in an account of its own, provisioned by that account's identity.
    audit_file = args.audit_password_file or os.environ.get("WRIT_AUDIT_NATS_PASSWORD_FILE", "")
    if password_file and not audit_file:
        print(
            "writ nats provision: no --audit-password-file and no WRIT_AUDIT_NATS_PASSWORD_FILE "
            f"(the password of {PROVISION_AUDIT}, who provisions the audit record)",
            file=sys.stderr,
        )
        return 2
    audit = {"user": PROVISION_AUDIT, "password": read_secret(audit_file)} if audit_file else {}

    async def provision() -> None:
        nc = await nats.connect(url, inbox_prefix=f"_INBOX.{args.user}", **options)
        try:
            await provision_bus(
                nc.jetstream(),
                sorted(tenants),
                replicas=args.replicas,
                duplicate_window_s=args.duplicate_window_s,
                dispatcher_lease_s=args.lease_s,
            )
        finally:
            await nc.close()
        nc = await nats.connect(url, inbox_prefix=f"_INBOX.{PROVISION_AUDIT}", **audit)
        try:
            await provision_record(nc.jetstream(), replicas=args.replicas)
        finally:
            await nc.close()

    anyio.run(provision)
    print(f"bus provisioned for {len(tenants)} tenants (as {args.user or PROVISION})")
    return 0


def add_service_parser(sub: Any) -> None:
    """`writ service <name>`."""
    p = sub.add_parser("service", help="run one service process")
    p.add_argument("name", choices=SERVICES)
    p.set_defaults(func=_service)


def add_parsers(sub: Any) -> None:
    """`writ run`, `chat`, `schemas`, `nats-auth`, `nats provision`, `token`, `console`,
    `tenant`."""
    p = sub.add_parser("run", help="start Writ locally and run the demo request")
    p.add_argument("--home", default=".writ", help="data folder (default: .writ)")
    p.add_argument("--once", action="store_true", help="stop after the demo run")
    p.set_defaults(func=_run)

    p = sub.add_parser("chat", help="chat with an agent in the terminal (a session over HTTP)")
    p.add_argument("agent")
    p.add_argument("--home", default=".writ", help="writ run's folder: API port, demo keys")
    p.add_argument(
        "--url", default="", help="the API's base URL (default: WRIT_API_URL, or writ run's)"
    )
    p.add_argument("--tenant", default="acme")
    p.add_argument("--principal", default="alice@acme.example")
    p.add_argument("--key", default="", help="the tenant's host key (PEM) if not a demo one")
    p.add_argument("--issuer", default="", help="the issuer registered for the tenant")
    p.add_argument("--plan-mode", action="store_true", help="plans first, for your approval")
    p.add_argument("--session", default="", help="go on with the session of that id instead")
    p.add_argument(
        "--roles",
        default="",
        help="comma-separated roles of the token (approver: answer the decisions the chat asks)",
    )
    p.set_defaults(func=_chat)

    p = sub.add_parser("schemas", help="check (default) or --write the committed JSON Schemas")
    p.add_argument("--write", action="store_true")
    p.set_defaults(func=_schemas)

    p = sub.add_parser(
        "nats-auth", help="print NATS accounts, users and permissions for a deployment"
    )
    p.add_argument("--tenant", action="append", default=[], help="a tenant (repeat for more)")
    p.add_argument(
        "--passwords",
        required=True,
        help="folder of the users' password files (missing ones are generated)",
    )
    p.set_defaults(func=_nats_auth)

    p = sub.add_parser("nats", help="the bus: `provision` its streams, consumers and buckets")
    nats_sub = p.add_subparsers(dest="action", required=True)
    prov = nats_sub.add_parser(
        "provision", help="create or update every stream, durable consumer and bucket"
    )
    prov.add_argument("--url", default="", help="the NATS server (default: WRIT_NATS_URL)")
    prov.add_argument("--user", default="provision", help="provisioning's NATS user")
    prov.add_argument(
        "--password-file", default="", help="its password (default: WRIT_NATS_PASSWORD_FILE)"
    )
    prov.add_argument(
        "--audit-password-file",
        default="",
        help="the audit record's provisioning user's password (default: "
        "WRIT_AUDIT_NATS_PASSWORD_FILE)",
    )
    prov.add_argument("--tenant", action="append", default=[], help="a tenant (repeat for more)")
    prov.add_argument("--tenant-keys", default="", help="a tenant keys file: each of its tenants")
    prov.add_argument(
        "--replicas",
        type=int,
        default=int(os.environ.get("WRIT_STREAM_REPLICAS", "1")),
        help="replicas of every stream and bucket (default: WRIT_STREAM_REPLICAS, or 1)",
    )
    prov.add_argument(
        "--duplicate-window-s",
        type=float,
        default=float(os.environ.get("WRIT_DUPLICATE_WINDOW_S", "0")),
        help="Nats-Msg-Id dedupe window of Writ's streams (0: schemas/subjects.py's)",
    )
    prov.add_argument(
        "--lease-s",
        type=float,
        default=float(os.environ.get("WRIT_LEASE_S", "30")),
        help="the dispatcher's lease: its consumer's ack wait (default: WRIT_LEASE_S, or 30)",
    )
    prov.set_defaults(func=_nats_provision)
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
    p.add_argument(
        "--operator",
        default="",
        metavar="PRINCIPAL",
        help="a link for this operator instead (the MCP pages), signed with the deployment's "
        "operators' key",
    )
    p.set_defaults(func=_console)

    p = sub.add_parser("tenant", help="register (or remove) a tenant and its issuer's key")
    p.add_argument("--home", default=".writ")
    ten = p.add_subparsers(dest="action", required=True)
    add = ten.add_parser(
        "add",
        help="a tenant: its NATS user and account, streams, issuer key and host credentials",
    )
    add.add_argument("tenant")
    add.add_argument(
        "--public-key",
        default="",
        help="a file holding its issuer's Ed25519 public key (PEM); without it Writ makes the "
        "key pair and puts the private key in the host's credentials (hosts/<tenant>/)",
    )
    add.add_argument(
        "--issuer",
        default="",
        help="the `iss` its tokens carry (default https://<tenant>.example/host)",
    )
    add.add_argument(
        "--principals",
        default="exact",
        choices=["exact", "email"],
        help="email: its principals are e-mail addresses, one person whatever their case "
        "(maker-checker, grants and the journal compare them case-folded)",
    )
    rm = ten.add_parser(
        "remove",
        help="retire a tenant: its tokens and NATS user refused, its streams and credentials "
        "deleted",
    )
    rm.add_argument("tenant")
    p.set_defaults(func=_tenant)
