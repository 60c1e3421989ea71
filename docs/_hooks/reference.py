"""MkDocs hook: renders the committed OpenAPI and AsyncAPI documents into the reference page.

`docs/reference.md` holds two markers; each is replaced, at build time, by a table generated from
`schemas/openapi.json` (the HTTP door) or `schemas/asyncapi.json` (the NATS subjects), so the
page can never disagree with the contracts the tests check for drift. `docs/subjects.md` gets the
table of every subject from `schemas.subjects.TABLE` the same way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HTTP_MARKER = "<!-- reference: openapi -->"
NATS_MARKER = "<!-- reference: asyncapi -->"
SUBJECTS_MARKER = "<!-- reference: subjects -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _ref(schema: dict[str, Any]) -> str:
    ref = schema.get("$ref", "")
    return f"`{ref.rsplit('/', 1)[-1]}`" if ref else ""


def http_table(doc: dict[str, Any]) -> str:
    rows = ["| route | summary | body | answers |", "| --- | --- | --- | --- |"]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            body = op.get("requestBody", {}).get("content", {})
            body_ref = next((_ref(c.get("schema", {})) for c in body.values()), "")
            codes = ", ".join(sorted(op["responses"]))
            summary = op.get("summary") or op.get("description", "")
            rows.append(f"| `{method.upper()} {path}` | {_cell(summary)} | {body_ref} | {codes} |")
    return "\n".join(rows)


def nats_table(doc: dict[str, Any]) -> str:
    rows = ["| subject | direction | messages | what |", "| --- | --- | --- | --- |"]
    actions: dict[str, str] = {}
    for op in doc.get("operations", {}).values():
        name = op["channel"]["$ref"].rsplit("/", 1)[-1]
        actions[name] = "host sends" if op["action"] == "send" else "host receives"
    for name, channel in doc["channels"].items():
        messages = ", ".join(f"`{m}`" for m in channel.get("messages", {}))
        rows.append(
            f"| `{channel['address']}` | {actions.get(name, '')} | {messages} "
            f"| {_cell(channel.get('description', ''))} |"
        )
    return "\n".join(rows)


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
        markdown = markdown.replace(HTTP_MARKER, http_table(doc))
    if NATS_MARKER in markdown:
        doc = json.loads((ROOT / "schemas" / "asyncapi.json").read_text())
        markdown = markdown.replace(NATS_MARKER, nats_table(doc))
    if SUBJECTS_MARKER in markdown:
        markdown = markdown.replace(SUBJECTS_MARKER, subjects_table())
    return markdown
