"""Base classes and bounded field types shared by every message on the bus."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

__all__ = [
    "AgentName",
    "Command",
    "Digest",
    "Family",
    "Event",
    "Id",
    "Message",
    "Principal",
    "ShortText",
    "Tenant",
    "Text",
    "Token",
]

# Every pattern ends in "(?!\n)$": msgspec matches with re.search, where a bare "$" also
# matches before a final newline ("acme\n" would pass); the lookahead keeps JSON Schema valid.
# Tenants and agents become NATS subject tokens and Postgres role-free identifiers: keep them
# to a small alphabet so no value can add a subject level or a wildcard.
Tenant = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]{0,62}(?!\n)$")]
AgentName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}(?!\n)$")]
Principal = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}(?!\n)$")]
Id = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}(?!\n)$")]
Digest = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}(?!\n)$")]
Token = Annotated[str, msgspec.Meta(min_length=1, max_length=8192)]
ShortText = Annotated[str, msgspec.Meta(max_length=512)]
Text = Annotated[str, msgspec.Meta(max_length=16384)]

MAX_MESSAGE_BYTES: Final = 64 * 1024


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """Config set here is inherited by every message."""


class Command(Message, forbid_unknown_fields=True, tag_field="type"):
    """Sent by a host or a model, or to exactly one inbox: unknown fields are an error."""


class Event(Message, tag_field="type"):
    """Fan-out between Writ's services: old consumers skip fields they don't know."""


# The action families governance classifies calls by (DESIGN.md §4).
Family = Literal["read", "read_personal", "write_delete", "send_external", "execute_code"]
