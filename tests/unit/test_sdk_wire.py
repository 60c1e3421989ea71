"""The SDK's private wire schemas (`writ_client._wire`) are the server's, made relative: they
cannot drift from `schemas/`, and nothing in the SDK reaches for the top-level package."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import msgspec

import schemas.api
import schemas.host
import schemas.sessions
import writ_client
import writ_client._wire.api
import writ_client._wire.host
import writ_client._wire.sessions

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "python" / "writ_client"


def _copier() -> ModuleType:
    spec = importlib.util.spec_from_file_location("copy_wire", PACKAGE.parent / "copy_wire.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["copy_wire"] = module
    spec.loader.exec_module(module)
    return module


def test_the_copy_is_what_schemas_renders_now() -> None:
    rendered: dict[str, str] = _copier().render(ROOT)
    on_disk = {p.name: p.read_text() for p in (PACKAGE / "_wire").glob("*.py")}
    stale = sorted(n for n in rendered if rendered[n] != on_disk.get(n))
    extra = sorted(set(on_disk) - set(rendered))
    assert (stale, extra) == ([], []), "run: python clients/python/copy_wire.py"


def test_the_sdk_imports_no_top_level_schemas() -> None:
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            assert not [n for n in names if n.split(".")[0] == "schemas"], path


def test_the_sdk_and_the_server_describe_the_same_messages() -> None:
    for ours, theirs in (
        (writ_client._wire.host.RunRequest, schemas.host.RunRequest),
        (writ_client._wire.host.RunResult, schemas.host.RunResult),
        (writ_client._wire.host.SubmitCommand, schemas.host.SubmitCommand),
        (writ_client._wire.host.CommandResult, schemas.host.CommandResult),
        (writ_client._wire.api.RunView, schemas.api.RunView),
        (writ_client._wire.sessions.HostSessionOp, schemas.sessions.HostSessionOp),
    ):
        assert msgspec.json.schema(ours) == msgspec.json.schema(theirs), ours.__name__
    # What the SDK hands back is its own Struct, not the server's.
    assert writ_client.RunResult is writ_client._wire.host.RunResult
