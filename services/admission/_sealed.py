"""A proposal's arguments, preview and facts sealed under its run's journal window key
(`libs.journal.seal`), so expiry and erasure reach `admission.proposals` too."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import asyncpg
import msgspec

from libs.journal import (
    Expired,
    Journal,
    WindowKeys,
    column_aad,
    refresh,
    seal,
    unseal,
)

__all__ = ["SealedProposal", "open_payload", "seal_proposal", "window_keys"]


class SealedProposal(msgspec.Struct, frozen=True):
    """What `admission.proposals.sealed` holds."""

    arguments: dict[str, Any]
    preview: dict[str, Any]
    facts: Any = None


_DECODER = msgspec.json.Decoder(SealedProposal)


def window_keys(journal: Journal | None) -> WindowKeys | None:
    """The journal's keys if they key payloads by window."""
    keys = None if journal is None else journal.keys
    return keys if isinstance(keys, WindowKeys) else None


def _aad(tenant: str, proposal_id: str) -> bytes:
    return column_aad("admission.proposals", "sealed", f"{tenant}/{proposal_id}")


async def seal_proposal(
    journal: Journal | None,
    *,
    tenant: str,
    run_id: str,
    proposal_id: str,
    payload: SealedProposal,
) -> bytes | None:
    """The proposal's payload under its run's window key (None: no window keys)."""
    keys = window_keys(journal)
    if keys is None or journal is None:
        return None
    await journal.prepare(tenant, run_id)
    key_id = keys.key_for(tenant, datetime.now(UTC), run_id)
    return seal(keys, key_id, msgspec.json.encode(payload), _aad(tenant, proposal_id))


async def open_payload(
    conn: asyncpg.Connection | asyncpg.Pool,
    keys: WindowKeys | None,
    rows: list[dict[str, Any]],
) -> None:
    """Fill each row's `arguments`, `preview` and `facts` from its `sealed` blob (in place;
    JSON text, as the plain columns read), or mark it `expired` with the key id.

    Every key is read again: what a person or the service reads says expired once the key is
    destroyed, never answers from memory."""
    sealed = [r for r in rows if r.get("sealed") is not None]
    for r in rows:
        r.setdefault("expired", None)
    if not sealed:
        return
    if keys is None:
        raise ValueError("a sealed proposal needs admission's window keys to be read")
    if isinstance(conn, asyncpg.Pool):
        async with conn.acquire() as own:
            await refresh(own, keys, [r["sealed"] for r in sealed], again=True)
    else:
        await refresh(conn, keys, [r["sealed"] for r in sealed], again=True)
    for r in sealed:
        opened = unseal(keys, r["sealed"], _aad(r["tenant"], r["proposal_id"]))
        if isinstance(opened, Expired):
            r["expired"] = opened.key_id
            continue
        payload = _DECODER.decode(opened)
        r["arguments"] = json.dumps(payload.arguments)
        r["preview"] = json.dumps(payload.preview)
        if "facts" in r:
            r["facts"] = None if payload.facts is None else json.dumps(payload.facts)
