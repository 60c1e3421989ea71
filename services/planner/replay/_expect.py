"""What the walk expects next (`Expect`), and how a finding shows what it compares."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["Expect", "canon", "show"]


def canon(value: Any) -> bytes:
    """`value` as JSON with sorted keys, to compare what was captured with what was expected."""
    return msgspec.json.encode(value, order="sorted")


def show(value: Any, limit: int = 160) -> str:
    """`value` as a finding shows it: canonical JSON, cut to `limit` characters."""
    text = canon(value).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Expect(msgspec.Struct, kw_only=True):
    """What the last entry implies comes next."""

    # decide | propose | read | call | refuse | output | review | reviewing | critic | replan
    # | succeed | fail | resume | ended | unknown; a plan-mode turn's: plan | plan-wait |
    # plan-answer | plan-approved
    what: str
    step: int | None = None
    action: str = ""
    arguments: dict[str, Any] | None = None
    answer: str | None = None
    code: str | None = None
    reason: str = ""
    plan: list[Any] | None = None  # plan: the steps the captured selections freeze

    def __str__(self) -> str:
        return {
            "decide": "a model decision",
            "propose": f"a proposal of {self.action} with arguments {show(self.arguments)}",
            "refuse": f"the runtime to refuse {self.action} ({self.code}: {show(self.reason)})",
            "read": f"a read of {self.action} with arguments {show(self.arguments)} observed "
            f"(step {self.step})",
            "call": f"a call of agent {self.action} with arguments {show(self.arguments)} "
            f"observed (step {self.step})",
            "output": f"the captured output of {self.action} (step {self.step})",
            "review": f"the run to wait for a person's review of step {self.step}",
            "reviewing": f"a person's answer to the review of step {self.step}",
            "critic": f"the critic's verdict on the answer of step {self.step}",
            "replan": f"the critic's reason to plan again (step {self.step}) observed",
            "succeed": f"the run to succeed with answer {show(self.answer)}",
            "fail": f"the run to fail with {self.code}: {show(self.reason)}",
            "resume": "the run to resume once the approved command's outcome arrived",
            "ended": "nothing more (the run had ended)",
            "plan": f"the plan of steps {show(self.plan)} proposed (step {self.step})",
            "plan-wait": f"the run to wait for the user's answer to the plan of step {self.step}",
            "plan-answer": f"the user's answer to the plan of step {self.step}",
            "plan-approved": f"the plan's approval observed (step {self.step})",
        }.get(self.what, "an entry the walk cannot predict")
