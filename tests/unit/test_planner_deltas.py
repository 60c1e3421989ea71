"""The delta batcher and the streamed answer scanner: pure, driven by a fake clock."""

from __future__ import annotations

import json

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.planner.deltas import AttemptReset, DeltaBatcher, TextBatch
from services.planner.openai_provider._stream import AnswerScanner
from services.planner.provider import AnswerDirectly, ModelInput, ScriptedProvider, text_chunks

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def batcher(**kwargs: object) -> tuple[DeltaBatcher, list[TextBatch | AttemptReset], Clock]:
    out: list[TextBatch | AttemptReset] = []
    clock = Clock()

    async def publish(event: TextBatch | AttemptReset) -> None:
        out.append(event)

    return DeltaBatcher(publish, clock=clock, **kwargs), out, clock  # type: ignore[arg-type]


async def test_first_delta_goes_out_at_once_then_deltas_coalesce_until_the_interval() -> None:
    b, out, clock = batcher(interval_s=0.075)
    await b.delta("Hel")
    assert out == [TextBatch(attempt=1, index=0, text="Hel")]
    clock.now += 0.01
    await b.delta("lo, ")
    clock.now += 0.01
    await b.delta("wor")
    assert len(out) == 1  # within the interval: held
    clock.now += 0.06
    await b.delta("ld")
    assert out[1:] == [TextBatch(attempt=1, index=1, text="lo, world")]
    await b.delta("!")
    await b.flush()
    assert out[2:] == [TextBatch(attempt=1, index=2, text="!")]
    await b.flush()  # nothing waiting: nothing published
    assert len(out) == 3


async def test_size_bound_flushes_early_and_splits_batches() -> None:
    b, out, clock = batcher(interval_s=10, max_chars=4)
    await b.delta("a")
    await b.delta("bc")
    await b.delta("defghij")  # 9 waiting past the bound: published in pieces of 4
    assert [e.text for e in out if isinstance(e, TextBatch)] == ["a", "bcde", "fghi", "j"]
    assert [e.index for e in out if isinstance(e, TextBatch)] == [0, 1, 2, 3]


async def test_reset_drops_what_waits_and_numbers_the_next_attempt() -> None:
    b, out, clock = batcher(interval_s=1)
    await b.delta("The an")
    await b.delta("swer is")  # waiting
    await b.reset("the stream was cut before its end")
    assert out == [
        TextBatch(attempt=1, index=0, text="The an"),
        AttemptReset(attempt=1, reason="the stream was cut before its end"),
    ]
    assert b.attempt == 2
    await b.delta("The answer")  # the next attempt's first text goes out at once
    await b.delta(" is 42.")
    await b.flush()
    assert out[2:] == [
        TextBatch(attempt=2, index=0, text="The answer"),
        TextBatch(attempt=2, index=1, text=" is 42."),
    ]


async def test_flush_due_publishes_a_stalled_streams_text_once_the_interval_passed() -> None:
    b, out, clock = batcher(interval_s=0.05)
    await b.delta("a")
    await b.delta("b")
    await b.flush_due()
    assert len(out) == 1
    clock.now += 0.06
    await b.flush_due()
    assert out[1] == TextBatch(attempt=1, index=1, text="b")


async def test_run_flushes_on_its_own() -> None:
    out: list[TextBatch | AttemptReset] = []
    arrived = anyio.Event()

    async def publish(event: TextBatch | AttemptReset) -> None:
        out.append(event)
        if len(out) == 2:
            arrived.set()

    b = DeltaBatcher(publish, interval_s=0.01)
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        await b.delta("first")
        await b.delta("second")  # within the interval of the first: left for `run`
        with anyio.fail_after(5):
            await arrived.wait()
        tg.cancel_scope.cancel()
    assert [e.text for e in out if isinstance(e, TextBatch)] == ["first", "second"]


def test_bad_bounds_are_refused() -> None:
    async def publish(event: TextBatch | AttemptReset) -> None: ...

    with pytest.raises(ValueError):
        DeltaBatcher(publish, interval_s=0)
    with pytest.raises(ValueError):
        DeltaBatcher(publish, max_chars=0)


async def test_scripted_provider_streams_its_answer_in_chunks() -> None:
    answer = "The shipment for ACME-42 is delayed until Friday; a note is on the record."
    provider = ScriptedProvider([AnswerDirectly(answer=answer)])
    sink = Sink()
    decision, tokens = await provider.decide_with_usage(
        ModelInput(developer="", user="", untrusted=[], observations=[], turn=0), text=sink
    )
    assert decision == AnswerDirectly(answer=answer) and tokens == 0
    assert "".join(sink.deltas) == answer and sink.deltas == text_chunks(answer)
    assert len(sink.deltas) > 3 and all(len(d) <= 12 for d in sink.deltas) and not sink.resets


class Sink:
    def __init__(self) -> None:
        self.deltas: list[str] = []
        self.resets: list[str] = []

    async def delta(self, text: str) -> None:
        self.deltas.append(text)

    async def reset(self, reason: str) -> None:
        self.resets.append(reason)


def scan(content: str, sizes: list[int]) -> str:
    scanner, out, i = AnswerScanner(), [], 0
    for size in [*sizes, len(content)]:
        out.append(scanner.feed(content[i : i + max(size, 1)]))
        i += max(size, 1)
        if i >= len(content):
            break
    out.append(scanner.feed(content[i:]))
    return "".join(out)


@given(st.text(), st.lists(st.integers(1, 7)), st.booleans(), st.booleans())
def test_scanner_passes_on_exactly_the_answer_however_the_json_is_cut(
    answer: str, sizes: list[int], ascii_only: bool, answer_first: bool
) -> None:
    decision = (
        {"answer": answer, "decision": "answer_directly"}
        if answer_first
        else {"decision": "answer_directly", "answer": answer}
    )
    content = json.dumps({"next": decision}, ensure_ascii=ascii_only, indent=None)
    assert scan(content, sizes) == answer


@pytest.mark.parametrize(
    "next_",
    [
        {
            "decision": "select_capability",
            "capability": "crm.note.create",
            "arguments": json.dumps({"answer": "not for the user", "next": {"answer": "x"}}),
        },
        {
            "answer": "held, then dropped",
            "decision": "request_human_review",
            "review_prompt": "check",
            "reason": "",
        },
        {"decision": "request_capabilities", "reason": "answer me"},
    ],
)
def test_scanner_shows_nothing_of_another_decision(next_: dict[str, str]) -> None:
    assert scan(json.dumps({"next": next_}), [3]) == ""


def test_scanner_ignores_an_answer_key_outside_next() -> None:
    content = json.dumps(
        {
            "other": {"answer": "no"},
            "next": {"decision": "answer_directly", "answer": "yes", "extra": [{"answer": "no"}]},
        }
    )
    assert scan(content, [1]) == "yes"
