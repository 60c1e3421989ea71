# A copy of schemas/base.py made by clients/python/copy_wire.py: do not edit.
"""Base classes and bounded field types shared by every message on the bus."""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

import msgspec

__all__ = [
    "ID_PATTERN",
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
    "refuse_unstorable",
    "storable",
    "unstorable_at",
]

# Every pattern ends in "(?!\n)$": msgspec matches with re.search, where a bare "$" also
# matches before a final newline ("acme\n" would pass); the lookahead keeps JSON Schema valid.
# Tenants and agents become NATS subject tokens and Postgres role-free identifiers: keep them
# to a small alphabet so no value can add a subject level or a wildcard.
Tenant = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]{0,62}(?!\n)$")]
AgentName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}(?!\n)$")]
Principal = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}(?!\n)$")]
ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}(?!\n)$"
Id = Annotated[str, msgspec.Meta(pattern=ID_PATTERN)]
Digest = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}(?!\n)$")]
Token = Annotated[str, msgspec.Meta(min_length=1, max_length=8192)]
ShortText = Annotated[str, msgspec.Meta(max_length=512)]
Text = Annotated[str, msgspec.Meta(max_length=16384)]

MAX_MESSAGE_BYTES: Final = 64 * 1024


# What PostgreSQL's text (and jsonb) cannot hold: U+0000, and UTF-16 surrogates, which have no
# UTF-8 encoding (msgspec's JSON decoder refuses a lone one; Python's `json`, used by HTTP
# clients, does not).
_UNSTORABLE: Final = re.compile("[\x00\ud800-\udfff]")


_ENCODER: Final = msgspec.json.Encoder()


def unstorable_at(value: Any, path: str = "$") -> str | None:
    """The path (`$.arguments.body`) of the first string in `value` (a Struct, dict, list or
    string, walked whole, keys included) that text cannot store, or None."""
    try:
        # The common case at C speed: msgspec writes U+0000 as \u0000 and cannot encode a
        # surrogate at all; only a hit (or a literal backslash-u0000) walks the value.
        if b"\\u0000" not in _ENCODER.encode(value):
            return None
    except (UnicodeEncodeError, TypeError):
        pass
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item) is not None:
                return where
        elif isinstance(item, msgspec.Struct):
            for name in item.__struct_fields__:
                stack.append((getattr(item, name), f"{where}.{name}"))
        elif isinstance(item, dict):
            for key, sub in item.items():
                if isinstance(key, str) and _UNSTORABLE.search(key) is not None:
                    return f"{where} (a key)"
                stack.append((sub, f"{where}.{key}"))
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend((sub, f"{where}[{i}]") for i, sub in enumerate(item))
    return None


def refuse_unstorable(struct: msgspec.Struct) -> None:
    """Raise ValueError naming the first field of `struct` whose text cannot be stored.

    Called from `__post_init__`, so msgspec turns it into a `ValidationError` at decoding:
    the message is refused where it enters, like any other invalid field, before anything is
    stored or forwarded.
    """
    where = unstorable_at(struct)
    if where is not None:
        raise ValueError(f"`{where}` holds U+0000 or a UTF-16 surrogate, which Writ cannot store")


def storable(text: str) -> str:
    """`text` with what text cannot store replaced by U+FFFD: for what Writ must keep even so
    (a provider's receipt of an effect that happened)."""
    return _UNSTORABLE.sub("\ufffd", text)


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """Config set here is inherited by every message."""


class Command(Message, forbid_unknown_fields=True, tag_field="type", frozen=True):
    """Sent by a host or a model, or to exactly one inbox: unknown fields are an error, and so
    is text PostgreSQL cannot store (U+0000, surrogates) anywhere in it."""

    def __post_init__(self) -> None:
        refuse_unstorable(self)


class Event(Message, tag_field="type", frozen=True):
    """Fan-out between Writ's services: old consumers skip fields they don't know."""


# The action families governance classifies calls by (docs/design.md §4).
Family = Literal["read", "read_personal", "write_delete", "send_external", "execute_code"]
