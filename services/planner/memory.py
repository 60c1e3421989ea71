"""What a session carries into its next turn's model context: a structured memory within a
token budget (pure, no I/O).

The memory has four parts, each entry marked with its turn and who it is from:

- **open items**: what still waits for a person (a plan proposed and not answered, an ask
  not answered);
- **decisions**: what a person decided (a plan approved, rejected or superseded, an ask
  answered);
- **facts**: what Writ recorded from typed outcomes and reads (a write's receipt, a refusal's
  reason, a read's summary);
- **conversation**: the user's messages, messages the user injected, the capabilities the agent
  selected and the agent's own answers (labelled as its own, never as the user's).

The whole memory is bounded by the agent's `memory_tokens` (one token per four characters,
rounded up). Open items and decisions are never dropped for the budget (only should they
alone pass the run input's hard limit, `MAX_INPUT_CHARS`). The rest is dropped oldest turn
first, the least relevant first within a turn (a selection, then a fact, then words), until
what remains fits; one line says how many entries of which part were dropped, from which turns,
and names a few of the capabilities the agent selected in them.

The memory is written into the turn's run input as text (what is recorded and replayed), and
`split_memory` reads it back entry by entry for the model's input, which shows each entry as
said by whoever said it (`openai_provider/_history.py`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal

import msgspec

__all__ = [
    "HISTORY_TOKENS",
    "MAX_ENTRY_CHARS",
    "MAX_INPUT_CHARS",
    "HistoryEntry",
    "conversation",
    "estimate_tokens",
    "memory_of",
    "message_now",
    "split_memory",
]

HISTORY_TOKENS: Final = 1900
MAX_ENTRY_CHARS: Final = 1000
# A run's input is at most this long (`schemas.base.Text`, what retrieval's `SearchEvidence`
# takes): the message now, the memory and the turn's own steps together never pass it.
MAX_INPUT_CHARS: Final = 16_384

Role = Literal["user", "injected", "agent", "selected", "writ", "decision", "open"]
# Which part of the memory each role is in, and how it reads there.
_PART: Final[dict[str, str]] = {
    "open": "open",
    "decision": "decisions",
    "writ": "facts",
    "user": "conversation",
    "injected": "conversation",
    "selected": "conversation",
    "agent": "conversation",
}
_SAYS: Final[dict[str, str]] = {
    "user": "user",
    "injected": "user (injected)",
    "selected": "you selected",
    "agent": "you answered",
}
# Within one turn, what goes first when the budget is short (lower first).
_RELEVANCE: Final[dict[str, int]] = {"selected": 0, "writ": 1, "injected": 2, "agent": 3, "user": 4}
_HEADINGS: Final = (
    ("open", "Open items (waiting for a person; kept whole):"),
    ("decisions", "Decisions (a person's; kept whole):"),
    ("facts", "Facts (recorded by Writ from typed outcomes):"),
    ("conversation", "Conversation (oldest first):"),
)
_MARKER_ROOM: Final = 160
_NAMED: Final = 3  # the capabilities a dropped-entries line names
_NOW: Final = "\n\nThe user's message now:\n"
_SO_FAR: Final = "\n\nThis turn so far (recorded by Writ; nothing of it is to be done again):"
# A run input whose memory begins otherwise (recorded before the memory was read back into
# turns) is left whole as the user's data, so its model input and digest stay what they were.
_TITLE: Final = (
    "Session memory by turn (the user's data and Writ's records, within {budget} tokens):"
)
_INDENT: Final = "  "


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of the session's memory."""

    turn: int
    role: str  # one of `Role`
    text: str
    # The turn's step a selection was, or the step whose outcome a fact records (None: none).
    step: int | None = None


def estimate_tokens(text: str) -> int:
    """The README's estimate: one token per four characters, rounded up."""
    return math.ceil(len(text) / 4)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ENTRY_CHARS else text[: MAX_ENTRY_CHARS - 1] + "…"


def _line(entry: HistoryEntry) -> str:
    """One entry's line: its turn (and step), who says it, its text with every line after the
    first indented, so `split_memory` reads it back whole."""
    says = _SAYS.get(entry.role)
    text = _cut(entry.text).replace("\n", "\n" + _INDENT)
    at = f"turn {entry.turn}" if entry.step is None else f"turn {entry.turn} step {entry.step}"
    return f"- [{at}] {says}: {text}" if says else f"- [{at}] {text}"


def _render(entries: Sequence[HistoryEntry], budget: int, marker: str | None) -> list[str]:
    lines = [_TITLE.format(budget=budget)]
    for part, heading in _HEADINGS:
        mine = [e for e in entries if _PART.get(e.role, "facts") == part]
        if mine:
            lines.append(heading)
            lines.extend(_line(e) for e in mine)
    if marker:
        lines.append(marker)
    return lines


def _marker(dropped: Sequence[HistoryEntry]) -> str | None:
    if not dropped:
        return None
    counts: dict[str, int] = {}
    for entry in dropped:
        part = _PART.get(entry.role, "facts")
        counts[part] = counts.get(part, 0) + 1
    what = ", ".join(f"{n} {part}" for part, n in sorted(counts.items()))
    first, last = min(e.turn for e in dropped), max(e.turn for e in dropped)
    turns = f"turn {first}" if first == last else f"turns {first}-{last}"
    # What the agent did in what was dropped, in a word: the capabilities it selected there.
    selected = list(dict.fromkeys(e.text[:64] for e in dropped if e.role == "selected"))
    did = ""
    if selected:
        more = f" and {len(selected) - _NAMED} more" if len(selected) > _NAMED else ""
        did = f"; you selected there: {', '.join(selected[:_NAMED])}{more}"
    return (
        f"({len(dropped)} older entries dropped to fit the memory budget: {what}; "
        f"from {turns}{did})"
    )


def memory_of(
    entries: Sequence[HistoryEntry],
    *,
    budget: int = HISTORY_TOKENS,
    limit_chars: int = MAX_INPUT_CHARS,
) -> list[str]:
    """The memory's lines within `budget` tokens (open items and decisions whatever the
    budget), oldest first in each part; [] if there is nothing to carry.

    `limit_chars` is the hard limit of the run's input left for the memory: should the open
    items and decisions alone pass it (a long session's many answered plans), the oldest
    decisions go too, then the oldest open items, each counted in the marker."""
    if not entries:
        return []
    pinned = {i for i, e in enumerate(entries) if _PART.get(e.role) in ("open", "decisions")}
    # Dropped first: the oldest turn, then the least relevant within it, then the oldest.
    order = sorted(
        (i for i in range(len(entries)) if i not in pinned),
        key=lambda i: (entries[i].turn, _RELEVANCE.get(entries[i].role, 1), i),
    )
    dropped: set[int] = set()

    def lines() -> list[str]:
        kept = [e for i, e in enumerate(entries) if i not in dropped]
        return _render(kept, budget, _marker([entries[i] for i in sorted(dropped)]))

    # First by each line's own length (a line and its newline; the marker's room kept once
    # anything is dropped), then exactly, as `conversation` joins the lines.
    chars = len("\n".join(lines()))
    while len(dropped) < len(order) and chars + (_MARKER_ROOM if dropped else 0) > budget * 4:
        index = order[len(dropped)]
        dropped.add(index)
        chars -= len(_line(entries[index])) + 1
    while estimate_tokens("\n".join(lines())) > budget and len(dropped) < len(order):
        dropped.add(order[len(dropped)])
    last = sorted(pinned, key=lambda i: (entries[i].role == "open", i))
    while last and len("\n".join(lines())) > limit_chars:
        dropped.add(last.pop(0))
    return lines()


def conversation(
    history: Sequence[HistoryEntry],
    message: str,
    *,
    budget: int = HISTORY_TOKENS,
    so_far: Sequence[HistoryEntry] = (),
) -> str:
    """The run input of a turn: the session's memory and the user's message now, all of it
    the principal's data (never an instruction; the developer instruction is Writ's alone).
    `so_far` is what the turn itself recorded before now (a fork at one of its steps runs it
    again from there)."""
    room = MAX_INPUT_CHARS - len(message) - len(_NOW)
    tail = _so_far(so_far, room // 2)
    room -= len(tail)
    within = max(0, min(budget, room // 4))
    # Even with nothing to carry the input begins with the memory's title: all that follows
    # its first `_NOW` is the message, so no message can pass for entries of a memory.
    memory = memory_of(history, budget=within, limit_chars=room) or [_TITLE.format(budget=within)]
    return "\n".join(memory) + _NOW + message + tail


def _so_far(steps: Sequence[HistoryEntry], limit_chars: int) -> str:
    """The turn's own steps, the newest that fit `limit_chars` (a line says how many earlier
    ones do not)."""
    if not steps:
        return ""
    lines = [_line(s) for s in steps]
    used = len(_SO_FAR) + _MARKER_ROOM
    kept = 0
    for line in reversed(lines):
        if used + len(line) + 1 > limit_chars:
            break
        used += len(line) + 1
        kept += 1
    shown = lines[len(lines) - kept :]
    if kept < len(lines):
        shown.insert(0, f"({len(lines) - kept} earlier steps of this turn dropped to fit)")
    return _SO_FAR + "".join("\n" + line for line in shown)


def message_now(run_input: str) -> str:
    """The user's message of a turn's run input (the whole input of any other run)."""
    message = run_input.rpartition(_NOW)[2]
    return message.partition(_SO_FAR)[0]


_ENTRY: Final = re.compile(r"- \[turn (\d+)(?: step (\d+))?\] (.*)", re.DOTALL)
_PART_ROLE: Final = {"open": "open", "decisions": "decision", "facts": "writ"}


def split_memory(run_input: str) -> tuple[list[dict[str, Any]], str]:
    """A turn's run input read back as the memory's entries and the rest (the user's message
    now, what the turn did so far, what was injected since).

    Each entry is `{part, turn, role, text}` with its `step` where it has one, in the order of
    the memory (part by part, oldest first); the line saying what the budget dropped is
    `{part: "dropped", text}`. An input that does not begin with a memory of this form
    (another run's, or one recorded before) is ([], the input)."""
    title = _TITLE.partition("{")[0]
    if not run_input.startswith(title) or not run_input.partition("\n")[0].endswith(" tokens):"):
        return [], run_input
    head, sep, rest = run_input.partition(_NOW)
    if not sep:
        return [], run_input
    headings = {heading: part for part, heading in _HEADINGS}
    says = sorted(_SAYS.items(), key=lambda kv: -len(kv[1]))  # "user (injected)" first
    entries: list[dict[str, Any]] = []
    part = ""
    for line in head.split("\n")[1:]:
        if line.startswith(_INDENT) and entries and "turn" in entries[-1]:
            entries[-1]["text"] += "\n" + line[len(_INDENT) :]
        elif line in headings:
            part = headings[line]
        elif part and (match := _ENTRY.fullmatch(line)):
            text, role = match.group(3), _PART_ROLE.get(part)
            if role is None:  # the conversation: who says it is written before the text
                role = next((r for r, w in says if text.startswith(f"{w}: ")), None)
                if role is None:
                    return [], run_input
                text = text[len(_SAYS[role]) + 2 :]
            entry: dict[str, Any] = {"part": part, "turn": int(match.group(1))}
            if match.group(2) is not None:
                entry["step"] = int(match.group(2))
            entries.append({**entry, "role": role, "text": text})
        elif line.startswith("(") and line.endswith(")"):
            entries.append({"part": "dropped", "text": line})
        else:
            return [], run_input
    return entries, rest


def entries_of(events: Iterable[Any]) -> list[HistoryEntry]:
    """The memory entries of a session's events, oldest first: each event by its type, a
    plan or an ask open until an answer to it follows."""
    entries: list[tuple[str | None, HistoryEntry]] = []
    answered: set[str] = set()
    turn = 0
    step: int | None = None  # the turn's last selection: what a note of Writ's is about
    for event in events:
        kind = type(event).__name__
        if (getattr(event, "turn", None) or turn) != turn:
            step = None
        turn = getattr(event, "turn", None) or turn
        if kind == "UserMessage":
            entries.append((None, HistoryEntry(turn=turn, role="user", text=event.text)))
        elif kind == "SessionInjected":
            entries.append((None, HistoryEntry(turn=turn, role="injected", text=event.text)))
        elif kind == "CapabilitySelected":
            step = event.step
            selected = HistoryEntry(turn=turn, role="selected", text=event.capability, step=step)
            entries.append((None, selected))
        elif kind == "TurnEnded" and event.answer:
            entries.append((None, HistoryEntry(turn=turn, role="agent", text=event.answer)))
        elif kind in ("WriterNote", "Observed"):
            text = event.text if kind == "WriterNote" else event.summary
            about = event.step if kind == "Observed" else step
            entries.append((None, HistoryEntry(turn=turn, role="writ", text=text, step=about)))
        elif kind == "PlanProposed":
            steps = ", ".join(s.capability for s in event.plan.steps)
            text = f"plan {event.plan.plan_id} waits for approval: {steps}"
            entries.append((event.plan.plan_id, HistoryEntry(turn=turn, role="open", text=text)))
        elif kind == "PlanDecided":
            answered.add(event.plan_id)
            text = f"plan {event.plan_id} {event.answer}" + (
                f": {event.reason}" if event.reason else ""
            )
            entries.append((None, HistoryEntry(turn=turn, role="decision", text=text)))
        elif kind == "DecisionAsked":
            text = f"asked a person: {event.message or event.pending_id}"
            entries.append((event.pending_id, HistoryEntry(turn=turn, role="open", text=text)))
        elif kind == "DecisionTaken":
            answered.add(event.pending_id)
            text = f"a person answered {event.pending_id}: {event.answer}"
            entries.append((None, HistoryEntry(turn=turn, role="decision", text=text)))
    return [e for key, e in entries if key is None or key not in answered]
