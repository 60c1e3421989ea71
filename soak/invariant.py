"""One invariant's verdict: held or broken, over how many, with the first examples."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["EXAMPLES", "Check"]

EXAMPLES: Final = 5


@dataclass
class Check:
    """One invariant: held or broken, over how many, with the first examples that broke it."""

    name: str
    examined: int = 0
    examples: list[str] = field(default_factory=list)
    broken: int = 0
    note: str = ""

    def fail(self, example: str) -> None:
        self.broken += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(example)

    @property
    def held(self) -> bool:
        return self.broken == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "held": self.held,
            "examined": self.examined,
            "broken": self.broken,
            "examples": self.examples,
            "note": self.note,
        }
