"""Typed settings from `WRIT_*` environment variables, and secrets from files.

Only a service's `__main__` reads the environment; everything below it gets typed settings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, TypeVar

import msgspec

from libs.errors import ConfigError

__all__ = ["BaseSettings", "load_settings", "read_secret"]

PREFIX = "WRIT_"
S = TypeVar("S", bound="BaseSettings")


class BaseSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """What every service process needs: the bus, its metrics port, and how long to drain."""

    nats_url: str
    # The NATS user this process connects as and the file holding its password (libs/natsauth.py);
    # empty: a server without authentication.
    nats_user: str = ""
    nats_password_file: str = ""
    # A journaled service's sealer connects again, as its own user (`seal-<service>`, in an
    # account of its own that reaches only its journal's record): the file of its password.
    seal_nats_password_file: str = ""
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    metrics_port_file: str = ""
    faults_file: str = ""  # tests only: see libs/faults.py
    otel_spans_file: str = ""  # append finished spans as JSON lines to `<this>.<instance>`
    # JetStream's Nats-Msg-Id dedupe horizon of Writ's streams (0: the defaults of
    # schemas/subjects.py), which provisioning sets (`writ nats provision` reads the same
    # variable; a service declares nothing). The fault suite shortens it to outlive it.
    duplicate_window_s: float = 0.0
    # Replicas of Writ's streams and buckets, which provisioning sets (`writ nats provision`
    # reads the same variable): 3 in production (a three-node JetStream cluster across zones),
    # 1 for the embedded single server.
    stream_replicas: int = 1
    drain_timeout_s: float = 10.0
    # The longest a retried delivery waits before its next try (0.25 s doubling up to this):
    # how soon a waiting message notices a dependency is back. The outage test shortens it.
    retry_backoff_max_s: float = 30.0
    # How long a delivery waiting out an unavailable Writ service may wait, from when its message
    # was stored, before it is dead-lettered as `outage_exhausted` (WritOutageLimitReached).
    outage_limit_s: float = 900.0
    # `/readyz`: how often NATS, the consumers and PostgreSQL are checked, and for how long;
    # `/livez` fails once the event loop or a fetch loop has not gone round for `live_stale_s`.
    health_every_s: float = 2.0
    health_timeout_s: float = 2.0
    live_stale_s: float = 30.0
    instance: str = ""
    # The event loop under asyncio: uvloop (libuv) spends less CPU per socket read and write,
    # most of what a service does per message and statement (docs/benchmarks.md); `asyncio`
    # is the standard library's, where uvloop cannot be installed.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"


def load_settings(cls: type[S], environ: Mapping[str, str] | None = None) -> S:
    """Decode `WRIT_<FIELD>` variables into `cls`; unrelated variables are ignored.

    A service's settings type names every setting it can see, so a credential meant for
    another service has no field to land in.
    """
    env = os.environ if environ is None else environ
    fields = {f.encode_name for f in msgspec.structs.fields(cls)}
    raw = {}
    for key, value in env.items():
        if key.startswith(PREFIX):
            name = key[len(PREFIX) :].lower()
            if name in fields:
                raw[name] = value
    try:
        return msgspec.convert(raw, cls, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid {PREFIX}* settings for {cls.__name__}: {exc}") from exc


def read_secret(path: str | Path) -> str:
    """Read a secret mounted as a file (a Kubernetes secret), without its trailing newline."""
    try:
        return Path(path).read_text().rstrip("\r\n")
    except OSError as exc:
        raise ConfigError(f"cannot read secret file {path}: {exc.strerror}") from exc
