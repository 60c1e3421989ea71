"""`writ receipts keys|rotate|retire`: the approval receipts' keys of a `writ run` deployment."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["add_parsers"]


def _folders(args: argparse.Namespace) -> tuple[Path, Path]:
    home = Path(args.home)
    secrets, config = home / "secrets", home / "config"
    if not secrets.is_dir() or not config.is_dir():
        raise SystemExit(f"no deployment under {home} (start it once with `writ run`)")
    return secrets, config


def _keys(args: argparse.Namespace) -> int:
    from writ import receipt_keys

    _, config = _folders(args)
    print((config / receipt_keys.PUBLIC).read_text())
    return 0


def _rotate(args: argparse.Namespace) -> int:
    from writ import receipt_keys

    secrets, config = _folders(args)
    kid = receipt_keys.rotate(secrets, config)
    listed = [k["kid"] for k in json.loads((config / receipt_keys.PUBLIC).read_text())["keys"]]
    print(f"signing key now {kid}; published: {', '.join(listed)}")
    print("restart admission to sign with it; retire the old key once its receipts expired")
    return 0


def _retire(args: argparse.Namespace) -> int:
    from libs.journal import SigningKey
    from writ import receipt_keys

    secrets, config = _folders(args)
    signing = SigningKey.from_json((secrets / receipt_keys.SIGNING).read_text()).key_id
    if args.kid == signing:
        raise SystemExit(f"{args.kid} is the signing key: rotate first")
    receipt_keys.retire(config, args.kid)
    print(f"retired {args.kid}: receipts it signed no longer verify")
    return 0


def add_parsers(sub: Any) -> None:
    """`writ receipts keys`, `rotate` and `retire`."""
    p = sub.add_parser("receipts", help="the approval receipts' keys: list, rotate, retire")
    actions = p.add_subparsers(dest="receipts_command", required=True)
    for name, func, text in (
        ("keys", _keys, "print the published key set (JWKS)"),
        ("rotate", _rotate, "make a new signing key, published beside the old one"),
        ("retire", _retire, "stop publishing a key (its receipts stop verifying)"),
    ):
        q = actions.add_parser(name, help=text)
        q.add_argument("--home", default=".writ", help="writ run's folder (default: .writ)")
        if name == "retire":
            q.add_argument("kid", help="the key id to retire")
        q.set_defaults(func=func)
