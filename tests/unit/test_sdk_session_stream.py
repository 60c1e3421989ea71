"""The SDK's reading of a session's stream: SSE parsing within its bound, unknown event types
skipped (pure: a response body parsed, no server)."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from writ_client import WritError
from writ_client._session import MAX_EVENT_BYTES, decode_event, read_sse
from writ_client._wire.sessions import TurnStarted

pytestmark = pytest.mark.anyio


async def events(body: bytes) -> list[tuple[int, bytes]]:
    return [e async for e in read_sse(httpx.Response(200, content=body))]


async def test_events_with_ids_comments_skipped_and_multi_line_data() -> None:
    body = (
        b': keep-alive\n\nevent: TurnStarted\nid: 7\ndata: {"a":\ndata:  1}\n\n'
        b"id: 8\ndata: x\r\n\r\ndata: no id, not an event of the stream\n\n"
    )
    assert await events(body) == [(7, b'{"a":\n 1}'), (8, b"x")]


async def test_an_event_past_the_bound_or_a_bad_id_is_refused() -> None:
    with pytest.raises(WritError) as big:
        await events(b"id: 1\ndata: " + b"x" * MAX_EVENT_BYTES + b"\n\n")
    assert big.value.code == "INVALID_RESPONSE"
    with pytest.raises(WritError) as bad:
        await events(b"id: seven\ndata: x\n\n")
    assert bad.value.code == "INVALID_RESPONSE"


def test_known_events_decode_and_unknown_types_are_skipped() -> None:
    started = TurnStarted(session_id="ses-1", n=2, turn=1, run_id="ses-1-t1")
    assert decode_event(msgspec.json.encode(started)) == started
    assert decode_event(b'{"type": "SomethingNewer", "session_id": "ses-1", "n": 3}') is None
    with pytest.raises(msgspec.DecodeError):
        decode_event(b"not json")
