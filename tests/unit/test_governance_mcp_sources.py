"""Rules, refusals and standing grants that name an MCP server as a whole (`mcp:<server>/*`) or
one of its tools (`mcp:<server>/<tool>`), as `decide` reads them.

A deny (rule or org refusal) naming a server covers every tool of that server; an allow rule or
a standing grant naming it covers that server's classified tools in the family it names, never
another server's (whatever its name begins with), never an unclassified tool, and never a tool
that sends outside or executes code. Each names the digest of the definition it was given for
(the tool's pin): a tool the server changed is covered by none of them, even once classified again
into the same family, and a family-wide grant covers no `mcp:` tool.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.governance.logic import Call, Facts, Rule, decide, names_of, source_of
from services.governance.recorded import RecordedCall, RecordedFacts, facts_of_record, record_of

CRM = "mcp:crm/contact.get"
PIN = "a" * 64  # the digest the operator classified, which the server serves
CHANGED = "b" * 64  # what the server serves once it changed the tool


def mcp_call(
    tool: str = CRM,
    family: str | None = "read_personal",
    *,
    agent: str = "assistant",
    first_argument: str = "C-1",
    grantable: bool = True,
    digest: str | None = PIN,
) -> Call:
    return Call(
        tool=tool,
        family=family,
        connector=None,
        agent=agent,
        first_argument=first_argument,
        grantable=grantable,
        digest=digest if source_of(tool) is not None else None,
    )


def facts(**fields: Any) -> Facts:
    return Facts(policy_version="v1", **fields)


def granted(*pairs: tuple[str, str], digest: str = PIN) -> Facts:
    return facts(standing_sources=frozenset((source, family, digest) for source, family in pairs))


@pytest.mark.parametrize(
    ("tool", "source"),
    [
        ("mcp:crm/contact.get", "mcp:crm/*"),
        ("mcp:crm-evil/contact.get", "mcp:crm-evil/*"),
        ("mcp:c/x", "mcp:c/*"),
        ("crm.note.create", None),
        ("mcp:crm/*", None),
        ("mcp:crm/a/b", None),
        ("mcp:CRM/x", None),
        ("mcp:crm/x\n", None),
        ("agent:crm", None),
    ],
)
def test_the_source_of_a_tool_is_its_parsed_servers_wildcard(tool: str, source: str) -> None:
    assert source_of(tool) == source
    assert names_of(tool) == ((tool,) if source is None else (tool, source))


# -- a grant naming a source ------------------------------------------------------------------


def test_a_grant_naming_a_server_covers_its_classified_tools_in_that_family() -> None:
    ruling = decide(mcp_call(), granted(("mcp:crm/*", "read_personal")))
    assert (ruling.verdict, ruling.line) == ("allow", 5)
    assert "mcp:crm/*" in ruling.reason


def test_a_grant_naming_one_tool_covers_that_tool_only() -> None:
    grant = granted((CRM, "read_personal"))
    assert decide(mcp_call(), grant).verdict == "allow"
    other = decide(mcp_call("mcp:crm/contact.list"), grant)
    assert (other.verdict, other.line, other.options) == ("ask", 6, ("once", "always", "deny"))


@pytest.mark.parametrize(
    "tool",
    [
        "mcp:crm-evil/contact.get",
        "mcp:crmx/contact.get",
        "mcp:cr/contact.get",
        "mcp:evil/crm",
    ],
)
def test_a_grant_naming_a_server_never_covers_another_server(tool: str) -> None:
    ruling = decide(mcp_call(tool), granted(("mcp:crm/*", "read_personal")))
    assert (ruling.verdict, ruling.line) == ("ask", 6)


def test_a_grant_naming_a_server_never_covers_a_tool_that_is_not_an_mcp_capability() -> None:
    ruling = decide(
        mcp_call("crm.note.create", "write_delete"),
        granted(("mcp:crm/*", "write_delete"), ("crm.note.create", "write_delete")),
    )
    assert (ruling.verdict, ruling.line) == ("ask", 6)


def test_a_grant_naming_a_server_never_covers_an_unclassified_tool() -> None:
    grants = granted(*(("mcp:crm/*", f) for f in ("read_personal", "write_delete")))
    ruling = decide(mcp_call(family=None), grants)
    assert (ruling.verdict, ruling.line, ruling.options) == ("ask", 6, ("once", "deny"))


def test_a_grant_covers_only_the_family_it_names() -> None:
    ruling = decide(mcp_call(family="write_delete"), granted(("mcp:crm/*", "read_personal")))
    assert (ruling.verdict, ruling.line) == ("ask", 6)


@pytest.mark.parametrize("family", ["send_external", "execute_code"])
def test_a_grant_naming_a_source_never_covers_sending_outside_or_code(family: str) -> None:
    # Even if such a grant were stored, it is read as covering nothing.
    ruling = decide(mcp_call(family=family), granted(("mcp:crm/*", family), (CRM, family)))
    assert ruling.verdict == "ask"


def test_a_grant_naming_a_source_never_covers_what_no_grant_may_cover() -> None:
    ruling = decide(
        mcp_call(family="write_delete", grantable=False), granted(("mcp:crm/*", "write_delete"))
    )
    assert (ruling.verdict, ruling.line, ruling.options) == ("ask", 5, ("once", "deny"))


def test_a_grant_naming_a_source_is_the_agents_own() -> None:
    # The store reads the grants of the call's agent only; the family-wide grant of another
    # agent is not among them either.
    ruling = decide(mcp_call(agent="other"), facts())
    assert ruling.verdict == "ask"


def test_a_deny_outranks_a_grant_naming_the_source() -> None:
    grant = ("mcp:crm/*", "read_personal", PIN)
    denied = facts(
        standing_sources=frozenset({grant}),
        rules=(Rule(tool="mcp:crm/*", effect="deny"),),
    )
    assert (decide(mcp_call(), denied).verdict, decide(mcp_call(), denied).line) == ("deny", 2)
    refused = facts(standing_sources=frozenset({grant}), refused_tools=frozenset({"mcp:crm/*"}))
    assert (decide(mcp_call(), refused).verdict, decide(mcp_call(), refused).line) == ("deny", 1)


# -- rules and refusals naming a source -------------------------------------------------------


@pytest.mark.parametrize("family", [None, "read", "read_personal", "write_delete"])
def test_a_deny_rule_naming_a_server_denies_every_tool_of_it(family: str | None) -> None:
    ruling = decide(mcp_call(family=family), facts(rules=(Rule(tool="mcp:crm/*", effect="deny"),)))
    assert (ruling.verdict, ruling.line) == ("deny", 2)


@pytest.mark.parametrize(
    "named", ["mcp:crm", "mcp:crm/", "mcp:cr*", "mcp:*", "mcp:crm-evil/*", "mcp:crm/contact"]
)
def test_a_deny_rule_names_a_server_only_by_its_exact_wildcard(named: str) -> None:
    ruling = decide(
        mcp_call(family="write_delete"), facts(rules=(Rule(tool=named, effect="deny"),))
    )
    assert ruling.verdict == "ask"


def test_a_deny_rule_naming_a_server_keeps_its_argument_prefix_and_agent() -> None:
    rule = Rule(tool="mcp:crm/*", effect="deny", arg_prefix="VIP-", agent="assistant")
    assert decide(mcp_call(first_argument="VIP-7"), facts(rules=(rule,))).verdict == "deny"
    assert decide(mcp_call(first_argument="C-7"), facts(rules=(rule,))).verdict == "ask"
    assert decide(
        mcp_call(agent="other", first_argument="VIP-7"), facts(rules=(rule,))
    ).verdict == ("ask")
    assert rule.matches(mcp_call(first_argument="VIP-7"))
    assert not rule.matches(mcp_call("mcp:crm-evil/contact.get", first_argument="VIP-7"))


def test_an_org_refusal_naming_a_server_refuses_its_tools_and_no_other_servers() -> None:
    refused = facts(refused_tools=frozenset({"mcp:crm/*"}))
    assert decide(mcp_call(family=None), refused).verdict == "deny"
    assert decide(mcp_call(family="read"), refused).verdict == "deny"
    assert decide(mcp_call("mcp:crm-evil/contact.get", "read"), refused).verdict == "allow"


def test_an_allow_rule_naming_a_server_covers_its_classified_commands_only() -> None:
    rule = Rule(tool="mcp:crm/*", effect="allow", arg_prefix="ls", digest=PIN)
    dev = facts(developer_mode=True, rules=(rule,))
    ruling = decide(mcp_call("mcp:crm/shell", "execute_code", first_argument="ls -l"), dev)
    assert (ruling.verdict, ruling.line) == ("allow", 4)
    unclassified = decide(mcp_call("mcp:crm/shell", None, first_argument="ls -l"), dev)
    assert (unclassified.verdict, unclassified.options) == ("ask", ("once", "deny"))
    other = decide(mcp_call("mcp:crm-evil/shell", "execute_code", first_argument="ls -l"), dev)
    assert (other.verdict, other.line) == ("ask", 4)


_SERVER = st.from_regex(r"[a-z][a-z0-9-]{0,31}", fullmatch=True)
_TOOL = st.from_regex(r"[A-Za-z][A-Za-z0-9_.-]{0,63}", fullmatch=True)
_FAMILY = st.sampled_from(["read_personal", "write_delete", "send_external", "execute_code"])


@settings(max_examples=300, deadline=None)
@given(_SERVER, _SERVER, _TOOL, _TOOL, _FAMILY, _FAMILY)
def test_no_source_grant_or_allow_rule_reaches_another_servers_tool(
    granted_server: str,
    server: str,
    granted_tool: str,
    tool: str,
    granted_family: str,
    family: str,
) -> None:
    """Whatever the names: a grant or an allow rule naming a server or a tool of it never
    allows another server's tool, an unclassified tool, or a family it does not name."""
    grants = granted(
        (f"mcp:{granted_server}/*", granted_family),
        (f"mcp:{granted_server}/{granted_tool}", granted_family),
    )
    rules = (
        Rule(tool=f"mcp:{granted_server}/*", effect="allow", arg_prefix="ls", digest=PIN),
        Rule(
            tool=f"mcp:{granted_server}/{granted_tool}", effect="allow", arg_prefix="ls", digest=PIN
        ),
    )
    the_facts = facts(standing_sources=grants.standing_sources, rules=rules, developer_mode=True)
    for fam in (family, None):
        ruling = decide(mcp_call(f"mcp:{server}/{tool}", fam, first_argument="ls"), the_facts)
        # Code is allowed by the allow rules (whatever the grants), the rest by the grants.
        covered = server == granted_server and (
            fam == "execute_code"
            or (fam == granted_family and fam in ("read_personal", "write_delete"))
        )
        assert ruling.verdict != "allow" or covered, (server, tool, fam, ruling)
        if fam == "send_external" or fam is None:
            assert ruling.verdict == "ask"


# -- grants and rules bound to the tool's pin ---------------------------------------------------


def test_a_grant_given_for_one_definition_never_covers_the_changed_tool() -> None:
    """The server changed the tool and an operator classified it again into the same family:
    the grant given for the old definition does not cover it; a person is asked again."""
    for grant in (granted((CRM, "read_personal")), granted(("mcp:crm/*", "read_personal"))):
        assert decide(mcp_call(), grant).verdict == "allow"
        again = decide(mcp_call(digest=CHANGED), grant)
        assert (again.verdict, again.line, again.options) == ("ask", 6, ("once", "always", "deny"))


def test_a_grant_names_its_pin_in_the_reason_it_allows() -> None:
    ruling = decide(mcp_call(), granted((CRM, "read_personal")))
    assert PIN in ruling.reason


def test_a_family_wide_grant_covers_no_mcp_tool() -> None:
    family_wide = facts(standing_families=frozenset({"read_personal", "write_delete"}))
    ruling = decide(mcp_call(), family_wide)
    assert (ruling.verdict, ruling.line) == ("ask", 6)
    # ... and still covers what is not an `mcp:` capability.
    assert decide(mcp_call("crm.note.create", "write_delete"), family_wide).verdict == "allow"


@pytest.mark.parametrize("digest", [None, CHANGED])
def test_an_allow_rule_naming_another_pin_or_none_covers_no_mcp_command(
    digest: str | None,
) -> None:
    rule = Rule(tool="mcp:crm/shell", effect="allow", arg_prefix="ls", digest=digest)
    dev = facts(developer_mode=True, rules=(rule,))
    ruling = decide(mcp_call("mcp:crm/shell", "execute_code", first_argument="ls -l"), dev)
    assert (ruling.verdict, ruling.line) == ("ask", 4)


def test_a_deny_rule_refuses_whatever_definition_is_served() -> None:
    rule = Rule(tool="mcp:crm/*", effect="deny")
    for digest in (PIN, CHANGED):
        assert decide(mcp_call(digest=digest), facts(rules=(rule,))).verdict == "deny"


_DIGEST = st.from_regex(r"[0-9a-f]{64}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(_DIGEST, _DIGEST, _FAMILY)
def test_no_grant_or_rule_covers_a_definition_it_does_not_name(
    pinned: str, served: str, family: str
) -> None:
    """Whatever the digests: a call is covered by a grant or rule only if it names the very
    digest the call is pinned to."""
    the_facts = facts(
        standing_sources=frozenset({(CRM, family, pinned), ("mcp:crm/*", family, pinned)}),
        standing_families=frozenset({family}),
        rules=(Rule(tool=CRM, effect="allow", arg_prefix="ls", digest=pinned),),
        developer_mode=True,
    )
    ruling = decide(mcp_call(family=family, first_argument="ls", digest=served), the_facts)
    assert ruling.verdict != "allow" or served == pinned, ruling


def test_a_journaled_decision_keeps_the_pin_and_is_ruled_the_same_again() -> None:
    """`writ policy whatif` rules a journaled decision again from its row: the call's digest,
    the grants' and the allow rules' digests are kept, so a grant for another definition still
    covers nothing when it is ruled again."""
    the_facts = facts(
        standing_sources=frozenset({(CRM, "read_personal", PIN)}),
        rules=(Rule(tool=CRM, effect="allow", arg_prefix="ls", digest=PIN),),
    )
    for call in (mcp_call(), mcp_call(digest=CHANGED)):
        row = msgspec.json.decode(msgspec.json.encode(record_of(call, the_facts)))
        again, again_facts = facts_of_record(
            tool=call.tool,
            family=call.family or "unclassified",
            agent=call.agent,
            first_argument=call.first_argument,
            call=msgspec.convert(row["call"], RecordedCall),
            facts=msgspec.convert(row["facts"], RecordedFacts),
        )
        assert again.digest == call.digest
        assert decide(again, again_facts) == decide(call, the_facts)
    # A row journaled before grants named a digest is still read (its grants cover nothing).
    old = msgspec.convert(
        {"policy_version": "v1", "standing_sources": [["mcp:crm/*", "read_personal"]]},
        RecordedFacts,
    )
    _, old_facts = facts_of_record(
        tool=CRM,
        family="read_personal",
        agent="assistant",
        first_argument="C-1",
        call=RecordedCall(),
        facts=old,
    )
    assert old_facts is not None and old_facts.standing_sources == frozenset()
