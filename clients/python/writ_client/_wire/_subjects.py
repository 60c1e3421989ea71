# A copy of schemas/_subjects.py made by clients/python/copy_wire.py: do not edit.
"""What `schemas/subjects.py`'s table is made of and what is derived from it without its rows:
a `Subject` (its filter, its prefix, the subject its parameters give), the table itself and how a
row is declared, a durable consumer's filters (`inbox`), a stream's spec, and the names of
tenants and their streams. The rows, and every subject literal, are in `schemas/subjects.py`,
which re-exports all of this.
"""

from __future__ import annotations

import re
from typing import Final, Literal

import msgspec

__all__ = [
    "TABLE",
    "TENANT_PATTERN",
    "Kind",
    "StreamSpec",
    "Subject",
    "declare",
    "endpoint",
    "in_stream",
    "inbox",
    "out_stream",
    "valid_tenant",
]

# stream: stored in a JetStream stream and read by durable (or ordered) consumers;
# request: a request/reply endpoint, answered by its handler;
# event: core NATS, in no stream (progress only: nothing depends on it).
Kind = Literal["stream", "request", "event"]
_PARAM: Final = re.compile(r"\{([a-z_]+)\}")


class Subject(msgspec.Struct, frozen=True):
    """One subject (or family of subjects, one per value of its parameters) of the bus.

    `pattern` names its parameters in braces, as AsyncAPI addresses do
    (`writ.in.requests.{tenant}`); `handlers` are the services (or the host, `host`) that
    consume or answer it; calling it with the parameters' values, in order, gives the subject.
    """

    pattern: str
    kind: Kind
    handlers: tuple[str, ...]
    meaning: str

    @property
    def params(self) -> tuple[str, ...]:
        """The parameters' names, in the order the pattern names them."""
        return tuple(_PARAM.findall(self.pattern))

    @property
    def filter(self) -> str:
        """Every subject of the family: each parameter a `*` wildcard."""
        return _PARAM.sub("*", self.pattern)

    @property
    def prefix(self) -> str:
        """What every subject of the family starts with (the pattern up to its first
        parameter)."""
        return self.pattern.split("{", 1)[0]

    def __call__(self, *values: str) -> str:
        names = self.params
        if len(values) != len(names):
            raise TypeError(f"{self.pattern} takes {len(names)} values, got {len(values)}")
        return self.pattern.format(**dict(zip(names, values, strict=True)))


# name -> its subject. The order is the order of the consumers' filters (`inbox`).
TABLE: Final[dict[str, Subject]] = {}


def declare(
    name: str, pattern: str, kind: Kind, handlers: tuple[str, ...], meaning: str
) -> Subject:
    """Add a row to the table: a subject (or family) named once, with one pattern."""
    if name in TABLE or any(s.pattern == pattern for s in TABLE.values()):
        raise ValueError(f"subject {name} ({pattern}) declared twice")
    TABLE[name] = subject = Subject(pattern, kind, handlers, meaning)
    return subject


def endpoint(name: str, pattern: str, handler: str, meaning: str) -> str:
    """Add a request/reply endpoint answered by `handler`; its subject."""
    return declare(name, pattern, "request", (handler,), meaning).pattern


def inbox(durable: str) -> tuple[str, ...]:
    """The filters of a durable consumer: every stream subject `durable` handles."""
    return tuple(s.filter for s in TABLE.values() if s.kind == "stream" and durable in s.handlers)


class StreamSpec(msgspec.Struct, frozen=True):
    """A JetStream stream Writ declares at start-up.

    `append_only`: the stream refuses deleting a message, purging and rollups (deny_delete,
    deny_purge, no rollup headers), and the server refuses any update that lifts either denial.
    """

    name: str
    subjects: tuple[str, ...]
    max_age_s: float
    duplicate_window_s: float = 120.0
    append_only: bool = False


# A tenant is one subject token and part of stream names: letters, digits, `_` and `-`.
TENANT_PATTERN: Final = r"^[A-Za-z0-9_-]{1,64}$"
_TENANT = re.compile(TENANT_PATTERN)


def valid_tenant(tenant: str) -> bool:
    """Whether `tenant` can name subjects and streams (one token, no wildcard, no dot)."""
    return _TENANT.match(tenant) is not None


def in_stream(tenant: str) -> str:
    """The stream of one tenant's host messages (`writ.in.<kind>.<tenant>`)."""
    return f"WRIT_IN_{tenant}"


def out_stream(tenant: str) -> str:
    """The stream of one tenant's results (`writ.out.results.<tenant>`)."""
    return f"WRIT_OUT_{tenant}"
