"""`decide`: the six ordered lines that answer every capability call. Pure, no I/O.

docs/design.md §4 and the agent-OS runtime view's scenario E. The first line that applies decides;
denials are read before anything that allows, so no grant or allow rule can outrank an org refusal
or a deny rule.
"""

from __future__ import annotations

from functools import cached_property
from typing import Final, Generic, Literal, TypeVar

import msgspec

from schemas.governance import Answer
from schemas.mcp import parse_capability
from services.governance.shell import simple_command

__all__ = [
    "Call",
    "Facts",
    "Rule",
    "RuleIndex",
    "Ruling",
    "SENSITIVE_UNREADABLE",
    "decide",
    "names_of",
    "source_of",
]

Verdict = Literal["allow", "deny", "ask"]
SENSITIVE_UNREADABLE: Final = "governance store unreadable: sensitive calls are denied"
_ALL: Final[tuple[Answer, ...]] = ("once", "always", "deny")
_NO_ALWAYS: Final[tuple[Answer, ...]] = ("once", "deny")
# Families a grant naming a source (`mcp:<server>/*`, `mcp:<server>/<tool>`) never covers:
# sending outside is asked every time, and code execution has its own line.
SOURCE_UNGRANTABLE: Final = frozenset({"send_external", "execute_code"})


def source_of(tool: str) -> str | None:
    """The source an `mcp:` capability belongs to, `mcp:<server>/*`; None for any other tool.

    Derived from the capability's parsed server name, never by prefix: `mcp:crm/*` is the
    source of `mcp:crm/x` and of no tool of `mcp:crm-evil`.
    """
    parsed = parse_capability(tool)
    return None if parsed is None else f"mcp:{parsed[0]}/*"


def names_of(tool: str) -> tuple[str, ...]:
    """What a rule, a refusal or a grant may name to reach `tool`: the tool, and for an `mcp:`
    capability its server's wildcard."""
    source = source_of(tool)
    return (tool,) if source is None else (tool, source)


class Rule(msgspec.Struct, frozen=True, kw_only=True):
    """A fine rule: a tool, an optional prefix of its first argument, one agent or all.

    An allow rule naming an `mcp:` tool or server names the digest of the definition it covers
    (`digest`): it never covers that tool once the server serves another definition.
    """

    tool: str
    effect: Literal["allow", "deny"]
    arg_prefix: str | None = None
    agent: str | None = None
    digest: str | None = None

    def names(self, call: Call) -> bool:
        """Does this rule apply to this tool and agent (prefix aside)? A rule may name an
        `mcp:` capability's server as a whole (`mcp:<server>/*`)."""
        return self.tool in names_of(call.tool) and (self.agent is None or self.agent == call.agent)

    def matches(self, call: Call) -> bool:
        """Does this rule name this call, first argument included (as a plain prefix)?"""
        return self.names(call) and (
            self.arg_prefix is None or call.first_argument.startswith(self.arg_prefix)
        )


class Call(msgspec.Struct, frozen=True, kw_only=True):
    """A capability call to decide on; `family` is None for a tool nobody classified."""

    tool: str
    family: str | None
    connector: str | None
    agent: str
    first_argument: str = ""
    scope: Literal["external", "conversation", "own_memory"] = "external"
    profile_fact: bool = False
    # False where the action contract says no standing grant may cover it (it moves money,
    # changes access or sends outside): such a call asks every time, with once and deny only.
    grantable: bool = True
    # An `mcp:` tool's pinned digest: the definition the operator classified, which the server
    # serves now (a tool served otherwise is refused before `decide`). A standing grant or an
    # allow rule covers the call only if it names this digest.
    digest: str | None = None


class Facts(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """What governance read from its store for this call.

    `dict=True` only gives `index` somewhere to be kept: it is not a field, so it is neither
    compared nor encoded, and a copy with other rules (`msgspec.structs.replace`) builds its own.
    """

    policy_version: str
    policy_refused: bool = False  # the org policy file failed its signature or schema check
    refused_tools: frozenset[str] = frozenset()
    refused_connectors: frozenset[str] = frozenset()
    refused_families: frozenset[str] = frozenset()
    developer_mode: bool = False
    rules: tuple[Rule, ...] = ()
    standing_families: frozenset[str] = frozenset()
    # Standing grants of this agent that name a source rather than a whole family, as
    # (source, family, digest): `mcp:<server>/*` or `mcp:<server>/<tool>`. Each covers a tool of
    # that source classified into that family and pinned to that digest, only.
    standing_sources: frozenset[tuple[str, str, str]] = frozenset()
    run_families: frozenset[str] = frozenset()
    principal_revoked: bool = False
    approved: bool = False  # a person answered once/always for exactly this call
    attended: bool = False  # a person watches the run: an ask waits 5 minutes, then denies

    @cached_property
    def index(self) -> RuleIndex:
        """`rules` as lines 2 and 4 read them, built once per Facts."""
        return RuleIndex(self.rules)


P = TypeVar("P", str, tuple[str, ...])


class _Prefixes(Generic[P]):
    """Argument prefixes as one set and their distinct lengths: `arg` starts with one of them
    iff `arg[:n]` is in the set for one of the lengths (a prefix longer than `arg` cannot
    equal a slice of it), so a check costs the number of lengths, not of prefixes."""

    __slots__ = ("every", "lengths", "prefixes")

    def __init__(self) -> None:
        self.every = False  # a rule without a prefix: every argument
        self.prefixes: set[P] = set()
        self.lengths: tuple[int, ...] = ()

    def add(self, prefix: P | None) -> None:
        if prefix is None:
            self.every = True
        else:
            self.prefixes.add(prefix)
            if len(prefix) not in self.lengths:
                self.lengths = (*self.lengths, len(prefix))

    def cover(self, arg: P) -> bool:
        return self.every or any(arg[:n] in self.prefixes for n in self.lengths)


_Key = tuple[str, str | None, str | None]  # (tool or source, agent or None, digest or None)


class RuleIndex:
    """Fine rules by the (tool, agent, or None for every agent) they name, built once per Facts
    so that a decision reads the two entries naming its call instead of scanning every rule.

    Deny rules keep their argument prefixes as characters (line 2 reads them as plain
    prefixes). Allow rules keep theirs as the words of a simple command (line 4 compares whole
    words), parsed once, when line 4 first asks: parsing is what the other lines never need.
    An allow prefix that is no simple command allows nothing and is left out.
    """

    __slots__ = ("_allow", "_deny", "_rules")

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        self._rules = rules
        self._deny: dict[_Key, _Prefixes[str]] = {}
        self._allow: dict[_Key, _Prefixes[tuple[str, ...]]] | None = None
        for r in rules:
            if r.effect == "deny":
                # A deny refuses whatever definition the server serves: its digest is not read.
                self._deny.setdefault((r.tool, r.agent, None), _Prefixes()).add(r.arg_prefix)

    def denies(self, call: Call) -> bool:
        """Does a deny rule match the call (`Rule.matches`: the first argument as a plain
        prefix)?"""
        arg = call.first_argument
        return any(p.cover(arg) for p in _naming(self._deny, call, None))

    def allows_command(self, call: Call) -> bool:
        """Does an allow rule naming the call cover its first argument, a simple command, by
        whole words (`shell.prefix_allows`)?"""
        if self._allow is None:
            self._allow = {}
            for r in self._rules:
                if r.effect == "allow" and r.arg_prefix is not None:
                    words = simple_command(r.arg_prefix)
                    if words is not None:
                        key = (r.tool, r.agent, r.digest)
                        self._allow.setdefault(key, _Prefixes()).add(words.argv)
        # An `mcp:` tool is covered only by a rule naming its pinned digest (one naming none,
        # or another, covers no `mcp:` call); any other tool only by a rule naming none.
        naming = _naming(self._allow, call, call.digest)
        if not naming:
            return False
        command = simple_command(call.first_argument)
        return command is not None and any(p.cover(command.argv) for p in naming)


def _naming(rules: dict[_Key, _Prefixes[P]], call: Call, digest: str | None) -> list[_Prefixes[P]]:
    """The entries for the call's tool (and an `mcp:` capability's server wildcard) with its
    agent, and with every agent, naming `digest`."""
    found = []
    for name in names_of(call.tool):
        if (mine := rules.get((name, call.agent, digest))) is not None:
            found.append(mine)
        if (everyone := rules.get((name, None, digest))) is not None:
            found.append(everyone)
    return found


def _source_granted(call: Call, facts: Facts) -> str | None:
    """The source a standing grant names that covers the call, if one does: only a classified
    `mcp:` tool (family known), of that very server or that very tool, in the grant's family,
    pinned to the digest the grant names, and never a family that sends outside or executes
    code."""
    if (
        call.family is None
        or call.family in SOURCE_UNGRANTABLE
        or call.digest is None
        or not facts.standing_sources
    ):
        return None
    source = source_of(call.tool)
    if source is None:
        return None
    for name in (call.tool, source):
        if (name, call.family, call.digest) in facts.standing_sources:
            return name
    return None


class Ruling(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict, the line that gave it, and for an ask the answers a person may give."""

    verdict: Verdict
    line: int
    reason: str
    options: tuple[Answer, ...] = ()


def _plain_read(call: Call) -> bool:
    return call.family == "read" or call.scope in ("conversation", "own_memory")


def decide(call: Call, facts: Facts | None) -> Ruling:
    """Decide one call; `facts` is None when the store could not be read (fail closed)."""
    if facts is None or facts.policy_refused:
        # Governance that cannot read what it decides on refuses everything sensitive.
        if _plain_read(call):
            return Ruling(verdict="allow", line=3, reason="plain read; policy unavailable")
        reason = (
            SENSITIVE_UNREADABLE
            if facts is None
            else "the organisation policy was refused: sensitive calls are denied"
        )
        return Ruling(verdict="deny", line=1, reason=reason)
    # 1. org policy, and the principal's access itself
    if facts.principal_revoked:
        return Ruling(verdict="deny", line=1, reason="the principal's access was revoked")
    if (
        any(name in facts.refused_tools for name in names_of(call.tool))
        or (call.connector is not None and call.connector in facts.refused_connectors)
        or (call.family is not None and call.family in facts.refused_families)
    ):
        return Ruling(verdict="deny", line=1, reason="refused by organisation policy")
    # 2. fine deny rules
    if facts.index.denies(call):
        return Ruling(verdict="deny", line=2, reason="a deny rule matches the call")
    # 3. plain reads, the conversation, the agent's own memory
    if _plain_read(call):
        return Ruling(verdict="allow", line=3, reason="reads, or acts only on its own context")
    # A person's answer to the ask for exactly this call is the grant the line below it lacked.
    if facts.approved:
        return Ruling(
            verdict="allow",
            line=4 if call.family == "execute_code" else 5,
            reason="approved by a person for this call",
        )
    # 4. code execution: a narrow allow, otherwise ask with once / deny only
    if call.family == "execute_code":
        if facts.developer_mode and facts.index.allows_command(call):
            return Ruling(
                verdict="allow",
                line=4,
                reason="developer mode: an allow rule covers this simple command",
            )
        # "always" is offered only where it would write exactly one narrow rule.
        narrow = facts.developer_mode and simple_command(call.first_argument) is not None
        return Ruling(
            verdict="ask",
            line=4,
            reason="code execution needs a person",
            options=_ALL if narrow else _NO_ALWAYS,
        )
    # 5. profile facts ask every time; everything else may rest on a grant
    if call.profile_fact:
        return Ruling(
            verdict="ask", line=5, reason="a profile fact is asked every time", options=_NO_ALWAYS
        )
    if not call.grantable:
        # No grant covers it, standing or for this run, and no answer may write one.
        return Ruling(
            verdict="ask",
            line=5,
            reason="a consequential action (money, access, sending outside) is asked every time",
            options=_NO_ALWAYS,
        )
    # A family-wide standing grant names no digest: it covers no `mcp:` tool, whose grant must
    # name the definition it was given for.
    if (
        call.family is not None
        and call.family in facts.standing_families
        and source_of(call.tool) is None
    ):
        return Ruling(verdict="allow", line=5, reason=f"standing grant for {call.family}")
    if (source := _source_granted(call, facts)) is not None:
        return Ruling(
            verdict="allow",
            line=5,
            reason=f"standing grant for {call.family} of {source} pinned to {call.digest}",
        )
    if call.family is not None and call.family in facts.run_families:
        return Ruling(verdict="allow", line=5, reason=f"granted for this run: {call.family}")
    # 6. everything else asks
    if call.family is None:
        return Ruling(
            verdict="ask", line=6, reason="unclassified tool: asked every time", options=_NO_ALWAYS
        )
    return Ruling(verdict="ask", line=6, reason="no grant covers the call", options=_ALL)
