"""`writ conformance`: how many duplicates, losses and `unknown`s a crash leaves behind, counted
against the provider's own ledger (docs/conformance.md).

- `matrix.py`: for each connector contract kind (idempotent, reconcilable by lookup, none), K
  commands at each boundary where the dispatcher is killed, and a lost response; every
  command's journal row compared with the provider's ledger.
- `deployment.py`: the local deployment it runs on (the six services and the fake providers).
- `endpoint.py`: a host's own endpoint that claims an idempotency contract, checked by
  repeating each key.
- `run.py`: the command's entry points and report.
"""

from writ.conformance.run import add_parser

__all__ = ["add_parser"]
