"""MkDocs hook: renders the committed OpenAPI and AsyncAPI documents into the reference page.

`docs/reference.md` holds two markers; each is replaced, at build time, by a reference generated
from `schemas/openapi.json` (the HTTP door) or `schemas/asyncapi.json` (the NATS subjects): each
route and each subject with its message schemas rendered field by field (name, type, required,
bounds, description), then every schema either document names. So the page can never disagree
with the contracts the tests check for drift. A field's description is the document's own, or
else the comment that documents the field in its Struct in `schemas/` (msgspec puts only
`Meta(description=...)` into a JSON Schema), or else, for a field many messages share
(`COMMON_FIELDS`), the one meaning it has everywhere. `docs/subjects.md` gets the table of every
subject from `schemas.subjects.TABLE` the same way.
"""

from __future__ import annotations

import ast
import io
import json
import sys
import tokenize
from functools import cache
from pathlib import Path
from typing import Any

from markdown.extensions.toc import slugify  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[2]
HTTP_MARKER = "<!-- reference: openapi -->"
NATS_MARKER = "<!-- reference: asyncapi -->"
SUBJECTS_MARKER = "<!-- reference: subjects -->"
FIELDS_HEADER = "| field | type | required | bounds | description |"

Schema = dict[str, Any]

# What a field many messages share means wherever it appears, where neither the contract nor
# the Struct's own comment says it.
COMMON_FIELDS: dict[str, str] = {
    "type": "The message's type: its schema's name, the tag a union is decoded by.",
    "api_version": "The host contract's version (`HOST_API_VERSION`).",
    "token": "The caller's signed credential (an EdDSA JWT): tenant, principal and roles come "
    "from it, never from the body.",
    "request_id": "The id of the caller's request (its `Nats-Msg-Id` on NATS, so a re-publish "
    "is a duplicate); an answer repeats it.",
    "tenant": "The tenant, one subject token.",
    "principal": "Who the work is done for, as their token names them.",
    "agent": "The agent's name, as the agent catalog knows it.",
    "run_id": "The run's id.",
    "step": "The step's number, within its run or turn.",
    "session_id": "The chat session's id.",
    "parent_session_id": "The session this one descends from (a fork's or a child's), if any.",
    "turn": "The turn's number in its session (from 1).",
    "n": "The event's number in its session (1, 2, ... with no gap; 0 for text deltas and resets).",
    "plan_mode": "Whether the session proposes a plan before it acts.",
    "plan_id": "The plan's opaque id: a plan is answered by it alone.",
    "pending_id": "The id of a decision waiting for a person.",
    "proposal_id": "The proposal's opaque id: what an approver approves or rejects.",
    "action": "The action contract's name (`actions/`).",
    "arguments": "The action's arguments, closed and bounded by its contract.",
    "preview": "The human preview frozen with the arguments: what an approver is shown.",
    "operation_id": "The command's operation id; the dispatcher's idempotency key is "
    "`<tenant>:<operation_id>`.",
    "operation_key": "The host's own key for a command: the same key and payload is a replay, "
    "another payload a conflict.",
    "receipt": "What the system of record returned for the effect.",
    "correlation_id": "The id that ties this outcome to the runtime's own records.",
    "code": "A stable code (upper case) saying what went wrong or was refused, if anything did.",
    "created_at": "When it was created (RFC 3339).",
    "expires_at": "When it expires (RFC 3339).",
}


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


# -- field descriptions from the Structs' own comments --------------------------------------


@cache
def field_comments() -> dict[str, dict[str, str]]:
    """Struct name -> field -> the comment that documents it in `schemas/` (the comment lines
    right above the field, or the one after it on its line), inherited fields included."""
    own: dict[str, dict[str, str]] = {}
    bases: dict[str, list[str]] = {}
    for path in sorted((ROOT / "schemas").glob("*.py")):
        source = path.read_text()
        comments = {
            tok.start[0]: tok.string.lstrip("#").strip()
            for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT
        }
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ClassDef):
                continue
            bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
            fields = own.setdefault(node.name, {})
            for stmt in node.body:
                if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                    continue
                above: list[str] = []
                line = stmt.lineno - 1
                while line in comments and lines[line - 1].lstrip().startswith("#"):
                    above.insert(0, comments[line])
                    line -= 1
                span = range(stmt.lineno, (stmt.end_lineno or 0) + 1)
                after = [comments[n] for n in span if n in comments]
                text = " ".join(above + after)
                if text:
                    fields[stmt.target.id] = text

    def merged(name: str, seen: frozenset[str] = frozenset()) -> dict[str, str]:
        result: dict[str, str] = {}
        for base in bases.get(name, []):
            if base not in seen:
                result.update(merged(base, seen | {name}))
        result.update(own.get(name, {}))
        return result

    return {name: merged(name) for name in own}


# -- one schema, field by field -------------------------------------------------------------


class Renderer:
    """Renders one document's schemas; `label` tells its schemas' headings apart (HTTP, NATS)."""

    def __init__(self, doc: dict[str, Any], label: str) -> None:
        self.schemas: dict[str, Schema] = doc.get("components", {}).get("schemas", {})
        self.label = label

    def heading(self, name: str) -> str:
        """The heading of a schema's own section."""
        return f"#### `{name}` ({self.label})"

    def anchor(self, name: str) -> str:
        """The anchor MkDocs gives that heading."""
        return slugify(f"{name} ({self.label})", "-")

    def link(self, ref: str) -> str:
        name = ref.rsplit("/", 1)[-1]
        return f"[`{name}`](#{self.anchor(name)})"

    def type_of(self, schema: Schema) -> str:
        """A schema's type, with links to the schemas it names."""
        if "$ref" in schema:
            return self.link(schema["$ref"])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return " or ".join(self.type_of(s) for s in schema[key])
        if "const" in schema:
            return _code(schema["const"])
        kind = schema.get("type")
        if isinstance(kind, list):
            return " or ".join(kind)
        if kind == "array":
            return f"array of {self.type_of(schema.get('items', {}))}"
        if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
            return f"object of {self.type_of(schema['additionalProperties'])}"
        if kind is None and "enum" in schema:
            kinds = {type(v) for v in schema["enum"] if v is not None}
            return "string" if kinds == {str} else "any"
        return str(kind or "any")

    def bounds(self, schema: Schema) -> str:
        """What a value must satisfy beyond its type: lengths, ranges, pattern, choices."""
        parts: list[str] = []
        for sub in [schema, *schema.get("anyOf", []), *schema.get("oneOf", [])]:
            parts += _bounds(sub)
        if "default" in schema:
            parts.append(f"default {_code(json.dumps(schema['default']))}")
        return "; ".join(dict.fromkeys(parts))

    def fields(self, name: str) -> list[str]:
        """A Struct's table: one row per field."""
        schema = self.schemas[name]
        described = field_comments().get(name, {})
        required = set(schema.get("required", []))
        if not schema.get("properties"):
            return ["No fields." if schema.get("additionalProperties") is False else "Any fields."]
        rows = [FIELDS_HEADER, "| --- | --- | --- | --- | --- |"]
        for field, prop in schema.get("properties", {}).items():
            text = prop.get("description") or described.get(field) or COMMON_FIELDS.get(field, "")
            rows.append(
                f"| `{field}` | {_cell(self.type_of(prop))} | "
                f"{'yes' if field in required else 'no'} | {_cell(self.bounds(prop))} | "
                f"{_cell(text)} |"
            )
        if schema.get("additionalProperties") is False:
            rows.append("\nUnknown fields are refused.")
        return rows

    def section(self, name: str) -> str:
        """A schema's own section: its heading, what it is, its fields."""
        schema = self.schemas[name]
        lines = [self.heading(name), ""]
        if schema.get("description"):
            lines += [" ".join(schema["description"].split()), ""]
        if "properties" in schema:
            lines += self.fields(name)
        else:
            lines.append(f"{self.type_of(schema)} {self.bounds(schema)}".strip())
        return "\n".join(lines)

    def every_schema(self) -> str:
        """Every schema of the document, alphabetically."""
        return "\n\n".join(self.section(name) for name in sorted(self.schemas))


def _bounds(schema: Schema) -> list[str]:
    parts: list[str] = []
    for low, high, what in (
        ("minLength", "maxLength", "length"),
        ("minItems", "maxItems", "items"),
        ("minProperties", "maxProperties", "keys"),
        ("minimum", "maximum", "value"),
    ):
        lo, hi = schema.get(low), schema.get(high)
        if lo is not None and hi is not None:
            parts.append(f"{what} {lo}..{hi}")
        elif lo is not None:
            parts.append(f"{what} ≥ {lo}")
        elif hi is not None:
            parts.append(f"{what} ≤ {hi}")
    if "exclusiveMinimum" in schema:
        parts.append(f"value > {schema['exclusiveMinimum']}")
    if "exclusiveMaximum" in schema:
        parts.append(f"value < {schema['exclusiveMaximum']}")
    if "pattern" in schema:
        parts.append(f"pattern {_code(schema['pattern'])}")
    if "format" in schema:
        parts.append(f"format {schema['format']}")
    if "enum" in schema:
        parts.append("one of " + ", ".join(_code(v) for v in schema["enum"] if v is not None))
    return parts


def _body_of(renderer: Renderer, schema: Schema) -> list[str]:
    """A message's or body's schema: its type (linked), then each Struct it may be, field by
    field (a union's members keep their own sections)."""
    lines = [renderer.type_of(schema)]
    refs = [schema] if "$ref" in schema else schema.get("anyOf", []) + schema.get("oneOf", [])
    for member in refs:
        name = member.get("$ref", "").rsplit("/", 1)[-1]
        if "properties" in renderer.schemas.get(name, {}):
            if len(refs) > 1:
                lines += ["", f"`{name}`:"]
            lines += ["", *renderer.fields(name)]
    return lines


# -- the HTTP door ---------------------------------------------------------------------------


def http_reference(doc: dict[str, Any]) -> str:
    """Every route: what it does, its parameters, its body field by field, its answers; then
    every schema."""
    renderer = Renderer(doc, "HTTP")
    out: list[str] = []
    # Paths are relative to the document's server (`/api/v1`): headings show them whole.
    base = doc.get("servers", [{}])[0].get("url", "").rstrip("/")
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            out += [f"### `{method.upper()} {base}{path}`", ""]
            if op.get("summary"):
                out += [f"**{_cell(op['summary'])}.**", ""]
            if op.get("description"):
                out += [" ".join(op["description"].split()), ""]
            params = op.get("parameters", [])
            if params:
                out += [
                    "| parameter | in | type | required | bounds | description |",
                    "| --- | --- | --- | --- | --- | --- |",
                ]
                for p in params:
                    schema = p.get("schema", {})
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {_cell(renderer.type_of(schema))} | "
                        f"{'yes' if p.get('required') else 'no'} | "
                        f"{_cell(renderer.bounds(schema))} | {_cell(p.get('description', ''))} |"
                    )
                out.append("")
            for media, content in op.get("requestBody", {}).get("content", {}).items():
                out += [f"Body (`{media}`): " + "\n".join(_body_of(renderer, content["schema"]))]
                out.append("")
            out += ["| answer | body | meaning |", "| --- | --- | --- |"]
            for code, answer in sorted(op["responses"].items()):
                bodies = [
                    renderer.type_of(c["schema"])
                    for c in answer.get("content", {}).values()
                    if "schema" in c
                ]
                out.append(
                    f"| {code} | {_cell(', '.join(bodies))} | "
                    f"{_cell(answer.get('description', ''))} |"
                )
            out.append("")
    out += ["### Schemas (HTTP)", "", renderer.every_schema()]
    return "\n".join(out)


# -- the NATS door ---------------------------------------------------------------------------


def channel_heading(name: str, channel: dict[str, Any]) -> str:
    """A channel's heading: its address, or for a reply (no address) its name."""
    address = channel.get("address")
    return f"`{address}`" if address else f"`{name}` (the requester's inbox)"


def nats_reference(doc: dict[str, Any]) -> str:
    """Every subject: who sends, its parameters, each message field by field; then every
    schema."""
    renderer = Renderer(doc, "NATS")
    messages = doc.get("components", {}).get("messages", {})
    actions: dict[str, str] = {}
    for op in doc.get("operations", {}).values():
        name = op["channel"]["$ref"].rsplit("/", 1)[-1]
        actions[name] = "the host sends" if op["action"] == "send" else "the host receives"
    out: list[str] = []
    for name, channel in doc["channels"].items():
        out += [f"### {channel_heading(name, channel)}", ""]
        said = " ".join(channel.get("description", "").split())
        if name in actions:
            said = f"{said} ({actions[name]})" if said else actions[name].capitalize()
        if said:
            out += [said, ""]
        params = channel.get("parameters", {})
        if params:
            out += ["| parameter | description |", "| --- | --- |"]
            out += [f"| `{p}` | {_cell(v.get('description', ''))} |" for p, v in params.items()]
            out.append("")
        for ref in channel.get("messages", {}).values():
            key = ref["$ref"].rsplit("/", 1)[-1]
            message = messages.get(key, {})
            out += [f"**Message `{message.get('name', key)}`**", ""]
            if message.get("summary"):
                out += [" ".join(message["summary"].split()), ""]
            out += [*_body_of(renderer, message.get("payload", {})), ""]
    out += ["### Schemas (NATS)", "", renderer.every_schema()]
    return "\n".join(out)


def subjects_table() -> str:
    """Every subject of `schemas.subjects.TABLE`: its pattern, kind, handlers and meaning."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from schemas import subjects

    rows = ["| name | subject | kind | handled by | what |", "| --- | --- | --- | --- | --- |"]
    for name, subject in subjects.TABLE.items():
        rows.append(
            f"| `{name}` | `{subject.pattern}` | {subject.kind} | {', '.join(subject.handlers)} "
            f"| {_cell(subject.meaning)} |"
        )
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if HTTP_MARKER in markdown:
        doc = json.loads((ROOT / "schemas" / "openapi.json").read_text())
        markdown = markdown.replace(HTTP_MARKER, http_reference(doc))
    if NATS_MARKER in markdown:
        doc = json.loads((ROOT / "schemas" / "asyncapi.json").read_text())
        markdown = markdown.replace(NATS_MARKER, nats_reference(doc))
    if SUBJECTS_MARKER in markdown:
        markdown = markdown.replace(SUBJECTS_MARKER, subjects_table())
    return markdown
