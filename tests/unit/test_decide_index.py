"""`RuleIndex`: lines 2 and 4 of `decide` read an index of the fine rules built once per Facts;
it must answer exactly what the plain scan over every rule answers."""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from services.governance.logic import Call, Facts, Rule, RuleIndex, decide
from services.governance.shell import prefix_allows

# Small alphabets, so that random rules and calls name each other and prefixes match often.
TOOLS = ("shell.run", "crm.note.create")
AGENTS = ("dev", "ops")
CHARS = "ab-"
COMMANDS = (
    "git",
    "git status",
    "git status -s",
    "git statusx",
    "ls",
    "ls -l",
    "rm -rf /",
    "git 'status'",
    "echo $HOME",
    "a",
    "a b",
    "",
)

Scan = Callable[[tuple[Rule, ...], Call], bool]


def scan_denies(rules: tuple[Rule, ...], call: Call) -> bool:
    """Line 2 as it was written before the index: every rule, in Python."""
    return any(r.effect == "deny" and r.matches(call) for r in rules)


def scan_allows_command(rules: tuple[Rule, ...], call: Call) -> bool:
    """Line 4's allow rule check as it was written before the index."""
    return any(
        r.effect == "allow"
        and r.names(call)
        and r.arg_prefix is not None
        and prefix_allows(r.arg_prefix, call.first_argument)
        for r in rules
    )


prefixes = st.one_of(st.none(), st.text(CHARS, max_size=4), st.sampled_from(COMMANDS))
rules = st.builds(
    Rule,
    tool=st.sampled_from(TOOLS),
    effect=st.sampled_from(("allow", "deny")),
    arg_prefix=prefixes,
    agent=st.one_of(st.none(), st.sampled_from(AGENTS)),
)
calls = st.builds(
    Call,
    tool=st.sampled_from(TOOLS),
    family=st.just("execute_code"),
    connector=st.none(),
    agent=st.sampled_from(AGENTS),
    first_argument=st.one_of(st.text(CHARS, max_size=6), st.sampled_from(COMMANDS)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(rules, max_size=12).map(tuple), calls)
def test_the_index_answers_what_the_scan_answers(
    the_rules: tuple[Rule, ...], the_call: Call
) -> None:
    index = RuleIndex(the_rules)
    assert index.denies(the_call) == scan_denies(the_rules, the_call)
    assert index.allows_command(the_call) == scan_allows_command(the_rules, the_call)


def random_case(rng: random.Random) -> tuple[tuple[Rule, ...], Call]:
    def prefix() -> str | None:
        pick = rng.random()
        return (
            None
            if pick < 0.15
            else rng.choice(COMMANDS)
            if pick < 0.5
            else "".join(rng.choices(CHARS, k=rng.randrange(5)))
        )

    the_rules = tuple(
        Rule(
            tool=rng.choice(TOOLS),
            effect=rng.choice(("allow", "deny")),
            arg_prefix=prefix(),
            agent=rng.choice((None, *AGENTS)),
        )
        for _ in range(rng.randrange(12))
    )
    argument = (
        rng.choice(COMMANDS)
        if rng.random() < 0.5
        else "".join(rng.choices(CHARS, k=rng.randrange(7)))
    )
    return the_rules, Call(
        tool=rng.choice(TOOLS),
        family="execute_code",
        connector=None,
        agent=rng.choice(AGENTS),
        first_argument=argument,
    )


def disagreements(
    check: Callable[[RuleIndex, Call], bool], scan: Scan, cases: int = 3000
) -> tuple[int, int]:
    """How many seeded random cases `check` and `scan` disagree on, and how many the scan
    answered True (a comparison that never sees a True proves nothing)."""
    rng, wrong, true = random.Random(18), 0, 0
    for _ in range(cases):
        the_rules, the_call = random_case(rng)
        expected = scan(the_rules, the_call)
        true += expected
        wrong += check(RuleIndex(the_rules), the_call) != expected
    return wrong, true


def test_the_comparison_finds_an_index_that_is_wrong() -> None:
    """The cases above reach what an index can get wrong: each of these broken indexes (one
    length of prefix only, the rules for every agent forgotten, prefixes matched anywhere in
    the argument) disagrees with the scan, and the real one does not."""
    wrong, true = disagreements(RuleIndex.denies, scan_denies)
    assert wrong == 0 and true > 300  # the scan said True often enough to mean something
    wrong, true = disagreements(RuleIndex.allows_command, scan_allows_command)
    assert wrong == 0 and true > 30

    def one_length(index: RuleIndex, call: Call) -> bool:
        return any(
            p.every or call.first_argument[: max(p.lengths, default=0)] in p.prefixes
            for p in (
                index._deny.get((call.tool, call.agent, None)),
                index._deny.get((call.tool, None, None)),
            )
            if p is not None
        )

    def own_agent_only(index: RuleIndex, call: Call) -> bool:
        p = index._deny.get((call.tool, call.agent, None))
        return p is not None and p.cover(call.first_argument)

    def anywhere(index: RuleIndex, call: Call) -> bool:
        return any(
            p.every or any(q in call.first_argument for q in p.prefixes)
            for p in (
                index._deny.get((call.tool, call.agent, None)),
                index._deny.get((call.tool, None, None)),
            )
            if p is not None
        )

    for broken in (one_length, own_agent_only, anywhere):
        assert disagreements(broken, scan_denies)[0] > 0, broken.__name__


def test_a_deny_rule_among_many_that_do_not_match_still_denies() -> None:
    """Hundreds of prefix rules naming the call, of several lengths; one matches."""
    call = Call(
        tool="crm.note.create",
        family="write_delete",
        connector="crm",
        agent="dev",
        first_argument="INV-2024-0042",
    )
    misses = tuple(
        Rule(tool="crm.note.create", effect="deny", agent="dev", arg_prefix=f"{kind}{i}")
        for i in range(300)
        for kind in ("ACME-", "INV-2023-", "T")
    )
    grant = Facts(policy_version="v1", rules=misses, standing_families=frozenset({"write_delete"}))
    assert decide(call, grant).verdict == "allow"
    for hit in (
        Rule(tool="crm.note.create", effect="deny", arg_prefix="INV-2024-"),
        Rule(tool="crm.note.create", effect="deny", agent="dev", arg_prefix="I"),
        Rule(tool="crm.note.create", effect="deny", agent="dev", arg_prefix="INV-2024-0042"),
        Rule(tool="crm.note.create", effect="deny"),
    ):
        ruling = decide(call, msgspec.structs.replace(grant, rules=(*misses, hit)))
        assert (ruling.verdict, ruling.line) == ("deny", 2), hit
    longer = Rule(tool="crm.note.create", effect="deny", arg_prefix="INV-2024-00420")
    other = Rule(tool="crm.note.create", effect="deny", agent="ops", arg_prefix="INV")
    assert (
        decide(call, msgspec.structs.replace(grant, rules=(*misses, longer, other))).verdict
        == "allow"
    )


def test_facts_copied_with_other_rules_are_indexed_again() -> None:
    """The index is kept on the Facts it was built for: a copy with a deny rule added denies
    (an index carried over from the original would still allow)."""
    call = Call(tool="crm.note.create", family="write_delete", connector="crm", agent="dev")
    grant = Facts(policy_version="v1", standing_families=frozenset({"write_delete"}))
    assert decide(call, grant).verdict == "allow"  # builds grant's index
    denied = msgspec.structs.replace(grant, rules=(Rule(tool="crm.note.create", effect="deny"),))
    assert decide(call, denied).verdict == "deny"
    assert grant == Facts(policy_version="v1", standing_families=frozenset({"write_delete"}))
