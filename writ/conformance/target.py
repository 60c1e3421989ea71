"""A running deployment the kit is pointed at (`writ conformance --target`), rather than one it
starts: where its parts are and the credentials to reach them, from arguments or environment.

The kit submits as the tenant's host (its credentials folder), reads Writ's journal from
PostgreSQL, reads and switches the providers through their control API (the fakes' own), and
kills the dispatcher by the pid it names when it holds a command at an armed point: so it runs
on the dispatcher's machine, and that dispatcher reads `faults_file` (`WRIT_FAULTS_FILE`) and is
restarted by the deployment's own supervisor (`writ run`'s, or a Deployment controller's).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

__all__ = ["ENV", "Target", "TargetError"]

# Each setting's argument and environment variable; an argument wins.
ENV: Final = {
    "nats_url": "WRIT_CONFORMANCE_NATS_URL",
    "database_url": "WRIT_CONFORMANCE_DATABASE_URL",
    "host_credentials": "WRIT_CONFORMANCE_HOST_CREDENTIALS",
    "crm_url": "WRIT_CONFORMANCE_CRM_URL",
    "payments_url": "WRIT_CONFORMANCE_PAYMENTS_URL",
    "faults_file": "WRIT_CONFORMANCE_FAULTS_FILE",
}
_MAX_URL_CHARS: Final = 2048
_SCHEMES: Final = {
    "nats_url": ("nats", "tls"),
    "database_url": ("postgresql", "postgres"),
    "crm_url": ("http", "https"),
    "payments_url": ("http", "https"),
}


class TargetError(ValueError):
    """The target's settings are incomplete or malformed (named, values never echoed)."""


@dataclass(frozen=True)
class Target:
    nats_url: str  # an administrator's URL, `user:password@` inside: results, reconcile
    database_url: str  # reads admission.commands and dispatcher.attempts
    host_credentials: Path  # the tenant's host folder (`writ tenant add`), named for it
    crm_url: str
    payments_url: str
    faults_file: Path  # the file the dispatcher reads as WRIT_FAULTS_FILE

    @property
    def tenant(self) -> str:
        return self.host_credentials.resolve().name

    @classmethod
    def read(cls, given: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Target:
        """The target from arguments (`given`, by setting name) over the environment."""
        found = {name: str(given.get(name) or environ.get(var, "")) for name, var in ENV.items()}
        missing = [f"--{n.replace('_', '-')} ({ENV[n]})" for n, v in found.items() if not v]
        if missing:
            raise TargetError("a target deployment needs " + ", ".join(missing))
        for name, schemes in _SCHEMES.items():
            value = found[name]
            if len(value) > _MAX_URL_CHARS or urlsplit(value).scheme not in schemes:
                raise TargetError(f"--{name.replace('_', '-')}: a {'|'.join(schemes)} URL")
        folder = Path(found["host_credentials"])
        if not (folder / "signing.pem").is_file() or not (folder / "nats.url").is_file():
            raise TargetError("--host-credentials: a host folder with signing.pem and nats.url")
        faults = Path(found["faults_file"])
        if not faults.is_file():
            raise TargetError("--faults-file: the dispatcher's WRIT_FAULTS_FILE, which must exist")
        return cls(
            nats_url=found["nats_url"],
            database_url=found["database_url"],
            host_credentials=folder,
            crm_url=found["crm_url"].rstrip("/"),
            payments_url=found["payments_url"].rstrip("/"),
            faults_file=faults,
        )
