"""The generated HTTP and NATS reference: every route, subject, message and schema field of the
committed OpenAPI and AsyncAPI documents is on the page, with its type, bounds and description."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "reference_hook", ROOT / "docs/_hooks/reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOK = _hook()
OPENAPI: dict[str, Any] = json.loads((ROOT / "schemas/openapi.json").read_text())
ASYNCAPI: dict[str, Any] = json.loads((ROOT / "schemas/asyncapi.json").read_text())
HTTP: str = HOOK.http_reference(OPENAPI)
NATS: str = HOOK.nats_reference(ASYNCAPI)


def _sections(page: str) -> dict[str, str]:
    """Heading line -> the text up to the next heading."""
    parts = re.split(r"^(#{3,4} .+)$", page, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _rows(text: str) -> dict[str, list[str]]:
    """A section's table rows by their first cell's field name."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if cells and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    return rows


@pytest.mark.parametrize(
    ("page", "doc", "label"), [(HTTP, OPENAPI, "HTTP"), (NATS, ASYNCAPI, "NATS")]
)
def test_every_schema_field_is_rendered_with_its_type_and_requiredness(
    page: str, doc: dict[str, Any], label: str
) -> None:
    sections = _sections(page)
    for name, schema in doc["components"]["schemas"].items():
        heading = f"#### `{name}` ({label})"
        assert heading in sections, heading
        rows = _rows(sections[heading])
        required = set(schema.get("required", []))
        for field in schema.get("properties", {}):
            assert field in rows, f"{name}.{field} is missing from the {label} reference"
            assert rows[field][2] == ("yes" if field in required else "no"), (name, field)
            assert rows[field][1], (name, field)
        assert len(rows) == len(schema.get("properties", {})), name


def test_every_route_has_its_parameters_body_fields_and_answers() -> None:
    sections = _sections(HTTP)
    routes = 0
    for path, item in OPENAPI["paths"].items():
        for method, op in item.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            routes += 1
            text = sections[f"### `{method.upper()} /api/v1{path}`"]
            rows = _rows(text)
            for param in op.get("parameters", []):
                assert param["name"] in rows, (method, path, param["name"])
            for content in op.get("requestBody", {}).get("content", {}).values():
                schema = content["schema"]
                for ref in [schema, *schema.get("oneOf", [])]:
                    if "$ref" not in ref:
                        continue
                    body = ref["$ref"].rsplit("/", 1)[-1]
                    for field in OPENAPI["components"]["schemas"][body]["properties"]:
                        assert field in rows, (method, path, body, field)
            for code in op["responses"]:
                assert re.search(rf"^\| {code} \|", text, flags=re.M), (method, path, code)
    assert routes >= 30


def test_every_subject_has_each_message_field_by_field() -> None:
    sections = _sections(NATS)
    messages = ASYNCAPI["components"]["messages"]
    for name, channel in ASYNCAPI["channels"].items():
        text = sections[f"### {HOOK.channel_heading(name, channel)}"]
        for ref in channel["messages"].values():
            message = messages[ref["$ref"].rsplit("/", 1)[-1]]
            assert f"**Message `{message['name']}`**" in text
            payload = ASYNCAPI["components"]["schemas"][
                message["payload"]["$ref"].rsplit("/", 1)[-1]
            ]
            block = text.split(f"**Message `{message['name']}`**", 1)[1].split("**Message", 1)[0]
            assert set(payload.get("properties", {})) <= set(_rows(block)), message["name"]


def test_bounds_and_descriptions_come_from_the_contracts_and_the_structs() -> None:
    run_request = _rows(_sections(NATS)["#### `RunRequest` (NATS)"])
    assert run_request["input"][3] == "length 1..8192"
    assert run_request["grants"][3].startswith("items ≤ 5")
    # The Struct's own comment on the field, which the JSON Schema does not carry.
    assert run_request["attended"][4].startswith("Someone is watching")
    assert "default `false`" in run_request["attended"][3]
    assert run_request["token"][4] == HOOK._cell(HOOK.COMMON_FIELDS["token"])  # shared meaning
    approve = _rows(_sections(NATS)["#### `ApproveProposal` (NATS)"])
    assert approve["answer"][3] == "one of `approve`, `reject`, `revise`"
    keyed = _rows(_sections(HTTP)["### `POST /api/v1/commands`"])
    assert keyed["Idempotency-Key"][5].startswith("The request id")  # the document's own


def test_every_link_lands_on_a_heading() -> None:
    for page in (HTTP, NATS):
        anchors = {
            HOOK.slugify(re.sub(r"[`*]", "", h.lstrip("#").strip()), "-") for h in _sections(page)
        }
        for target in re.findall(r"\]\(#([^)]+)\)", page):
            assert target in anchors, target
