"""Agent manifests, process states and the decision protocol's checks (services/planner/agents.py,
services/planner/protocol.py): no I/O."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from actions import ACTIONS
from actions.crm_note_create import CrmNoteCreate
from libs.errors import ConfigError, RetryableError
from schemas.retrieval import READ_TOOLS
from services.planner.agents import (
    TRANSITIONS,
    AgentManifest,
    AgentProcess,
    AgentRegistry,
    AgentUnavailable,
    InvalidTransition,
    ManifestError,
    load_manifest,
)
from services.planner.protocol import (
    MAX_BRANCH_DEPTH,
    agent_target,
    capability_view,
    check_selection,
    read_tool,
)

DEMO = Path(__file__).resolve().parents[2] / "writ" / "demo" / "agents"
BASE: dict[str, Any] = {
    "manifest_version": 1,
    "name": "support",
    "version": "1.2.0",
    "responsibility": "Answer customers' questions about their orders.",
    "uses": [
        {"kind": "action", "name": "crm.note.create"},
        {"kind": "tool", "name": "documents.search"},
        {"kind": "agent", "name": "billing", "description": "Bills a customer."},
    ],
    "callable_by": ["frontdesk"],
    "provider": "scripted",
    "budgets": {
        "provider_calls": 8,
        "tokens": 1000,
        "capability_calls": 4,
        "wall_time_s": 60,
        "concurrent_steps": 2,
    },
}
BILLING: dict[str, Any] = {
    "name": "billing",
    "version": "1.0.0",
    "responsibility": "Charge customers.",
    "uses": [{"kind": "action", "name": "payment.charge.create"}],
    "callable_by": ["support"],
}


def manifest(**changes: Any) -> bytes:
    return json.dumps({**BASE, **changes}).encode()


def registry(
    *raws: dict[str, Any], tools: Any = READ_TOOLS, actions: Any = ACTIONS
) -> AgentRegistry:
    agents = AgentRegistry(load_manifest(json.dumps(r).encode()) for r in raws)
    agents.resolve(actions=actions, tools=tools)
    return agents


# -- manifests --------------------------------------------------------------------------------


def test_a_valid_manifest_loads_with_its_budgets() -> None:
    m = load_manifest(manifest())
    assert (m.name, m.version, m.provider, m.budgets.concurrent_steps) == (
        "support",
        "1.2.0",
        "scripted",
        2,
    )
    assert [u.__struct_config__.tag for u in m.uses] == ["action", "tool", "agent"]
    assert m.critic is False  # off unless the manifest turns it on


def test_a_manifest_turns_its_critic_on() -> None:
    assert load_manifest(manifest(critic=True)).critic is True


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"owner": "me"}, "unknown field `owner`"),
        (
            {"uses": [{"kind": "action", "name": "crm.note.create", "scope": "all"}]},
            "unknown field `scope`",
        ),
        ({"budgets": {"provider_calls": 1, "dollars": 3}}, "unknown field `dollars`"),
        ({"manifest_version": 2}, "manifest_version"),
        ({"version": "latest"}, "version"),
        ({"name": "Support Bot"}, "name"),
        ({"responsibility": ""}, "responsibility"),
        ({"responsibility": "x" * 4097}, "responsibility"),
        ({"uses": [{"kind": "action", "name": "n"}] * 65}, "uses"),
        ({"callable_by": [f"a{i}" for i in range(65)]}, "callable_by"),
        ({"budgets": {"provider_calls": 0}}, "provider_calls"),
        ({"budgets": {"provider_calls": 1001}}, "provider_calls"),
        ({"budgets": {"tokens": 10_000_001}}, "tokens"),
        ({"budgets": {"wall_time_s": 0}}, "wall_time_s"),
        ({"budgets": {"concurrent_steps": 65}}, "concurrent_steps"),
        ({"budgets": {"tokens": "many"}}, "tokens"),
        ({"provider": "anthropic"}, "provider"),
        ({"uses": [{"kind": "shell", "name": "sh"}]}, "kind"),
        # A read tool's description and signature are its contract's: a manifest cannot restate
        # (or weaken) them.
        (
            {"uses": [{"kind": "tool", "name": "documents.search", "description": "Anything."}]},
            "unknown field `description`",
        ),
        ({"uses": [{"kind": "agent", "name": "billing"}]}, "description"),
        (
            {
                "uses": [
                    {"kind": "tool", "name": "documents.search", "inputs": {"q": {"type": "sql"}}}
                ]
            },
            "unknown field `inputs`",
        ),
        ({"uses": [{"kind": "action", "name": "crm.note.create"}] * 2}, "listed twice"),
        ({"uses": [{"kind": "agent", "name": "support", "description": "me"}]}, "itself"),
        ({"callable_by": ["a", "a"]}, "listed twice"),
        ({"critic": "yes"}, "critic"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_manifest_that_fails_its_checks_is_refused(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ManifestError, match=match):
        load_manifest(manifest(**changes))


@pytest.mark.parametrize(
    "changes",
    [
        {"approval": "auto"},
        {"auto_approve": True},
        {"requires_approval": False},
        {"approvers": ["ops@acme.example"]},
        {"uses": [{"kind": "action", "name": "payment.refund", "pre_approved": True}]},
        {"budgets": {"provider_calls": 2, "approval_threshold": 100}},
        {"preauthorized": ["payment.refund"]},
    ],
    ids=[
        "approval",
        "auto_approve",
        "requires_approval",
        "approvers",
        "nested-in-uses",
        "nested-in-budgets",
        "preauthorized",
    ],
)
def test_a_manifest_with_an_approval_key_is_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ManifestError, match="governance's alone"):
        load_manifest(manifest(**changes))


def test_not_json_is_refused() -> None:
    with pytest.raises(ManifestError, match="not JSON"):
        load_manifest(b"{name: support")


def test_the_manifest_schema_forbids_unknown_fields_everywhere() -> None:
    schema = msgspec.json.schema(AgentManifest)
    assert all(d.get("additionalProperties") is False for d in schema["$defs"].values())


def test_the_folder_loader(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        AgentRegistry.from_folder(tmp_path / "none")
    with pytest.raises(ConfigError, match="no manifest"):
        AgentRegistry.from_folder(tmp_path)
    (tmp_path / "helper.json").write_bytes(manifest())
    with pytest.raises(ManifestError, match="must be named support.json"):
        AgentRegistry.from_folder(tmp_path)
    (tmp_path / "helper.json").rename(tmp_path / "support.json")
    assert AgentRegistry.from_folder(tmp_path).get("support") is not None


def test_the_demo_manifests_load_and_every_agent_is_active() -> None:
    agents = AgentRegistry.from_folder(DEMO)
    agents.resolve(actions=ACTIONS)
    assert {a.name: a.state for a in agents} == {
        name: "active"
        for name in (
            "billing-assistant",
            "case-assistant",
            "catalog-assistant",
            "chat-assistant",
            "crm-assistant",
            "helpdesk-assistant",
            "helpdesk-reader",
            "helpdesk-searcher",
            "ledger-assistant",
            "mail-assistant",
            "refund-assistant",
            "research-assistant",
            "review-assistant",
            "scoped-assistant",
        )
    }
    # Scenario C's agent reads the host through `mcp:` tools (families: the operator's
    # classification, decided by governance) and writes back through its REST API.
    helpdesk = agents.get("helpdesk-assistant")
    assert helpdesk is not None
    assert [(e["ref"], e["kind"]) for e in helpdesk.catalog] == [
        ("mcp:helpdesk/ticket.get", "mcp"),
        ("mcp:helpdesk/customer.get", "mcp"),
        ("action:host.ticket.comment.create", "action"),
    ]
    # Two demo agents have a critic (`writ run`'s among them); the others answer without one.
    assert [a.name for a in agents if a.manifest.critic] == ["mail-assistant", "research-assistant"]
    # `writ run`'s agent reads the tenant's documents (retrieval's tool) before it writes.
    research = agents.get("research-assistant")
    assert research is not None
    assert [(e["ref"], e["grants"]["family"]) for e in research.catalog] == [
        ("tool:documents.search", "read"),
        ("action:crm.note.create", "write_delete"),
    ]


def test_the_demo_script_loads_with_its_critics() -> None:
    import anyio

    from services.planner.provider import (
        Accept,
        CriticInput,
        Replan,
        ScriptedProvider,
    )

    provider = ScriptedProvider.from_file(DEMO.parent / "decisions.json")

    def ask(agent: str, round: int) -> tuple[object, int]:
        value = CriticInput(
            developer="d",
            objective="o",
            answer="a",
            untrusted=[],
            observations=[],
            round=round,
            agent=agent,
        )
        return anyio.run(provider.verify, value)

    first, tokens = ask("mail-assistant", 0)
    assert isinstance(first, Replan) and tokens == 0
    assert ask("mail-assistant", 1) == (Accept(), 0)
    assert ask("crm-assistant", 0) == (Accept(), 0)  # no critic script: accept


# -- process states ---------------------------------------------------------------------------

STATES = list(TRANSITIONS)


def at(state: str) -> AgentProcess:
    agent = AgentProcess(load_manifest(manifest()))
    path = {
        "initializing": [],
        "active": ["active"],
        "degraded": ["degraded"],
        "stopping": ["stopping"],
        "stopped": ["stopping", "stopped"],
    }[state]
    for step in path:
        agent.move(step)  # type: ignore[arg-type]
    assert agent.state == state
    return agent


@pytest.mark.parametrize(
    "current,target",
    [(a, b) for a, b in itertools.product(STATES, STATES) if b not in TRANSITIONS[a]],
)
def test_every_invalid_move_is_refused(current: str, target: str) -> None:
    agent = at(current)
    with pytest.raises(InvalidTransition):
        agent.move(target)  # type: ignore[arg-type]
    assert agent.state == current


@pytest.mark.parametrize("current,target", [(a, b) for a in STATES for b in sorted(TRANSITIONS[a])])
def test_every_valid_move_is_taken(current: str, target: str) -> None:
    agent = at(current)
    agent.move(target)  # type: ignore[arg-type]
    assert agent.state == target


def test_the_table_has_no_shortcut_to_stopped() -> None:
    assert "stopped" not in TRANSITIONS["initializing"]
    assert [a for a in STATES if "stopped" in TRANSITIONS[a]] == ["stopping"]
    agent = at("initializing")
    agent.fail("boom")
    assert (agent.state, agent.reason) == ("stopped", "boom")


def test_which_states_take_work(caplog: pytest.LogCaptureFixture) -> None:
    assert at("active").accepts_work() is None
    with caplog.at_level(logging.WARNING, logger="writ.planner.agents"):
        assert at("degraded").accepts_work() is None
    assert "degraded" in caplog.text
    stopped = at("initializing")
    stopped.fail("tool documents.search does not resolve")
    assert "tool documents.search does not resolve" in (stopped.accepts_work() or "")
    for state in ("initializing", "stopping"):
        with pytest.raises(AgentUnavailable) as info:
            at(state).accepts_work()
        assert isinstance(info.value, RetryableError)  # another replica may take the run


# -- resolution -------------------------------------------------------------------------------


def test_resolution_active_degraded_stopped() -> None:
    agents = registry(BASE, BILLING)
    assert agents.get("support").state == "active"  # type: ignore[union-attr]
    optional = {
        **BASE,
        "uses": [*BASE["uses"][:1], {**BASE["uses"][1], "optional": True}, BASE["uses"][2]],
    }
    support = registry(optional, BILLING, tools={}).get("support")
    assert support is not None and support.state == "degraded"
    assert "tool:documents.search" in support.reason
    assert [e["ref"] for e in support.catalog] == ["action:crm.note.create", "agent:billing"]
    required = registry(BASE, BILLING, tools={}).get("support")
    assert required is not None and required.state == "stopped"
    assert "documents.search does not resolve" in required.reason
    unknown_tool = registry({**BASE, "uses": [{"kind": "tool", "name": "orders.read"}]})
    assert unknown_tool.get("support").state == "stopped"  # type: ignore[union-attr]
    assert "retrieval executes no read tool" in unknown_tool.get("support").reason  # type: ignore[union-attr]
    no_agent = registry(BASE).get("support")
    assert no_agent is not None and no_agent.state == "stopped"
    unknown = registry({**BASE, "uses": [{"kind": "action", "name": "shell.exec"}]})
    assert unknown.get("support").state == "stopped"  # type: ignore[union-attr]


def test_an_action_without_a_description_stops_the_agent() -> None:
    class Undescribed(CrmNoteCreate):
        description: ClassVar[str] = "  "

    support = registry(BASE, BILLING, actions={**ACTIONS, "crm.note.create": Undescribed()}).get(
        "support"
    )
    assert support is not None and support.state == "stopped"
    assert "action:crm.note.create has no description" in support.reason
    assert support.accepts_work() is not None


def test_an_unconfigured_provider_stops_the_agent() -> None:
    agents = AgentRegistry([load_manifest(manifest(provider="openai"))])
    agents.resolve(actions=ACTIONS, providers=("scripted",))
    assert agents.get("support").state == "stopped"  # type: ignore[union-attr]


def test_stop_all_passes_through_stopping() -> None:
    agents = registry(BASE, BILLING)
    agents.stop_all()
    assert {a.state for a in agents} == {"stopped"}


# -- what the model is shown ------------------------------------------------------------------


def catalog() -> list[dict[str, Any]]:
    support = registry(BASE, BILLING).get("support")
    assert support is not None
    return support.catalog


def test_the_summary_then_the_catalog() -> None:
    summary = capability_view(catalog(), requested=False)
    assert summary == {
        "protocol": "writ-agent-decision-v1",
        "mode": "summary",
        "capability_count": 3,
        "capability_refs": ["action:crm.note.create", "tool:documents.search", "agent:billing"],
        "input_keys": ["request"],
        "catalog_available_on_request": True,
    }
    full = capability_view(catalog(), requested=True)
    note, tool, agent = full["capabilities"]
    assert note["description"] == ACTIONS["crm.note.create"].description
    assert note["inputs"]["required"] == ["customer_id", "body"]
    assert note["grants"] == {"family": "write_delete", "decided_by": "governance"}
    # A read tool is shown as retrieval's catalog describes it, its family named.
    spec = READ_TOOLS["documents.search"]
    assert (tool["description"], tool["grants"]) == (
        spec.description,
        {"family": "read", "decided_by": "governance"},
    )
    assert tool["inputs"]["required"] == ["query"]
    assert tool["inputs"]["properties"]["limit"]["maximum"] == 10
    assert "untrusted" in tool["output"]
    assert (agent["responsibility"], agent["callable_by"]) == ("Charge customers.", ["support"])


def test_an_undescribed_capability_is_never_shown() -> None:
    entries = catalog()
    entries[1] = {**entries[1], "description": ""}
    with pytest.raises(ValueError, match="tool:documents.search has no description"):
        capability_view(entries, requested=False)


# -- the checks before any handler ------------------------------------------------------------

NOTE_ARGS = {"customer_id": "ACME-42", "body": "Called back."}


def check(
    target: str,
    arguments: dict[str, Any],
    *,
    caller: str = "support",
    entries: list[dict[str, Any]] | None = None,
) -> tuple[str, str] | None:
    entry, refusal = check_selection(
        entries if entries is not None else catalog(),
        caller=caller,
        target=target,
        arguments=arguments,
        actions=ACTIONS,
    )
    assert (entry is None) != (refusal is None)
    return None if refusal is None else (refusal.check, refusal.reason)


def test_an_action_in_uses_with_good_arguments_passes_by_name_or_reference() -> None:
    assert check("crm.note.create", NOTE_ARGS) is None
    assert check("action:crm.note.create", NOTE_ARGS) is None


@pytest.mark.parametrize(
    "target",
    [
        "payment.refund",
        "action:payment.refund",
        "shell.exec",
        "tool:crm.note.create",
        "agent:frontdesk",
        "",
    ],
)
def test_a_target_not_in_uses_is_refused(target: str) -> None:
    refused = check(target, {})
    assert refused is not None and refused[0] == "uses"


def test_an_agent_target_must_list_the_caller_in_callable_by() -> None:
    billing = {**BILLING, "callable_by": ["frontdesk"]}
    support = registry(BASE, billing).get("support")
    assert support is not None
    refused = check("agent:billing", {"request": "Charge 49 EUR"}, entries=support.catalog)
    assert refused == ("callable_by", "agent billing may not be called by agent support")


@pytest.mark.parametrize(
    "target,arguments,why",
    [
        ("crm.note.create", {**NOTE_ARGS, "priority": "high"}, "unknown field `priority`"),
        ("crm.note.create", {"customer_id": "ACME-42"}, "missing required field `body`"),
        ("crm.note.create", {**NOTE_ARGS, "body": 42}, "Expected `str`"),
        ("crm.note.create", {**NOTE_ARGS, "customer_id": "acme 42"}, "customer_id"),
        ("tool:documents.search", {"query": "7781", "tenant": "globex"}, "unknown field `tenant`"),
        ("tool:documents.search", {"limit": 3}, "missing required field `query`"),
        ("tool:documents.search", {"query": 7781}, "Expected `str`"),
        ("tool:documents.search", {"query": "7781", "limit": 11}, "<= 10"),
        ("agent:billing", {}, "missing input(s): request"),
        ("agent:billing", {"request": "x", "amount": 1}, "unknown input(s): amount"),
    ],
    ids=[
        "action-unknown",
        "action-missing",
        "action-type",
        "action-bound",
        "tool-unknown",
        "tool-missing",
        "tool-type",
        "tool-bool",
        "agent-missing",
        "agent-unknown",
    ],
)
def test_arguments_that_do_not_match_the_signature_are_refused(
    target: str, arguments: dict[str, Any], why: str
) -> None:
    refused = check(target, arguments)
    assert refused is not None and refused[0] == "arguments"
    assert why in refused[1]


def test_a_read_tool_that_passes_is_read_by_retrieval_by_name_or_reference() -> None:
    assert check("tool:documents.search", {"query": "order 7781"}) is None
    assert check("documents.search", {"query": "order 7781", "limit": 3}) is None
    assert read_tool(catalog(), "documents.search") == "documents.search"
    assert read_tool(catalog(), "tool:documents.search") == "documents.search"
    assert read_tool(catalog(), "crm.note.create") is None  # an action: proposed
    assert read_tool(catalog(), "tool:crm.customer.get") is None  # not in uses


def test_a_read_tool_retrieval_no_longer_has_is_refused() -> None:
    entries = registry(BASE, BILLING).get("support").catalog  # type: ignore[union-attr]
    entry, refusal = check_selection(
        entries,
        caller="support",
        target="documents.search",
        arguments={"query": "x"},
        actions=ACTIONS,
        tools={},
    )
    assert entry is None and refusal is not None and refusal.check == "uses"


def test_an_agent_that_passes_is_called_as_a_branch_by_name_or_reference() -> None:
    assert check("agent:billing", {"request": "Charge 49 EUR"}) is None
    assert check("billing", {"request": "Charge 49 EUR"}) is None
    assert agent_target(catalog(), "agent:billing") == "billing"
    assert agent_target(catalog(), "documents.search") is None  # a read tool


def chained(target: str, chain: tuple[str, ...]) -> tuple[str, str] | None:
    _, refusal = check_selection(
        catalog(),
        caller="support",
        target=target,
        arguments={"request": "Charge 49 EUR"},
        actions=ACTIONS,
        chain=chain,
    )
    return None if refusal is None else (refusal.check, refusal.reason)


def test_an_agent_call_deeper_than_the_bound_is_refused() -> None:
    assert MAX_BRANCH_DEPTH == 2
    assert chained("agent:billing", ("frontdesk",)) is None  # depth 2
    refused = chained("agent:billing", ("frontdesk", "triage"))  # depth 3
    assert refused is not None and refused[0] == "depth"


def test_an_agent_already_on_the_call_chain_is_refused() -> None:
    refused = chained("agent:billing", ("billing",))  # billing -> support -> billing
    assert refused == ("cycle", "agent:billing: agent billing is already on this call chain")


@pytest.mark.parametrize("runs", ["scripted", "openai"])
def test_a_default_provider_follows_the_planner(runs: str) -> None:
    raws = ({**BASE, "provider": "default"}, BILLING)
    agents = AgentRegistry(load_manifest(json.dumps(r).encode()) for r in raws)
    agents.resolve(actions=ACTIONS, providers=(runs,))
    support = agents.get("support")
    assert support is not None and support.state == "active", support and support.reason


def test_a_manifest_without_a_provider_takes_the_planners() -> None:
    document = {k: v for k, v in BASE.items() if k != "provider"}
    assert load_manifest(json.dumps(document).encode()).provider == "default"


def test_every_demo_agent_runs_on_the_provider_make_run_is_given() -> None:
    demo = Path(__file__).resolve().parents[2] / "writ" / "demo" / "agents"
    for path in sorted(demo.glob("*.json")):
        assert json.loads(path.read_text()).get("provider", "default") == "default", path.name
