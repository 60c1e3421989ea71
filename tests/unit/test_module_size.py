"""Modules stay small enough to read: a module of the runtime over the line budget is split by
responsibility (a package of private modules, or collaborators the owner holds), not grown.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 650  # lines
PACKAGES = ("services", "libs", "schemas", "writ", "actions")


def _lines(path: str) -> int:
    return len((ROOT / path).read_text(encoding="utf-8").splitlines())


def _modules() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", *(f"{p}/*.py" for p in PACKAGES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [p for p in out.splitlines() if (ROOT / p).is_file()]


def over_budget(paths: list[str]) -> dict[str, int]:
    """The modules of `paths` longer than the budget, with their lengths."""
    return {p: n for p in paths if (n := _lines(p)) > BUDGET}


def test_no_runtime_module_is_over_the_line_budget() -> None:
    modules = _modules()
    assert len(modules) > 100  # the scan found the tree
    over = over_budget(modules)
    assert not over, f"over {BUDGET} lines, split by responsibility: " + ", ".join(
        f"{p} ({n})" for p, n in sorted(over.items())
    )


def test_the_scan_counts_a_module_over_the_budget(tmp_path: Path) -> None:
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (BUDGET + 1))
    short = tmp_path / "short.py"
    short.write_text("x = 1\n" * BUDGET)
    assert over_budget([str(long), str(short)]) == {str(long): BUDGET + 1}
