"""`writ`: the command-line tool of operators and developers.

writ run                  start everything locally and run the demo (what `make run` does)
writ service <name>       run one service process (what a Kubernetes Deployment runs)
writ migrate              provision the service roles and apply migrations (--check [--wait])
writ nats provision       create or update every stream, durable consumer and KV bucket
writ schemas --write      regenerate the committed JSON Schemas and the OpenAPI/AsyncAPI files
writ token ...            mint a host token with a tenant's demo key (or --key)
writ tenant add|remove T  onboard or retire a tenant, live, on both doors
writ reconcile list       commands whose outcome nobody knows (`unknown`)
writ reconcile resolve    record what an operator established, with its evidence
writ pending              decisions waiting for a person
writ decide <id> <answer> answer one: once | always | deny (--proposal P for a proposal's)
writ approve <proposal>   approve a proposal by its id (what it does is what was shown; --always)
writ reject <proposal>    reject it, with --reason
writ review <id> <answer> answer a review a run asked for: approve | reject
writ policy sign          sign an organisation policy file
writ policy whatif        rule a candidate policy over the journaled decisions (record|verify)
writ audit verify         check every service's audit journal: chain, checkpoints, signatures
writ audit export         append the checkpoints recorded outside the database to a file
writ audit re-anchor      start a lost record again, signed, naming what was lost
writ retention show|apply  how long each tenant's payloads are kept; erase what is past
writ eval build|run|record  score a candidate model on a versioned set (writ/eval/)
writ audit replay RUN     walk a run's (or a chat session's turns') captured model responses
                          and tool outputs offline
writ conformance          kill the dispatcher at each boundary, K times per connector contract,
                          and count duplicates, losses and unknowns against the provider's
                          ledger (--endpoint URL: check a host endpoint's idempotency)
"""

from __future__ import annotations

import argparse
import sys

from writ.cli import _audit, _local, _operator, _receipts, _retention

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `writ` command."""
    parser = argparse.ArgumentParser(prog="writ", description="A governed runtime for AI agents")
    sub = parser.add_subparsers(dest="command", required=True)

    # The order is the order of `writ --help`.
    _local.add_service_parser(sub)
    from writ.migrate import add_parser as add_migrate

    add_migrate(sub)
    from writ.eval.cli import add_parser as add_eval

    add_eval(sub)
    _local.add_parsers(sub)
    _operator.add_parsers(sub)
    _audit.add_parsers(sub)
    _retention.add_parsers(sub)
    _receipts.add_parsers(sub)
    from writ.conformance import add_parser as add_conformance

    add_conformance(sub)

    args = parser.parse_args(argv)
    sys.exit(args.func(args))
