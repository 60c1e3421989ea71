"""The read tools retrieval executes: one entry per tool in `TOOLS`.

A tool's contract (name, description, governance family, closed argument struct) is in
`schemas.retrieval.READ_TOOLS`, shared with governance (which classifies by family) and the
planner (which shows the catalog to a model). Here each contract gets its executor. Adding a read
tool: its arguments struct and `ReadToolSpec` there, its executor and entry here, a test.

An executor gets the tenant from the request, never from the arguments, and every store query
binds it. What it returns is untrusted content.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec

from schemas.retrieval import (
    MAX_READ_ITEMS,
    READ_TOOLS,
    CustomerGet,
    DocumentsSearch,
    ReadItem,
    ReadToolSpec,
)
from services.retrieval.store import RetrievalStore

__all__ = [
    "SNIPPET_CHARS",
    "TOOLS",
    "InvalidArguments",
    "ReadTool",
    "ToolOutput",
    "decode_arguments",
    "first_argument",
]

# A model reads excerpts, not whole documents: long bodies are cut (and the result says so).
SNIPPET_CHARS: Final = 1200
_NOTES_CHARS: Final = 2000
_FIELD_CHARS: Final = 512


class InvalidArguments(ValueError):
    """The arguments do not decode into the tool's closed struct; safe to show the model."""


class ToolOutput(msgspec.Struct, frozen=True, kw_only=True):
    """What an executor returns."""

    items: list[ReadItem]
    truncated: bool = False


Executor = Callable[[RetrievalStore, str, Any], Awaitable[ToolOutput]]


class ReadTool(msgspec.Struct, frozen=True, kw_only=True):
    """A read tool: its shared contract and the code that executes it."""

    spec: ReadToolSpec
    execute: Executor


def decode_arguments(spec: ReadToolSpec, arguments: dict[str, Any]) -> Any:
    """The arguments as the tool's closed struct (unknown fields, e.g. `tenant`, refuse)."""
    try:
        return msgspec.convert(arguments, spec.arguments, strict=True)
    except msgspec.ValidationError as exc:
        raise InvalidArguments(f"{spec.name}: {exc}"[:500]) from exc


def first_argument(arguments: msgspec.Struct) -> str:
    """What governance's fine rules match a prefix of: the struct's first field, as text."""
    values = msgspec.structs.astuple(arguments)
    return str(values[0])[:512] if values else ""


async def _documents_search(
    store: RetrievalStore, tenant: str, args: DocumentsSearch
) -> ToolOutput:
    page = await store.search_page(
        tenant, args.query, limit=min(args.limit, MAX_READ_ITEMS), snippet_chars=SNIPPET_CHARS
    )
    return ToolOutput(
        items=[
            ReadItem(id=e.document_id, kind=e.kind, title=e.title, text=e.text, rank=e.rank)
            for e in page.evidence
        ],
        truncated=page.truncated,
    )


async def _customer_get(store: RetrievalStore, tenant: str, args: CustomerGet) -> ToolOutput:
    # Another tenant's customer and no customer at all look the same: nothing.
    record = await store.customer(tenant, args.customer_id)
    if record is None:
        return ToolOutput(items=[])
    fields = {"owner": record.owner, "email": record.email, "status": record.status}
    return ToolOutput(
        items=[
            ReadItem(
                id=record.customer_id,
                kind="customer_record",
                title=record.name[:_FIELD_CHARS],
                text=record.notes[:_NOTES_CHARS],
                fields={k: v[:_FIELD_CHARS] for k, v in fields.items()},
            )
        ],
        truncated=len(record.notes) > _NOTES_CHARS
        or any(len(v) > _FIELD_CHARS for v in (record.name, *fields.values())),
    )


_EXECUTORS: Final[dict[str, Executor]] = {
    "documents.search": _documents_search,
    "crm.customer.get": _customer_get,
}

TOOLS: Final[dict[str, ReadTool]] = {
    name: ReadTool(spec=spec, execute=_EXECUTORS[name]) for name, spec in READ_TOOLS.items()
}
