"""Copy the host contract's wire schemas into the SDK (`writ_client/_wire/`).

The SDK carries its own private copy of the Structs it sends and decodes, so a host installs
it without a top-level `schemas` package that could collide with its own. The copy is the
repository's `schemas/` modules with their imports made relative, nothing else: a unit test
(tests/unit/test_sdk_wire.py) renders it again and fails on any difference, so it cannot drift.

    python clients/python/copy_wire.py     # after changing one of MODULES in schemas/
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Final

# The host contract and everything it imports (msgspec and the stdlib aside).
MODULES: Final = (
    "api",
    "base",
    "control",
    "governance",
    "host",
    "host_reads",
    "planner",
    "reads",
    "sessions",
    "subjects",
    "_subjects",
)
ROOT: Final = Path(__file__).resolve().parents[2]
TARGET: Final = Path(__file__).resolve().parent / "writ_client" / "_wire"
_IMPORT: Final = re.compile(r"^from schemas\.(\w+) import", re.MULTILINE)
_HEADER: Final = "# A copy of schemas/{name}.py made by clients/python/copy_wire.py: do not edit.\n"
_INIT: Final = '''"""The SDK's own copy of Writ's wire schemas (clients/python/copy_wire.py)."""
'''


def render(root: Path = ROOT) -> dict[str, str]:
    """Each file of `_wire/`, by name, as the repository's `schemas/` makes it."""
    files = {"__init__.py": _INIT}
    for name in MODULES:
        source = (root / "schemas" / f"{name}.py").read_text()
        imported = set(_IMPORT.findall(source))
        if not imported <= set(MODULES):
            raise SystemExit(f"schemas/{name}.py imports {sorted(imported - set(MODULES))}")
        if re.search(r"^\s*(from schemas import|import schemas)", source, re.MULTILINE):
            raise SystemExit(f"schemas/{name}.py imports the schemas package itself")
        files[f"{name}.py"] = _HEADER.format(name=name) + _IMPORT.sub(r"from .\1 import", source)
    return files


def main() -> None:
    """Write `_wire/` afresh."""
    TARGET.mkdir(exist_ok=True)
    for stale in TARGET.glob("*.py"):
        stale.unlink()
    for name, text in render().items():
        (TARGET / name).write_text(text)
    print(f"wrote {len(MODULES) + 1} files to {TARGET}", file=sys.stderr)


if __name__ == "__main__":
    main()
