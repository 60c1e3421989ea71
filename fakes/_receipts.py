"""How the fakes check Writ's approval receipts, as a system of record would (docs/receipts.md).

A fake given a key set (`--receipt-keys-file`, a JWKS) refuses a write whose `Writ-Authorization`
receipt is missing, forged, expired, for another body or issued for another operation id than
the request's idempotency key (`<tenant>:<operation_id>`) names: 403 with a typed `reason`.
Without a key set it checks nothing (a fake used on its own, outside a deployment). A receipt
naming a key it does not know makes it read the key set again once, as a verifier refetches a
JWKS on an unknown `kid` during a rotation.
"""

from __future__ import annotations

import threading
from pathlib import Path

from writ_client.receipts import HEADER, KeySet, Receipt, ReceiptRefused, verify

__all__ = ["HEADER", "KeyFile", "ReceiptRefused", "load"]


class KeyFile:
    """A JWKS file and the key set last read from it."""

    def __init__(self, path: Path) -> None:
        self._path, self._lock = path, threading.Lock()
        self._keys = KeySet.from_jwks(path.read_bytes())

    def check(self, receipt: str | None, body: bytes, key: str) -> Receipt:
        """The receipt's claims if it authorises `body` under idempotency key `key`.

        Raises:
            ReceiptRefused: it does not.
        """
        tenant, _, operation_id = key.rpartition(":")
        try:
            return verify(receipt, body, self._keys, tenant=tenant, operation_id=operation_id)
        except ReceiptRefused as exc:
            if exc.reason != "unknown_key":
                raise
        with self._lock:
            self._keys = KeySet.from_jwks(self._path.read_bytes())
        return verify(receipt, body, self._keys, tenant=tenant, operation_id=operation_id)


def load(path: Path | None) -> KeyFile | None:
    """The key set in `path` (a JWKS), or None when no file is given."""
    return None if path is None else KeyFile(path)
