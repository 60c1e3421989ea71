"""The demo's chat agent is what it says it is: a script, in plan mode, that answers a
question without writing and plans a note only when a message asks for one."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.planner.agents import load_manifest
from services.planner.memory import HistoryEntry, conversation
from services.planner.provider import AnswerDirectly, ModelInput, ScriptedProvider, SelectCapability

DEMO = Path(__file__).resolve().parents[2] / "writ" / "demo"
pytestmark = pytest.mark.anyio


def _asked(user: str, turn: int = 0) -> ModelInput:
    return ModelInput(
        developer="d", user=user, untrusted=[], observations=[], turn=turn, agent="chat-assistant"
    )


def test_the_demo_chat_agent_plans_every_write() -> None:
    manifest = load_manifest((DEMO / "agents" / "chat-assistant.json").read_bytes())
    # The deployment's provider: `make run`'s demo runs the scripted one unless told otherwise.
    assert manifest.plan_mode and manifest.provider == "default"


async def test_a_question_is_answered_as_a_script_and_writes_nothing() -> None:
    provider = ScriptedProvider.from_file(DEMO / "decisions.json")
    asked = _asked("What time zone is Acme in? Do not change anything.")
    decision = await provider.decide(asked)
    assert isinstance(decision, AnswerDirectly)
    assert "scripted" in decision.answer and "not a model" in decision.answer
    assert "nothing was changed" in decision.answer


async def test_only_the_message_now_picks_the_script() -> None:
    provider = ScriptedProvider.from_file(DEMO / "decisions.json")
    # An earlier turn asked for a note: the memory says so, the question now does not.
    memory = [HistoryEntry(turn=1, role="user", text="Please note the call.")]
    question = conversation(memory, "Which time zone is Acme in?")
    assert isinstance(await provider.decide(_asked(question)), AnswerDirectly)
    asked = conversation(memory, "Please note that Acme wants the update by Friday.")
    first = await provider.decide(_asked(asked))
    assert isinstance(first, SelectCapability) and first.capability == "crm.note.create"
    then = await provider.decide(_asked(asked, turn=1))
    assert isinstance(then, AnswerDirectly) and then.answer.startswith("My plan:")
