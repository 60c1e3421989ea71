"""Streamed decisions (`stream: true`) against the fake model server, over real HTTP on loopback:
text deltas as they arrive, a cut or lost stream retried after a reset, usage counted once,
the response bound, and the same validation as an unstreamed answer."""

# ruff: noqa: F811 (the provider tests' fixtures, imported, are parameters here)
from __future__ import annotations

import json
import math

import httpx
import msgspec
import pytest

from fakes.llm import STREAM_CHUNK_CHARS
from services.planner.deltas import AttemptReset, DeltaBatcher, TextBatch
from services.planner.openai_provider import (
    MalformedDecision,
    ModelRefused,
    OpenAIProvider,
    ProviderUnavailable,
)
from services.planner.provider import AnswerDirectly, RequestHumanReview, SelectCapability
from tests.integration.test_openai_provider import (  # noqa: F401 (fixtures)
    MODEL_INPUT,
    MakeProvider,
    ctl,
    key_file,
    llm,
    make,
    requests,
    script,
    set_mode,
    structured,
)

pytestmark = pytest.mark.anyio

ANSWER_TEXT = (
    "The shipment for ACME-42 left the warehouse on Monday; the carrier expects it "
    'on Friday. A note "delayed" is on the record.\nAnything else?'
)
ANSWER = structured({"decision": "answer_directly", "answer": ANSWER_TEXT})
# What precedes the answer's first character in the structured content.
PREFIX = len('{"next": {"decision": "answer_directly", "answer": "')


class Sink:
    """A TextSink that keeps everything in order: ("delta", text) and ("reset", reason)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def delta(self, text: str) -> None:
        self.events.append(("delta", text))

    async def reset(self, reason: str) -> None:
        self.events.append(("reset", reason))

    def attempts(self) -> list[str]:
        """The text of each attempt, split at the resets."""
        texts = [""]
        for kind, value in self.events:
            if kind == "reset":
                texts.append("")
            else:
                texts[-1] += value
        return texts

    def resets(self) -> list[str]:
        return [value for kind, value in self.events if kind == "reset"]


async def cut_after(ctl: httpx.AsyncClient, chunks: int, count: int | None = 1) -> None:
    r = await ctl.post(
        "/_control/mode", json={"mode": "cut_stream", "count": count, "after_chunks": chunks}
    )
    assert r.status_code == 200 and r.json()["after_chunks"] == chunks, r.text


def expected_tokens(provider: OpenAIProvider, content: str) -> int:
    """The fake's usage for one streamed answer of `content` to MODEL_INPUT (four bytes a
    token of the exact request body and of the message)."""
    body = msgspec.json.encode(
        {**provider.request(MODEL_INPUT), "stream": True, "stream_options": {"include_usage": True}}
    )
    message = {"role": "assistant", "content": content, "refusal": None}
    return len(body) // 4 + len(json.dumps(message)) // 4


async def test_a_structured_answer_streams_its_text_only_in_deltas(
    make: MakeProvider, ctl: httpx.AsyncClient
) -> None:
    await script(ctl, ANSWER)
    provider, sink = make(), Sink()
    decision, call = await provider.decide_with_metadata(MODEL_INPUT, text=sink)
    assert decision == AnswerDirectly(answer=ANSWER_TEXT)
    # Many deltas, each decoded answer text (the quote and the newline unescaped), no JSON.
    deltas = [text for kind, text in sink.events if kind == "delta"]
    assert len(deltas) >= len(ANSWER_TEXT) // STREAM_CHUNK_CHARS and not sink.resets()
    assert "".join(deltas) == ANSWER_TEXT
    assert not any('{"' in d or "decision" in d for d in deltas)
    # Usage from the stream's last chunk, asked for; everything else as an unstreamed call.
    [sent] = await requests(ctl)
    assert sent["body"]["stream"] is True
    assert sent["body"]["stream_options"] == {"include_usage": True}
    assert sent["body"]["response_format"]["json_schema"]["strict"] is True
    assert (call.attempts, call.status, call.model, call.finish_reason, call.request_id) == (
        1,
        200,
        "fake-1",
        "stop",
        "req_fake_1",
    )
    assert call.total_tokens == expected_tokens(provider, ANSWER["content"]) > 0


async def test_a_cut_stream_is_reset_then_retried_to_the_full_answer_with_usage_counted_once(
    make: MakeProvider, ctl: httpx.AsyncClient
) -> None:
    await script(ctl, ANSWER, ANSWER)
    # The role chunk, then enough content chunks to be well into the answer's text.
    chunks = 1 + math.ceil((PREFIX + 40) / STREAM_CHUNK_CHARS)
    await cut_after(ctl, chunks)
    provider, sink = make(), Sink()
    decision, tokens = await provider.decide_with_usage(MODEL_INPUT, text=sink)
    assert decision == AnswerDirectly(answer=ANSWER_TEXT)
    first, second = sink.attempts()
    assert ANSWER_TEXT.startswith(first) and len(first) >= 30  # shown, then taken back
    assert sink.resets() == ["the stream was cut before its end"]
    assert second == ANSWER_TEXT
    assert len(await requests(ctl)) == 2
    # The cut attempt's usage never arrived: the tokens are the completed attempt's, once.
    assert tokens == expected_tokens(provider, ANSWER["content"])


async def test_batched_deltas_of_a_cut_stream_read_reset_then_the_full_answer(
    make: MakeProvider, ctl: httpx.AsyncClient
) -> None:
    await script(ctl, ANSWER, ANSWER)
    await cut_after(ctl, 1 + math.ceil((PREFIX + 40) / STREAM_CHUNK_CHARS))
    published: list[TextBatch | AttemptReset] = []

    async def publish(event: TextBatch | AttemptReset) -> None:
        published.append(event)

    batcher = DeltaBatcher(publish, max_chars=16)
    decision, _ = await make().decide_with_usage(MODEL_INPUT, text=batcher)
    await batcher.flush()
    [reset] = [e for e in published if isinstance(e, AttemptReset)]
    before = [e for e in published[: published.index(reset)] if isinstance(e, TextBatch)]
    after = [e for e in published[published.index(reset) + 1 :] if isinstance(e, TextBatch)]
    assert reset.attempt == 1 and before and all(e.attempt == 1 for e in before)
    assert all(e.attempt == 2 for e in after)
    assert [e.index for e in after] == list(range(len(after)))
    assert decision == AnswerDirectly(answer=ANSWER_TEXT)
    assert "".join(e.text for e in after) == ANSWER_TEXT
    assert all(len(e.text) <= 16 for e in published if isinstance(e, TextBatch))


async def test_a_lost_stream_showed_nothing_so_the_retry_needs_no_reset(
    make: MakeProvider, ctl: httpx.AsyncClient
) -> None:
    await script(ctl, ANSWER, ANSWER)
    await set_mode(ctl, "lose_response", count=1)
    sink = Sink()
    decision, call = await make().decide_with_metadata(MODEL_INPUT, text=sink)
    assert decision == AnswerDirectly(answer=ANSWER_TEXT) and call.attempts == 2
    assert sink.attempts() == [ANSWER_TEXT]


async def test_a_stream_cut_on_every_attempt_is_unavailable_and_reset_each_time(
    make: MakeProvider, ctl: httpx.AsyncClient
) -> None:
    await script(ctl, ANSWER, ANSWER)
    await cut_after(ctl, 1 + math.ceil((PREFIX + 10) / STREAM_CHUNK_CHARS), count=None)
    sink = Sink()
    with pytest.raises(ProviderUnavailable, match="stream was cut"):
        await make(max_attempts=2).decide_with_usage(MODEL_INPUT, text=sink)
    assert sink.resets() == ["the stream was cut before its end"] * 2
    assert sink.attempts()[-1] == ""  # nothing left standing


async def test_a_stream_past_the_size_bound_is_refused_and_its_text_reset(
    make: MakeProvider, ctl: httpx.AsyncClient
) -> None:
    await script(ctl, structured({"decision": "answer_directly", "answer": "x" * 4000}))
    sink = Sink()
    with pytest.raises(MalformedDecision, match="too large"):
        await make(max_stream_bytes=16_384).decide_with_usage(MODEL_INPUT, text=sink)
    assert sink.resets() == ["the model's answer was malformed"]
    assert sink.attempts()[-1] == "" and len(await requests(ctl)) == 1  # not retried


async def test_a_streamed_answer_is_validated_like_an_unstreamed_one(
    make: MakeProvider, ctl: httpx.AsyncClient
) -> None:
    await script(
        ctl,
        structured({"decision": "answer_directly", "answer": "x" * 16385}),
        {**ANSWER, "finish_reason": "length"},
    )
    for _ in range(2):
        sink = Sink()
        with pytest.raises(MalformedDecision):
            await make().decide_with_usage(MODEL_INPUT, text=sink)
        assert len(sink.resets()) == 1 and sink.attempts()[-1] == ""


async def test_a_streamed_refusal_is_a_refusal(make: MakeProvider, ctl: httpx.AsyncClient) -> None:
    await set_mode(ctl, "refuse", count=1)
    sink = Sink()
    with pytest.raises(ModelRefused):
        await make().decide_with_usage(MODEL_INPUT, text=sink)
    assert sink.events == []


async def test_other_structured_decisions_stream_no_text(
    make: MakeProvider, ctl: httpx.AsyncClient
) -> None:
    arguments = {"customer_id": "ACME-42", "body": "Shipment delayed.", "answer": "no"}
    await script(
        ctl,
        structured(
            {
                "decision": "select_capability",
                "capability": "crm.note.create",
                "arguments": json.dumps(arguments),
            }
        ),
        structured(
            {"decision": "request_human_review", "review_prompt": "Check it", "reason": "unsure"}
        ),
    )
    sink, provider = Sink(), make()
    assert (await provider.decide_with_usage(MODEL_INPUT, text=sink))[0] == SelectCapability(
        capability="crm.note.create", arguments=arguments
    )
    assert (await provider.decide_with_usage(MODEL_INPUT, text=sink))[0] == RequestHumanReview(
        review_prompt="Check it", reason="unsure"
    )
    assert sink.events == []


async def test_tools_mode_streams_content_and_assembles_a_streamed_tool_call(
    make: MakeProvider, ctl: httpx.AsyncClient
) -> None:
    arguments = {"customer_id": "ACME-42", "body": "Shipment delayed by the carrier."}
    await script(
        ctl,
        {"content": ANSWER_TEXT},
        {"tool_calls": [{"name": "crm_note_create", "arguments": json.dumps(arguments)}]},
        {
            "content": "Let me add that note.",
            "tool_calls": [{"name": "crm_note_create", "arguments": json.dumps(arguments)}],
        },
    )
    provider = make(mode="tools")
    sink = Sink()
    decision, call = await provider.decide_with_metadata(MODEL_INPUT, text=sink)
    assert decision == AnswerDirectly(answer=ANSWER_TEXT) and sink.attempts() == [ANSWER_TEXT]
    assert len(sink.events) > 3
    sink = Sink()
    decision, call = await provider.decide_with_metadata(MODEL_INPUT, text=sink)
    assert decision == SelectCapability(capability="crm.note.create", arguments=arguments)
    assert call.finish_reason == "tool_calls" and sink.events == []
    # Text before a tool call is not an answer: shown as it came, then taken back.
    sink = Sink()
    decision, _ = await provider.decide_with_metadata(MODEL_INPUT, text=sink)
    assert decision == SelectCapability(capability="crm.note.create", arguments=arguments)
    assert sink.attempts() == ["Let me add that note.", ""]
    assert sink.resets() == ["the streamed text is not the decision's answer"]


async def test_without_a_sink_nothing_is_streamed(
    make: MakeProvider, ctl: httpx.AsyncClient
) -> None:
    await script(ctl, ANSWER)
    assert await make().decide(MODEL_INPUT) == AnswerDirectly(answer=ANSWER_TEXT)
    [sent] = await requests(ctl)
    assert "stream" not in sent["body"] and "stream_options" not in sent["body"]


async def test_the_critic_is_never_streamed(make: MakeProvider, ctl: httpx.AsyncClient) -> None:
    from tests.integration.test_openai_provider import CRITIC_INPUT, verdict

    await script(ctl, verdict({"verdict": "accept"}))
    await make().verify(CRITIC_INPUT)
    [sent] = await requests(ctl)
    assert "stream" not in sent["body"]
