"""The fake model server, driven over real HTTP on loopback."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakes.llm import MALFORMED_CONTENT, REFUSAL, FakeLlm

TOKEN = "sk-fake-token"
ROOT = Path(__file__).resolve().parents[2]
REQUEST = {"model": "fake-1", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def llm() -> Iterator[FakeLlm]:
    with FakeLlm(token=TOKEN) as server:
        yield server


@pytest.fixture
def client(llm: FakeLlm) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=llm.url, headers=headers, timeout=5) as c:
        yield c


def complete(client: httpx.Client, body: Any = REQUEST, **headers: str) -> httpx.Response:
    return client.post("/v1/chat/completions", json=body, headers=headers)


def script(client: httpx.Client, *replies: dict[str, Any]) -> httpx.Response:
    return client.post("/_control/replies", json={"replies": list(replies)})


def set_mode(
    client: httpx.Client, mode: str, count: int | None = None, delay_s: float = 0.0
) -> None:
    r = client.post("/_control/mode", json={"mode": mode, "count": count, "delay_s": delay_s})
    assert r.status_code == 200, r.text


def recorded(client: httpx.Client) -> list[dict[str, Any]]:
    return client.get("/_control/requests").json()


def message(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_scripted_reply_has_the_openai_shape(client: httpx.Client) -> None:
    assert script(client, {"content": "hello"}).json() == {"queued": 1}
    r = complete(client)
    assert r.status_code == 200 and r.headers["x-request-id"] == "req_fake_1"
    body = r.json()
    assert body["id"] == "chatcmpl-fake-1" and body["object"] == "chat.completion"
    assert isinstance(body["created"], int) and body["model"] == "fake-1"
    assert body["choices"] == [
        {
            "index": 0,
            "logprobs": None,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "hello", "refusal": None},
        }
    ]
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


def test_replies_are_served_in_order_then_the_script_runs_out(client: httpx.Client) -> None:
    script(client, {"content": "one"}, {"content": "two"})
    assert [message(complete(client))["content"] for _ in range(2)] == ["one", "two"]
    r = complete(client)
    assert (r.status_code, r.json()) == (500, {"error": "no scripted reply left"})


def test_tool_calls_reply(client: httpx.Client) -> None:
    script(client, {"tool_calls": [{"name": "crm_note_create", "arguments": '{"a": 1}'}]})
    r = complete(client)
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert message(r)["tool_calls"] == [
        {
            "id": "call_1_0",
            "type": "function",
            "function": {"name": "crm_note_create", "arguments": '{"a": 1}'},
        }
    ]


def test_requests_are_recorded_with_their_authorization(llm: FakeLlm, client: httpx.Client) -> None:
    script(client, {"content": "x"})
    complete(client)
    with httpx.Client(base_url=llm.url) as anon:
        assert complete(anon, Authorization="Bearer wrong").status_code == 401
    first, second = recorded(client)
    assert first["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert first["body"] == REQUEST
    assert second["headers"]["authorization"] == "Bearer wrong"
    assert client.get("/_control/calls").json() == {"calls": 2}


def test_bad_token_uses_up_neither_reply_nor_mode(llm: FakeLlm, client: httpx.Client) -> None:
    script(client, {"content": "kept"})
    set_mode(client, "error", count=1)
    with httpx.Client(base_url=llm.url) as anon:
        assert complete(anon).status_code == 401
    assert complete(client).status_code == 500
    assert message(complete(client))["content"] == "kept"


@pytest.mark.parametrize(
    "body", [{"messages": [{"role": "user"}]}, {"model": "m"}, {"model": "m", "messages": []}, [1]]
)
def test_bad_request_is_400(client: httpx.Client, body: Any) -> None:
    script(client, {"content": "kept"})
    assert complete(client, body).status_code == 400
    assert message(complete(client))["content"] == "kept"


def test_malformed_and_refuse_modes_leave_the_script_alone(client: httpx.Client) -> None:
    script(client, {"content": "kept"})
    set_mode(client, "malformed", count=1)
    assert message(complete(client))["content"] == MALFORMED_CONTENT
    set_mode(client, "refuse", count=1)
    assert message(complete(client)) == {"role": "assistant", "content": None, "refusal": REFUSAL}
    assert message(complete(client))["content"] == "kept"


def test_rate_limit_sends_retry_after_then_recovers(client: httpx.Client) -> None:
    script(client, {"content": "x"})
    set_mode(client, "rate_limit", count=1, delay_s=7)
    r = complete(client)
    assert (r.status_code, r.headers["Retry-After"]) == (429, "7")
    assert complete(client).status_code == 200


@pytest.mark.parametrize("mode,status", [("error", 500), ("fail", 503)])
def test_error_modes(client: httpx.Client, mode: str, status: int) -> None:
    set_mode(client, mode)
    assert [complete(client).status_code for _ in range(2)] == [status, status]


def test_slow_mode_delays_the_answer(client: httpx.Client) -> None:
    script(client, {"content": "x"})
    set_mode(client, "slow", count=1, delay_s=0.3)
    started = time.monotonic()
    assert complete(client).status_code == 200
    assert time.monotonic() - started >= 0.3


def test_lose_response_uses_up_the_reply_and_hangs_up(client: httpx.Client) -> None:
    script(client, {"content": "lost"}, {"content": "next"})
    set_mode(client, "lose_response", count=1)
    with pytest.raises(httpx.RemoteProtocolError):
        complete(client)
    assert message(complete(client))["content"] == "next"


def _asking(text: str) -> dict[str, Any]:
    return {
        "model": "fake-1",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}],
    }


def test_rules_answer_by_what_the_messages_hold_once_the_script_is_used_up(
    client: httpx.Client,
) -> None:
    rules = [
        {"when": ["note", "first"], "reply": {"content": "write it ({{serial}})"}},
        {"when": ["note"], "unless": ["first"], "reply": {"content": "done {{serial}}"}},
    ]
    assert client.post("/_control/rules", json={"rules": rules}).json() == {"rules": 2}
    script(client, {"content": "scripted"})
    assert message(complete(client, _asking("a first note")))["content"] == "scripted"
    assert message(complete(client, _asking("a first note")))["content"] == "write it (2)"
    assert message(complete(client, _asking("the note again")))["content"] == "done 3"
    missed = complete(client, _asking("nothing matches"))
    assert missed.status_code == 500 and missed.json() == {"error": "no scripted reply left"}
    # Each request is logged with its arrival time and the serial that answered it.
    log = recorded(client)
    assert [r["serial"] for r in log] == [1, 2, 3, None]
    assert all(isinstance(r["at"], float) for r in log)
    assert log[0]["at"] <= log[1]["at"] <= log[2]["at"]


def test_a_lost_answer_is_logged_without_a_serial(client: httpx.Client) -> None:
    rules = [{"reply": {"content": "answer {{serial}}"}}]
    client.post("/_control/rules", json={"rules": rules}).raise_for_status()
    set_mode(client, "lose_response", count=1)
    with pytest.raises(httpx.RemoteProtocolError):
        complete(client)
    assert message(complete(client))["content"] == "answer 2"
    assert [r["serial"] for r in recorded(client)] == [None, 2]


@pytest.mark.parametrize(
    "rules",
    [
        "nope",
        [{"when": ["x"]}],
        [{"reply": {"content": 1}}],
        [{"when": "x", "reply": {}}],
        [{"reply": {}, "extra": 1}],
        [{"reply": {}}] * 33,
    ],
)
def test_bad_rules_are_rejected(client: httpx.Client, rules: Any) -> None:
    assert client.post("/_control/rules", json={"rules": rules}).status_code == 400


@pytest.mark.parametrize(
    "replies", ["nope", [{"content": 1}], [{"tool_calls": [{"name": "x"}]}], [{"text": "x"}]]
)
def test_bad_replies_are_rejected(client: httpx.Client, replies: Any) -> None:
    assert client.post("/_control/replies", json={"replies": replies}).status_code == 400


def test_bad_mode_is_rejected(client: httpx.Client) -> None:
    for mode in ({"mode": "explode"}, {"mode": "rate_limit", "delay_s": -1}):
        assert client.post("/_control/mode", json=mode).status_code == 400


def test_reset_forgets_replies_requests_and_mode(client: httpx.Client) -> None:
    script(client, {"content": "x"})
    set_mode(client, "error")
    complete(client)
    assert client.post("/_control/reset").status_code == 200
    assert recorded(client) == []
    assert complete(client).status_code == 500  # the script is empty, the mode normal
    assert complete(client).json() == {"error": "no scripted reply left"}


def test_empty_token_is_refused() -> None:
    with pytest.raises(ValueError):
        FakeLlm(token="")


def test_main_serves_until_sigterm(tmp_path: Path) -> None:
    token_file, ready = tmp_path / "token", tmp_path / "ready"
    token_file.write_text(TOKEN + "\n")
    cmd = [
        sys.executable,
        "-m",
        "fakes.llm",
        "--port",
        "0",
        "--token-file",
        str(token_file),
        "--ready-file",
        str(ready),
    ]
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True) as proc:
        try:
            wait_for(ready.exists, timeout=20)
            url = ready.read_text()
            assert proc.stdout is not None and proc.stdout.readline().strip() == url
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
                script(client, {"content": "from a process"})
                assert message(complete(client))["content"] == "from a process"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def stream_events(r: httpx.Response) -> list[Any]:
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream", r.text
    data = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_a_streamed_reply_has_openais_chunk_shape_and_usage_last(client: httpx.Client) -> None:
    script(
        client,
        {"content": "Hello there, world!"},
        {"tool_calls": [{"name": "lookup", "arguments": '{"id": "ACME-42"}'}]},
    )
    body = {**REQUEST, "stream": True, "stream_options": {"include_usage": True}}
    events = stream_events(complete(client, body))
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    pieces = [e["choices"][0]["delta"].get("content") for e in events[1:-2]]
    assert pieces == ["Hello th", "ere, wor", "ld!"]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["total_tokens"] > 0
    assert all(e["usage"] is None for e in events[:-1])
    events = stream_events(complete(client, {**REQUEST, "stream": True}))
    calls = [c for e in events for c in e["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["function"] == {"name": "lookup", "arguments": ""} and calls[0]["id"]
    assert "".join(c["function"]["arguments"] for c in calls) == '{"id": "ACME-42"}'
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all("usage" not in e for e in events)  # not asked for


def test_cut_stream_mode_hangs_up_after_its_chunks_and_uses_up_the_reply(
    client: httpx.Client,
) -> None:
    script(client, {"content": "one two three four five"}, {"content": "again"})
    r = client.post("/_control/mode", json={"mode": "cut_stream", "count": 1, "after_chunks": 2})
    assert r.json() == {"mode": "cut_stream", "count": 1, "delay_s": 0.0, "after_chunks": 2}
    received: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream("POST", "/v1/chat/completions", json={**REQUEST, "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                received.append(line)
    assert len([line for line in received if line.startswith("data: ")]) == 2
    assert [
        e["choices"][0]["delta"].get("content")
        for e in stream_events(complete(client, {**REQUEST, "stream": True}))
    ][1:-1] == ["again"]


@pytest.mark.parametrize("after", [-1, 1.5, "2", 10_001])
def test_bad_after_chunks_is_rejected(client: httpx.Client, after: Any) -> None:
    r = client.post("/_control/mode", json={"mode": "cut_stream", "after_chunks": after})
    assert r.status_code == 400


def test_slow_stream_mode_streams_the_same_chunks_and_survives_a_client_hanging_up(
    client: httpx.Client,
) -> None:
    script(
        client,
        {"content": "one two three four five"},
        {"content": "one two three four five"},
        {"content": "after"},
    )
    r = client.post("/_control/mode", json={"mode": "slow_stream", "count": 2, "delay_s": 0.05})
    assert r.json()["mode"] == "slow_stream"
    slow = stream_events(complete(client, {**REQUEST, "stream": True}))
    assert [e["choices"][0]["delta"].get("content") for e in slow][1:-1] == [
        "one two ",
        "three fo",
        "ur five",
    ]
    # A client that gives up mid-stream: the fake stops sending, and serves the next one.
    with client.stream("POST", "/v1/chat/completions", json={**REQUEST, "stream": True}) as r:
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
    assert json.loads(first[6:])["object"] == "chat.completion.chunk"
    assert [
        e["choices"][0]["delta"].get("content")
        for e in stream_events(complete(client, {**REQUEST, "stream": True}))
    ][1:-1] == ["after"]
