"""`decide`: the ordered lines that answer every capability call. Pure, no I/O.

DESIGN.md §4. The first line that applies decides; denials are read before anything that allows,
so no grant or allow rule can outrank an org refusal or a deny rule.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

__all__ = ["Call", "Facts", "Rule", "Ruling", "decide"]

Verdict = Literal["allow", "deny", "ask"]
SENSITIVE_UNREADABLE: Final = "governance store unreadable: sensitive calls are denied"


class Rule(msgspec.Struct, frozen=True, kw_only=True):
    """A fine rule: a tool, an optional prefix of its first argument, one agent or all."""

    tool: str
    effect: Literal["allow", "deny"]
    arg_prefix: str | None = None
    agent: str | None = None

    def matches(self, call: Call) -> bool:
        """Does this rule name this call?"""
        return (self.tool == call.tool
                and (self.agent is None or self.agent == call.agent)
                and (self.arg_prefix is None or call.first_argument.startswith(self.arg_prefix)))


class Call(msgspec.Struct, frozen=True, kw_only=True):
    """A capability call to decide on; `family` is None for a tool nobody classified."""

    tool: str
    family: str | None
    connector: str | None
    agent: str
    first_argument: str = ""


class Facts(msgspec.Struct, frozen=True, kw_only=True):
    """What governance read from its store for this call."""

    policy_version: str
    refused_tools: frozenset[str] = frozenset()
    refused_connectors: frozenset[str] = frozenset()
    refused_families: frozenset[str] = frozenset()
    rules: tuple[Rule, ...] = ()
    standing_families: frozenset[str] = frozenset()
    principal_revoked: bool = False


class Ruling(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict and the line that gave it."""

    verdict: Verdict
    line: int
    reason: str


def decide(call: Call, facts: Facts | None) -> Ruling:
    """Decide one call; `facts` is None when the store could not be read (fail closed)."""
    if facts is None:
        if call.family == "read":
            return Ruling(verdict="allow", line=3, reason="plain read; store unreadable")
        return Ruling(verdict="deny", line=1, reason=SENSITIVE_UNREADABLE)
    # 1. org policy, and the principal's access itself
    if facts.principal_revoked:
        return Ruling(verdict="deny", line=1, reason="the principal's access was revoked")
    if (call.tool in facts.refused_tools
            or (call.connector is not None and call.connector in facts.refused_connectors)
            or (call.family is not None and call.family in facts.refused_families)):
        return Ruling(verdict="deny", line=1, reason="refused by organisation policy")
    # 2. fine deny rules
    if any(r.effect == "deny" and r.matches(call) for r in facts.rules):
        return Ruling(verdict="deny", line=2, reason="a deny rule matches the call")
    # 3. plain reads
    if call.family == "read":
        return Ruling(verdict="allow", line=3, reason="plain read")
    # 4. code execution asks (the narrow developer-mode allow comes with the full decide)
    if call.family == "execute_code":
        return Ruling(verdict="ask", line=4, reason="code execution needs a person")
    # 5. standing grants of this agent for the family
    if call.family is not None and call.family in facts.standing_families:
        return Ruling(verdict="allow", line=5, reason=f"standing grant for {call.family}")
    # 6. everything else
    if call.family is None:
        return Ruling(verdict="ask", line=6, reason="unclassified tool: asked every time")
    return Ruling(verdict="ask", line=6, reason="no grant covers the call")
