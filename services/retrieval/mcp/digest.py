"""What a tool is, for the journal and the operator's classification: a digest of its name,
description and schemas (RFC 8785 canonical JSON, SHA-256). Annotations are not in it: they are
the server's hints, and changing them changes nothing Writ decides."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import rfc8785

__all__ = ["listing_digest", "tool_digest"]


def tool_digest(name: str, description: str, input_schema: Any, output_schema: Any) -> str:
    """The digest of one tool as listed."""
    return hashlib.sha256(
        rfc8785.dumps(
            {
                "name": name,
                "description": description,
                "input_schema": input_schema,
                "output_schema": output_schema,
            }
        )
    ).hexdigest()


def listing_digest(tools: Iterable[tuple[str, str]]) -> str:
    """The digest of a whole listing: its (name, tool digest) pairs, in name order."""
    return hashlib.sha256(rfc8785.dumps(sorted([n, d] for n, d in tools))).hexdigest()
