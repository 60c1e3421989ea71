"""A simulated OpenAI-compatible model: a real loopback HTTP server speaking
`POST /v1/chat/completions`, answering from a script of replies, that can also answer with
malformed content, refuse, rate-limit, fail, slow down or lose responses.

A request with `stream: true` is answered with Server-Sent Events in OpenAI's chunk format
(`chat.completion.chunk`, content and tool-call arguments a few characters a chunk, a last
chunk with the usage when `stream_options.include_usage` asks for it, then `data: [DONE]`).
The `cut_stream` mode sends `after_chunks` events of such a stream and hangs up; the
`slow_stream` mode waits `delay_s` before each event (a model generating slowly, so a test can
act while a stream is half sent); the shared `lose_response` mode hangs up before any of it.

When the queued script is empty, rules answer (`POST /_control/rules`): the first rule whose
`when` strings all occur in the request's messages and whose `unless` strings none do gives
its reply, so concurrent conversations each get the answer their state calls for. A rule's
strings may hold `{{serial}}`, which becomes the serial number of the answer, so whoever
records the answer records which one it was. Each recorded request has its arrival time `at`
and the `serial` it was answered with (None when it got no answer).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import SplitResult

from fakes import _http
from fakes._http import MAX_BODY_BYTES, HttpError, Mode, Reply

__all__ = ["MAX_BODY_BYTES", "MAX_REPLIES", "MODES", "STREAM_CHUNK_CHARS", "FakeLlm", "main"]

# The shared modes, plus the ways a model API answers that a CRM does not.
MODES: Final = _http.MODES | {
    "malformed",
    "refuse",
    "rate_limit",
    "error",
    "cut_stream",
    "slow_stream",
}
STREAM_CHUNK_CHARS: Final = 8  # of content or arguments per streamed chunk, as a model sends
MAX_REPLIES: Final = 1000
MAX_RULES: Final = 32
SERIAL: Final = "{{serial}}"  # in a rule's reply: the serial number of the answer
MALFORMED_CONTENT: Final = '{"next": {"decision": "answer_directly", "answer": '  # cut short
REFUSAL: Final = "I can't help with that."
_COMPLETIONS: Final = "/v1/chat/completions"
_REPLY_FIELDS: Final = frozenset({"content", "tool_calls", "refusal", "finish_reason"})
_RULE_FIELDS: Final = frozenset({"when", "unless", "reply"})
# Headers worth showing a test; the others are httpx's defaults.
# `x-client-request-id`: the attempt of which call (`<call>-<attempt>`, as Writ's planner sends it).
_RECORDED_HEADERS: Final = ("authorization", "content-type", "user-agent", "x-client-request-id")


@dataclass
class _LlmMode(Mode):
    after_chunks: int = 0  # cut_stream: events sent before the hang-up


@dataclass
class _StreamReply(Reply):
    """A 200 stream of `events` (each sent as `data: <json>`), cut after `cut_after` if set."""

    events: list[Any] = field(default_factory=list)
    cut_after: int | None = None
    pause_s: float = 0.0  # before each event (`slow_stream`)


class _State(_http.State):
    """Scripted replies, recorded requests and the fault mode, all under the lock."""

    def _clear(self) -> None:
        self.replies: list[dict[str, Any]] = []
        self.rules: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.served = 0

    def record(self, headers: dict[str, str], body: Any) -> dict[str, Any]:
        """Log one request; the entry is returned so its answer's serial can be noted."""
        entry = {"headers": headers, "body": body, "at": time.time(), "serial": None}
        with self.lock:
            self.calls += 1
            self.requests.append(entry)
        return entry

    def set_rules(self, rules: list[dict[str, Any]]) -> int:
        with self.lock:
            self.rules = list(rules)
            return len(self.rules)

    def add_replies(self, replies: list[dict[str, Any]]) -> int:
        with self.lock:
            if len(self.replies) + len(replies) > MAX_REPLIES:
                raise HttpError(400, f"at most {MAX_REPLIES} queued replies")
            self.replies.extend(replies)
            return len(self.replies)

    def next_reply(
        self, instead: dict[str, Any] | None = None, text: str = ""
    ) -> tuple[int, dict[str, Any]]:
        """A serial number and the next scripted reply (or `instead`, leaving the script
        alone; or, the script used up, the first rule that matches the messages' `text`).

        Raises:
            HttpError: 500 when the script is used up and no rule matches.
        """
        with self.lock:
            rule = None
            if instead is None and not self.replies:
                rule = next((r for r in self.rules if _matches(r, text)), None)
                if rule is None:
                    raise HttpError(500, "no scripted reply left")
            self.served += 1
            if rule is not None:
                return self.served, _with_serial(rule["reply"], self.served)
            return self.served, instead if instead is not None else self.replies.pop(0)


class FakeLlm(_http.LoopbackFake):
    """An OpenAI-compatible chat-completions API served over HTTP on loopback."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, token: str) -> None:
        if not token:
            raise ValueError("token must not be empty")
        # Bind now so `url` is known before start(), e.g. to hand to a subprocess.
        super().__init__(_http.Server((host, port), _Handler, token=token.encode(), state=_State()))


class _Handler(_http.Handler):
    server: _http.Server[_State]

    def _route_api(self, method: str, url: SplitResult) -> Reply | None:
        if (method, url.path) != ("POST", _COMPLETIONS):
            self._authorize()
            raise HttpError(404, "not found")
        try:
            body = json.loads(self._raw)
        except (ValueError, RecursionError):
            body = None
        # Every completion POST is recorded, refused ones too: tests look at what was sent.
        headers = {k: v for k in _RECORDED_HEADERS if (v := self.headers.get(k)) is not None}
        entry = self.server.state.record(headers, body)
        self._authorize()
        if not isinstance(body, dict) or not isinstance(model := body.get("model"), str):
            raise HttpError(400, "model must be a string")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise HttpError(400, "messages must be a non-empty list")
        stream = body.get("stream") is True
        options = body.get("stream_options")
        usage = stream and isinstance(options, dict) and options.get("include_usage") is True
        text = "\n".join(
            m["content"]
            for m in body["messages"]
            if isinstance(m, dict) and isinstance(m.get("content"), str)
        )
        return self._complete(
            model, len(self._raw), stream=stream, usage=usage, text=text, entry=entry
        )

    def _complete(
        self,
        model: str,
        prompt_bytes: int,
        *,
        stream: bool = False,
        usage: bool = False,
        text: str = "",
        entry: dict[str, Any] | None = None,
    ) -> Reply | None:
        # Only well-formed, authorized requests use up the mode, so its `count` is predictable.
        mode = self.server.state.take_mode()
        if mode.name == "fail":
            raise HttpError(503, "unavailable")
        if mode.name == "error":
            raise HttpError(500, "internal error")
        if mode.name == "rate_limit":
            exc = HttpError(429, "rate limited")
            exc.reply.headers["Retry-After"] = _seconds(mode.delay_s)
            raise exc
        if mode.name == "slow":
            self.server.stopping.wait(mode.delay_s)  # stop() cuts the sleep short
        instead = {"malformed": {"content": MALFORMED_CONTENT}, "refuse": {"refusal": REFUSAL}}.get(
            mode.name
        )
        serial, reply = self.server.state.next_reply(instead, text)
        if mode.name == "lose_response" or (mode.name == "cut_stream" and not stream):
            return None  # the reply is used up, the answer never leaves
        if entry is not None and mode.name != "cut_stream":
            with self.server.state.lock:
                entry["serial"] = serial  # answered (a cut stream's answer never arrives whole)
        completion = _completion(serial, model, reply, prompt_bytes)
        if entry is not None and mode.name != "cut_stream":
            with self.server.state.lock:
                entry["usage"] = completion.body["usage"]  # what the answer reports it used
        if not stream:
            return completion
        cut = (
            mode.after_chunks if isinstance(mode, _LlmMode) and mode.name == "cut_stream" else None
        )
        return _StreamReply(
            200,
            None,
            completion.headers,
            events=_chunks(completion.body, usage=usage),
            cut_after=cut,
            pause_s=mode.delay_s if mode.name == "slow_stream" else 0.0,
        )

    def _send(self, reply: Reply) -> None:
        if not isinstance(reply, _StreamReply):
            return super()._send(reply)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        for sent, event in enumerate([*reply.events, "[DONE]"]):
            if reply.cut_after is not None and sent >= reply.cut_after:
                self.close_connection = True  # cut mid-stream: no terminating chunk
                _http.hang_up(self.connection)
                return
            if reply.pause_s and self.server.stopping.wait(reply.pause_s):
                return  # stop() cuts the stream short
            data = event if isinstance(event, str) else json.dumps(event)
            payload = f"data: {data}\n\n".encode()
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up on the stream
                return
        self.wfile.write(b"0\r\n\r\n")
        return None

    def _route_control(self, method: str, path: str) -> Reply:
        state = self.server.state
        if (method, path) == ("GET", "/_control/requests"):
            with state.lock:
                return Reply(200, list(state.requests))
        if (method, path) == ("POST", "/_control/replies"):
            req = self._json()
            replies = req.get("replies") if isinstance(req, dict) else None
            if not isinstance(replies, list) or not all(_valid_reply(r) for r in replies):
                raise HttpError(400, "replies must be a list of reply objects")
            return Reply(200, {"queued": state.add_replies(replies)})
        if (method, path) == ("POST", "/_control/rules"):
            req = self._json()
            rules = req.get("rules") if isinstance(req, dict) else None
            if (
                not isinstance(rules, list)
                or len(rules) > MAX_RULES
                or not all(_valid_rule(r) for r in rules)
            ):
                raise HttpError(400, f"rules must be a list of at most {MAX_RULES} rule objects")
            return Reply(200, {"rules": state.set_rules(rules)})
        raise HttpError(404, "not found")

    def _control(self, method: str, path: str) -> Reply:
        if (method, path) == ("POST", "/_control/mode"):
            mode = _parse_mode(self._json())
            with self.server.state.lock:
                self.server.state.mode = mode
            return Reply(
                200,
                {
                    "mode": mode.name,
                    "count": mode.count,
                    "delay_s": mode.delay_s,
                    "after_chunks": mode.after_chunks,
                },
            )
        return super()._control(method, path)


def _parse_mode(req: Any) -> _LlmMode:
    """Like the shared parser, over this fake's wider set of modes (and `after_chunks`)."""
    if not isinstance(req, dict) or req.get("mode") not in MODES:
        raise HttpError(400, f"mode must be one of {sorted(MODES)}")
    after = req.get("after_chunks", 0)
    if type(after) is not int or not 0 <= after <= 10_000:
        raise HttpError(400, "after_chunks must be an integer in [0, 10000]")
    # The shared parser checks count and delay_s the same way whatever the mode's name.
    checked = _http._parse_mode(
        {k: v for k, v in req.items() if k != "after_chunks"} | {"mode": "normal"}
    )
    return _LlmMode(req["mode"], checked.count, checked.delay_s, after)


def _valid_rule(rule: Any) -> bool:
    """A rule is `{when?: [str], unless?: [str], reply: <reply>}`."""
    if not isinstance(rule, dict) or set(rule) - _RULE_FIELDS or "reply" not in rule:
        return False
    return _valid_reply(rule["reply"]) and all(
        isinstance(rule.get(k, []), list) and all(isinstance(x, str) for x in rule.get(k, []))
        for k in ("when", "unless")
    )


def _matches(rule: dict[str, Any], text: str) -> bool:
    return all(s in text for s in rule.get("when", [])) and not any(
        s in text for s in rule.get("unless", [])
    )


def _with_serial(value: Any, serial: int) -> Any:
    """`value` with every `{{serial}}` in its strings replaced by `serial`."""
    if isinstance(value, str):
        return value.replace(SERIAL, str(serial))
    if isinstance(value, list):
        return [_with_serial(v, serial) for v in value]
    if isinstance(value, dict):
        return {k: _with_serial(v, serial) for k, v in value.items()}
    return value


def _valid_reply(reply: Any) -> bool:
    """A reply is `{content?, tool_calls?: [{name, arguments}], refusal?, finish_reason?}`."""
    if not isinstance(reply, dict) or set(reply) - _REPLY_FIELDS:
        return False
    if not all(
        isinstance(reply.get(k), str | None) for k in ("content", "refusal", "finish_reason")
    ):
        return False
    calls = reply.get("tool_calls")
    return calls is None or (
        isinstance(calls, list)
        and all(
            isinstance(c, dict)
            and set(c) == {"name", "arguments"}
            and isinstance(c["name"], str)
            and isinstance(c["arguments"], str)
            for c in calls
        )
    )


def _completion(serial: int, model: str, reply: dict[str, Any], prompt_bytes: int) -> Reply:
    calls = reply.get("tool_calls")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.get("content"),
        "refusal": reply.get("refusal"),
    }
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{serial}_{i}",
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for i, c in enumerate(calls)
        ]
    finish = reply.get("finish_reason") or ("tool_calls" if calls else "stop")
    # Roughly four bytes a token, which is all a test of usage accounting needs.
    completion_tokens = len(json.dumps(message)) // 4
    prompt_tokens = prompt_bytes // 4
    body = {
        "id": f"chatcmpl-fake-{serial}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    return Reply(200, body, {"x-request-id": f"req_fake_{serial}"})


def _chunks(completion: dict[str, Any], *, usage: bool) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` events that stream `completion`, as OpenAI sends them."""
    choice = completion["choices"][0]
    message, finish = choice["message"], choice["finish_reason"]
    base = {
        "id": completion["id"],
        "object": "chat.completion.chunk",
        "created": completion["created"],
        "model": completion["model"],
        "system_fingerprint": None,
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        event = {
            **base,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        return event | {"usage": None} if usage else event

    events = [chunk({"role": "assistant", "content": "", "refusal": None})]
    events += [chunk({"content": piece}) for piece in _pieces(message["content"])]
    events += [chunk({"refusal": piece}) for piece in _pieces(message["refusal"])]
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": function["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        events += [
            chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
            for piece in _pieces(function["arguments"])
        ]
    events.append(chunk({}, finish))
    if usage:
        events.append({**base, "choices": [], "usage": completion["usage"]})
    return events


def _pieces(text: str | None) -> list[str]:
    text = text or ""
    return [text[i : i + STREAM_CHUNK_CHARS] for i in range(0, len(text), STREAM_CHUNK_CHARS)]


def _seconds(delay: float) -> str:
    return str(int(delay)) if delay == int(delay) else f"{delay:g}"


def main(argv: list[str] | None = None) -> None:
    """Serve the fake model until SIGTERM or SIGINT."""
    parser = _http.arg_parser("python -m fakes.llm", main.__doc__)
    _http.serve(
        parser, argv, lambda args, token: FakeLlm(host=args.host, port=args.port, token=token)
    )


if __name__ == "__main__":
    main()
