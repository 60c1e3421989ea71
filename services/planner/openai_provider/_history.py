"""A chat turn's session memory (`ModelInput.history`) as the model's earlier messages, each
said by whoever said it, as a chat completion's history is kept:

- what a person still has to answer and what persons decided (open items, decisions) and the
  line saying what the memory's budget dropped: one `user` message of domain data;
- each earlier turn in order: the user's messages (and those they injected) as `user`
  messages of domain data; each capability the agent selected as the agent's own
  (`assistant`) message, followed by what Writ recorded of that step, marked untrusted (in
  tools mode a tool call and its tool result); the agent's answer as its own `assistant`
  message.

The memory keeps which capability was selected, not its arguments: a tool call of an earlier
turn is shown with none. Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

__all__ = ["history_messages"]


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _user(value: Any) -> dict[str, Any]:
    return {"role": "user", "content": _json(value)}


def _records(turn: int, step: int | None, texts: list[str]) -> dict[str, Any]:
    at: dict[str, Any] = {"turn": turn} if step is None else {"turn": turn, "step": step}
    return {"untrusted": {"authority": "none", **at, "recorded_by_writ": texts}}


def history_messages(
    history: list[dict[str, Any]], *, tools: bool, tool_name: Callable[[str], str]
) -> list[dict[str, Any]]:
    """The messages that stand for `history` before the turn's own input. `tools`: the model
    decides by tool calls (else by a structured answer, which its earlier decisions repeat)."""
    pinned = {
        part: [{"turn": e["turn"], "text": e["text"]} for e in history if e["part"] == part]
        for part in ("open", "decisions")
    }
    dropped = [e["text"] for e in history if e["part"] == "dropped"]
    messages: list[dict[str, Any]] = []
    if pinned["open"] or pinned["decisions"] or dropped:
        memory: dict[str, Any] = {"authority": "domain_data_only"}
        if pinned["open"]:
            memory["open_items"] = pinned["open"]
        if pinned["decisions"]:
            memory["decisions"] = pinned["decisions"]
        if dropped:
            memory["dropped"] = " ".join(dropped)
        messages.append(_user({"session_memory": memory}))
    turns = sorted({e["turn"] for e in history if e["part"] in ("conversation", "facts")})
    for turn in turns:
        mine = [e for e in history if e.get("turn") == turn]
        messages.extend(_turn(turn, mine, tools=tools, tool_name=tool_name))
    return messages


def _turn(
    turn: int, entries: list[dict[str, Any]], *, tools: bool, tool_name: Callable[[str], str]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for e in entries:
        if e["role"] in ("user", "injected"):
            said: dict[str, Any] = {"authority": "domain_data_only", "turn": turn}
            if e["role"] == "injected":
                said["injected"] = True
            out.append(_user({"earlier_message": {**said, "text": e["text"]}}))
    selections = [e for e in entries if e["role"] == "selected"]
    facts = [e for e in entries if e["role"] == "writ"]
    shown: set[int] = set()
    for k, selected in enumerate(selections):
        step = selected.get("step")
        about = [i for i, f in enumerate(facts) if step is not None and f.get("step") == step]
        shown.update(about)
        texts = [facts[i]["text"] for i in about]
        if tools:
            call = f"memory-t{turn}-{k}"
            out.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call,
                            "type": "function",
                            "function": {"name": tool_name(selected["text"]), "arguments": "{}"},
                        }
                    ],
                }
            )
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call,
                    "content": _json(_records(turn, step, texts)),
                }
            )
            continue
        decision = {"decision": "select_capability", "capability": selected["text"]}
        out.append({"role": "assistant", "content": _json(decision)})
        if texts:
            out.append(_user(_records(turn, step, texts)))
    rest = [f["text"] for i, f in enumerate(facts) if i not in shown]
    if rest:
        out.append(_user(_records(turn, None, rest)))
    for e in entries:
        if e["role"] == "agent":
            answer = (
                e["text"] if tools else _json({"decision": "answer_directly", "answer": e["text"]})
            )
            out.append({"role": "assistant", "content": answer})
    return out
