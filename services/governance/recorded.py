"""The facts a decision was ruled on, as its journal row keeps them: enough to rule it again.

`logic.decide` is pure: the same call and facts give the same ruling. So a decision's journal
row carries, besides the call's tool, family and first argument, the rest of the call as
classified (scope, connector, profile fact, whether a grant may cover it) and the facts read
for it (org policy, the fine rules naming the call, the standing and run grants, revocation,
approval, attendance). `writ policy whatif` rules every journaled decision of a window again
from these, with a candidate policy substituted for the part it changes.

Only the rules naming the call's tool (or an `mcp:` tool's server) and agent are kept: no
other rule can decide it. Sets are written sorted, so the row's bytes do not depend on the
order a set was built in.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from services.governance.logic import Call, Facts, Rule, names_of

__all__ = ["RecordedCall", "RecordedFacts", "facts_of_record", "record_of"]

_Name = Annotated[str, msgspec.Meta(max_length=512)]
_Names = Annotated[list[_Name], msgspec.Meta(max_length=4096)]


class RecordedCall(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What of the call a journal row does not already say in its own fields."""

    scope: Literal["external", "conversation", "own_memory"] = "external"
    connector: _Name | None = None
    profile_fact: bool = False
    grantable: bool = True
    # An `mcp:` tool's pinned digest (what a grant or allow rule must name to cover it).
    digest: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")] | None = None


class RecordedFacts(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`logic.Facts` as journaled (rules narrowed to the ones naming the call)."""

    policy_version: _Name
    policy_refused: bool = False
    refused_tools: _Names = []
    refused_connectors: _Names = []
    refused_families: _Names = []
    developer_mode: bool = False
    rules: Annotated[list[Rule], msgspec.Meta(max_length=4096)] = []
    standing_families: _Names = []
    # (source, family, digest) of each source grant naming the call's tool or server.
    standing_pins: Annotated[list[tuple[_Name, _Name, _Name]], msgspec.Meta(max_length=4096)] = []
    # Source grants as journaled before they named a digest: read, and covering nothing (a grant
    # kept from then names no digest, and covers no call now).
    standing_sources: Annotated[list[tuple[_Name, _Name]], msgspec.Meta(max_length=4096)] = []
    run_families: _Names = []
    principal_revoked: bool = False
    approved: bool = False
    attended: bool = False


def record_of(call: Call, facts: Facts | None) -> dict[str, Any]:
    """The `call` and `facts` members of a decision's journal row (`facts` None: the store
    could not be read, and the decision was ruled on no facts). Built as plain values, on the
    decision's path: the shapes `RecordedCall` and `RecordedFacts` decode."""
    recorded: dict[str, Any] = {
        "call": {
            "scope": call.scope,
            "connector": call.connector,
            "profile_fact": call.profile_fact,
            "grantable": call.grantable,
            "digest": call.digest,
        },
        "facts": None,
    }
    if facts is None:
        return recorded
    names = names_of(call.tool)
    recorded["facts"] = {
        "policy_version": facts.policy_version,
        "policy_refused": facts.policy_refused,
        "refused_tools": sorted(facts.refused_tools),
        "refused_connectors": sorted(facts.refused_connectors),
        "refused_families": sorted(facts.refused_families),
        "developer_mode": facts.developer_mode,
        "rules": [
            {
                "tool": r.tool,
                "effect": r.effect,
                "arg_prefix": r.arg_prefix,
                "agent": r.agent,
                "digest": r.digest,
            }
            for r in facts.rules
            if r.tool in names and r.agent in (None, call.agent)
        ],
        "standing_families": sorted(facts.standing_families),
        "standing_pins": [list(s) for s in sorted(facts.standing_sources)],
        "run_families": sorted(facts.run_families),
        "principal_revoked": facts.principal_revoked,
        "approved": facts.approved,
        "attended": facts.attended,
    }
    return recorded


def facts_of_record(
    *,
    tool: str,
    family: str,
    agent: str,
    first_argument: str,
    call: RecordedCall,
    facts: RecordedFacts | None,
) -> tuple[Call, Facts | None]:
    """The call and facts a journal row records, as `decide` takes them."""
    ruled = Call(
        tool=tool,
        family=None if family == "unclassified" else family,
        connector=call.connector,
        agent=agent,
        first_argument=first_argument,
        scope=call.scope,
        profile_fact=call.profile_fact,
        grantable=call.grantable,
        digest=call.digest,
    )
    if facts is None:
        return ruled, None
    return ruled, Facts(
        policy_version=facts.policy_version,
        policy_refused=facts.policy_refused,
        refused_tools=frozenset(facts.refused_tools),
        refused_connectors=frozenset(facts.refused_connectors),
        refused_families=frozenset(facts.refused_families),
        developer_mode=facts.developer_mode,
        rules=tuple(facts.rules),
        standing_families=frozenset(facts.standing_families),
        standing_sources=frozenset(facts.standing_pins),
        run_families=frozenset(facts.run_families),
        principal_revoked=facts.principal_revoked,
        approved=facts.approved,
        attended=facts.attended,
    )
