"""A streamed chat completion (`stream: true`): read its Server-Sent Events within the response
bound, pass on the user-visible text as it arrives, and assemble the same completion the
non-streamed path decodes, so both are validated by one code path.

What is user-visible: only the text of a direct answer. In structured mode the content is the
decision's JSON, so the scanner below passes on the decoded characters of `next.answer` once
`next.decision` says `answer_directly` (never raw JSON, never another decision's fields); in
tools mode it is the message content (a tool call carries no visible text). Whatever was shown
is checked against the validated decision afterwards by the provider, which resets the text
when they differ.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import msgspec

from services.planner.openai_provider._wire import (
    MalformedDecision,
    _Choice,
    _Completion,
    _Function,
    _Message,
    _ToolCall,
    _Usage,
)

__all__ = ["AnswerScanner", "StreamCut", "read_stream"]


class StreamCut(Exception):
    """The stream ended before `data: [DONE]`: the attempt is lost, like a dropped response."""


# Chunks are read leniently, as the non-streamed envelope is (providers add fields).
class _DeltaFunction(msgspec.Struct, frozen=True):
    name: str | None = None
    arguments: str | None = None


class _DeltaToolCall(msgspec.Struct, frozen=True):
    index: int = 0
    function: _DeltaFunction | None = None


class _Delta(msgspec.Struct, frozen=True):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_DeltaToolCall] | None = None


class _ChunkChoice(msgspec.Struct, frozen=True):
    index: int = 0
    delta: _Delta = _Delta()
    finish_reason: str | None = None


class _Chunk(msgspec.Struct, frozen=True):
    choices: list[_ChunkChoice] = []
    model: str = ""
    usage: _Usage | None = None


_CHUNK = msgspec.json.Decoder(_Chunk)
_MAX_TOOL_CALLS = 8  # a decision is one call; a few more are kept only to refuse them


async def read_stream(
    response: httpx.Response,
    *,
    structured: bool,
    limit: int,
    max_content: int,
    visible: Callable[[str], Awaitable[None]],
) -> _Completion:
    """The completion a stream assembles to; `visible` gets user-visible text as it arrives.

    Raises:
        MalformedDecision: the stream passed `limit` bytes, its content `max_content`
            characters, or a chunk is not a completion chunk.
        StreamCut: the stream ended before `[DONE]`.
    """
    scanner = AnswerScanner() if structured else None
    content: list[str] = []
    refusal: list[str] = []
    calls: dict[int, tuple[list[str], list[str]]] = {}
    finish: str | None = None
    model, usage, chosen, size = "", None, False, 0
    async for data in _events(response, limit):
        if data == "[DONE]":
            message = _Message(
                content="".join(content) if content else None,
                refusal="".join(refusal) if refusal else None,
                tool_calls=[
                    _ToolCall(function=_Function(name="".join(n), arguments="".join(a)))
                    for _, (n, a) in sorted(calls.items())
                ]
                or None,
            )
            choices = [_Choice(message=message, finish_reason=finish)] if chosen else []
            return _Completion(choices=choices, model=model, usage=usage)
        try:
            chunk = _CHUNK.decode(data)
        except msgspec.DecodeError as exc:
            raise MalformedDecision(f"a stream chunk is not a completion chunk: {exc}") from None
        model = chunk.model or model
        usage = chunk.usage or usage  # the last chunk's, with `include_usage`
        for choice in chunk.choices:
            if choice.index != 0:
                continue  # one choice is asked for; a provider's extra ones are not the answer
            chosen = True
            finish = choice.finish_reason or finish
            delta = choice.delta
            if delta.refusal:
                refusal.append(delta.refusal)
            for call in delta.tool_calls or ():
                if call.index not in calls and len(calls) >= _MAX_TOOL_CALLS:
                    raise MalformedDecision("the model streamed too many tool calls")
                name, arguments = calls.setdefault(call.index, ([], []))
                if call.function is not None:
                    name.append(call.function.name or "")
                    arguments.append(call.function.arguments or "")
            if delta.content:
                size += len(delta.content)
                if size > max_content:
                    raise MalformedDecision("the model's answer is too long")
                content.append(delta.content)
                text = scanner.feed(delta.content) if scanner is not None else delta.content
                if text:
                    await visible(text)
    raise StreamCut("the stream ended before [DONE]")


async def _events(response: httpx.Response, limit: int) -> AsyncIterator[str]:
    """The `data` of each Server-Sent Event, reading at most `limit` bytes in all.

    Written here rather than taken from an SSE library because the bound must hold while a
    line is still arriving: a line reader without one buffers a provider's endless line.
    """
    total, pending, data = 0, b"", list[str]()
    async for piece in response.aiter_bytes():
        total += len(piece)
        if total > limit:
            raise MalformedDecision("the model response is too large")
        pending += piece
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            line = raw.removesuffix(b"\r").decode("utf-8", errors="replace")
            if not line:
                if data:
                    yield "\n".join(data)
                    data = []
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            # comments (`:`), `event:`, `id:` and `retry:` lines carry nothing a completion needs
    if data and not pending:
        yield "\n".join(data)


_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class AnswerScanner:
    """The decoded text of `next.answer` in a structured decision, as its JSON arrives.

    Text is passed on only once `next.decision` is `answer_directly`: an answer that comes
    before its decision is held until the decision is known, and the fields of any other
    decision are never passed on. It tracks structure only; validation stays with the decoder.
    """

    def __init__(self) -> None:
        # One entry per open container: [is_object, current key, expecting a key].
        self._stack: list[list[object]] = []
        self._in_string = self._is_key = False
        self._target = ""  # "answer", "decision" or "" for the string being read
        self._escape: str | None = None  # None, "" after a backslash, or the \u digits so far
        self._high: int | None = None  # a high surrogate waiting for its low half
        self._buf: list[str] = []
        self._held: list[str] = []
        self._out: list[str] = []
        self._decision: str | None = None

    def feed(self, text: str) -> str:
        """The user-visible text that `text` (the next piece of content) completes."""
        for ch in text:
            if self._in_string:
                self._string_char(ch)
            else:
                self._structure_char(ch)
        out, self._out = "".join(self._out), []
        return out

    def _structure_char(self, ch: str) -> None:
        top = self._stack[-1] if self._stack else None
        if ch in "{[":
            self._stack.append([ch == "{", None, ch == "{"])
        elif ch in "}]":
            if self._stack:
                self._stack.pop()
        elif ch == ":" and top is not None:
            top[2] = False
        elif ch == "," and top is not None and top[0]:
            top[1], top[2] = None, True
        elif ch == '"':
            self._in_string, self._buf = True, []
            self._is_key = bool(top is not None and top[0] and top[2])
            path = [entry[1] for entry in self._stack]
            self._target = ""
            if (
                not self._is_key
                and len(path) == 2
                and all(e[0] for e in self._stack)
                and path[0] == "next"
                and path[1] in ("answer", "decision")
            ):
                self._target = str(path[1])

    def _string_char(self, ch: str) -> None:
        if self._escape is not None:
            if self._escape == "":
                if ch == "u":
                    self._escape = "u"
                else:
                    self._escape = None
                    self._char(_ESCAPES.get(ch, "\ufffd"))
                return
            self._escape += ch
            if len(self._escape) == 5:  # "u" and four hex digits
                digits, self._escape = self._escape[1:], None
                try:
                    self._code(int(digits, 16))
                except ValueError:
                    self._char("\ufffd")
            return
        if ch == "\\":
            self._escape = ""
        elif ch == '"':
            self._end_string()
        else:
            self._char(ch)

    def _code(self, code: int) -> None:
        if 0xD800 <= code < 0xDC00:
            if self._high is not None:
                self._char("\ufffd")
            self._high = code
        elif 0xDC00 <= code < 0xE000 and self._high is not None:
            high, self._high = self._high, None
            self._emit(chr(0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00)))
        else:
            self._char("\ufffd" if 0xDC00 <= code < 0xE000 else chr(code))

    def _char(self, ch: str) -> None:
        if self._high is not None:  # a high surrogate with no low half is not text
            self._high = None
            self._emit("\ufffd")
        self._emit(ch)

    def _emit(self, ch: str) -> None:
        if self._is_key or self._target == "decision":
            self._buf.append(ch)
        elif self._target == "answer":
            if self._decision == "answer_directly":
                self._out.append(ch)
            elif self._decision is None:
                self._held.append(ch)

    def _end_string(self) -> None:
        if self._high is not None:
            self._high = None
            self._emit("\ufffd")
        self._in_string = False
        value = "".join(self._buf)
        if self._is_key:
            self._stack[-1][1] = value
        elif self._target == "decision" and self._decision is None:
            self._decision = value
            if value == "answer_directly":
                self._out.extend(self._held)
            self._held = []
        self._target = ""
