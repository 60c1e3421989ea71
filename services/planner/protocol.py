"""The decision protocol's pure parts: the catalog an agent may show its model, the
summary sent first, and the checks a selection passes before any handler runs. No I/O here.

A selection that passes its checks is executed by the runtime, never by the model: an action is
proposed to admission, a read tool is read by retrieval (`read_tool`), another agent is called as
a branch of the run (`agent_target`), at most `MAX_BRANCH_DEPTH` calls deep and never back into an
agent already on the call chain.

The catalog is built once per run from the agent's resolved manifest and kept with the run, so a
resumed run and the offline replay see the very catalog the model saw. Capabilities are named
by reference (`action:crm.note.create`, `tool:…`, `agent:…`); a decision may give the reference
or the bare name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import msgspec

from actions.base import Invalid
from schemas.retrieval import READ_TOOLS, ReadToolSpec

__all__ = [
    "AGENT_INPUT_KEYS",
    "MAX_BRANCH_DEPTH",
    "PROTOCOL",
    "Check",
    "Refusal",
    "action_name",
    "agent_target",
    "capability_view",
    "check_selection",
    "read_tool",
]

PROTOCOL: Final = "writ-agent-decision-v1"
AGENT_INPUT_KEYS: Final = ["request"]
Check = Literal["uses", "callable_by", "arguments", "depth", "cycle", "unsupported"]
# How many agent calls deep a run's branches may go (the run's own agent is depth 0).
MAX_BRANCH_DEPTH: Final = 2
_TYPES: Final[dict[str, type | tuple[type, ...]]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
}


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """Why a selection is refused before any handler runs; it becomes an observation."""

    check: Check
    reason: str


def capability_view(catalog: list[dict[str, Any]], *, requested: bool) -> dict[str, Any]:
    """What the model is told of its capabilities: a summary until it asked for the catalog.

    Raises:
        ValueError: a capability has no description (the call is not made).
    """
    for entry in catalog:
        if not str(entry.get("description", "")).strip():
            raise ValueError(f"capability {entry.get('ref')} has no description")
    if requested:
        return {
            "protocol": PROTOCOL,
            "mode": "catalog",
            "capabilities": catalog,
            "input_keys": AGENT_INPUT_KEYS,
        }
    return {
        "protocol": PROTOCOL,
        "mode": "summary",
        "capability_count": len(catalog),
        "capability_refs": [e["ref"] for e in catalog],
        "input_keys": AGENT_INPUT_KEYS,
        "catalog_available_on_request": True,
    }


def action_name(target: str) -> str:
    """The action a selection that passed its checks proposes (a reference names it too)."""
    return target.removeprefix("action:")


def read_tool(catalog: list[dict[str, Any]], target: str) -> str | None:
    """The read tool a selection names, if its target is a tool of the catalog."""
    entry = _find(catalog, target)
    return entry["name"] if entry is not None and entry["kind"] in ("tool", "mcp") else None


def agent_target(catalog: list[dict[str, Any]], target: str) -> str | None:
    """The agent a selection names, if its target is an agent of the catalog."""
    entry = _find(catalog, target)
    return entry["name"] if entry is not None and entry["kind"] == "agent" else None


def _find(catalog: list[dict[str, Any]], target: str) -> dict[str, Any] | None:
    for entry in catalog:
        if target in (entry["ref"], entry["name"]):
            return entry
    return None


def _inputs_refusal(inputs: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    unknown = sorted(set(arguments) - set(inputs))
    if unknown:
        return f"unknown input(s): {', '.join(unknown)}"
    missing = sorted(
        k for k, spec in inputs.items() if spec.get("required", True) and k not in arguments
    )
    if missing:
        return f"missing input(s): {', '.join(missing)}"
    for key, value in arguments.items():
        spec = inputs[key]
        expected = _TYPES.get(spec.get("type", "string"), str)
        if (
            isinstance(value, bool)
            and spec.get("type") != "boolean"
            or not isinstance(value, expected)
        ):
            return f"input {key} must be a {spec.get('type', 'string')}"
        if isinstance(value, str) and len(value) > spec.get("max_length", 2048):
            return f"input {key} is too long"
    return None


def check_selection(
    catalog: list[dict[str, Any]],
    *,
    caller: str,
    target: str,
    arguments: Mapping[str, Any],
    actions: Mapping[str, Any],
    tools: Mapping[str, ReadToolSpec] = READ_TOOLS,
    chain: Sequence[str] = (),
) -> tuple[dict[str, Any], None] | tuple[None, Refusal]:
    """The runtime's checks before any handler: the target is in the caller's `uses`, the caller
    is in an agent target's `callable_by`, the arguments match the target's signature (an
    action's or a read tool's contract: the very type its executor decodes them into), and an
    agent target is neither too deep nor already on the call chain (`chain`: the agents that
    called the caller, outermost first).

    Returns the catalog entry to execute, or the refusal the model observes instead.
    """
    entry = _find(catalog, target)
    if entry is None:
        return None, Refusal(
            check="uses", reason=f"{target[:128]} is not among the capabilities agent {caller} uses"
        )
    if entry["kind"] == "agent" and caller not in entry.get("callable_by", []):
        return None, Refusal(
            check="callable_by", reason=f"agent {entry['name']} may not be called by agent {caller}"
        )
    if entry["kind"] == "action":
        contract = actions.get(entry["name"])
        if contract is None:
            return None, Refusal(check="uses", reason=f"action {entry['name']} no longer exists")
        try:
            contract.decode_request(dict(arguments))
        except Invalid as exc:
            return None, Refusal(check="arguments", reason=str(exc)[:512])
        return entry, None
    if entry["kind"] == "tool":
        spec = tools.get(entry["name"])
        if spec is None:
            return None, Refusal(check="uses", reason=f"read tool {entry['name']} no longer exists")
        try:
            msgspec.convert(dict(arguments), spec.arguments, strict=True)
        except msgspec.ValidationError as exc:
            return None, Refusal(check="arguments", reason=f"{entry['ref']}: {exc}"[:512])
        return entry, None
    if entry["kind"] == "mcp":
        # Retrieval checks the arguments against the schema the operator classified, with a
        # JSON Schema validator, before anything is sent; only their size is bounded here.
        if len(arguments) > 16:
            return None, Refusal(check="arguments", reason=f"{entry['ref']}: too many inputs")
        return entry, None
    reason = _inputs_refusal(entry.get("inputs", {}), arguments)
    if reason is not None:
        return None, Refusal(check="arguments", reason=f"{entry['ref']}: {reason}"[:512])
    if entry["kind"] != "agent":
        return None, Refusal(
            check="unsupported",
            reason=f"{entry['ref']}: this planner does not execute {entry['kind']} capabilities",
        )
    if len(chain) + 1 > MAX_BRANCH_DEPTH:
        return None, Refusal(
            check="depth", reason=f"{entry['ref']}: agent calls go at most {MAX_BRANCH_DEPTH} deep"
        )
    if entry["name"] in (*chain, caller):
        return None, Refusal(
            check="cycle",
            reason=f"{entry['ref']}: agent {entry['name']} is already on this call chain",
        )
    return entry, None
