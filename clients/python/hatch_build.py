"""The SDK's wheel carries the repository's `schemas/` package (the host contract's Structs);
an editable install leaves it where it is, so the repository's copy is the only one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):
    """Force-include `../../schemas` in a standard wheel only."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "standard":
            schemas = Path(self.root).resolve().parent.parent / "schemas"
            build_data["force_include"][str(schemas)] = "schemas"
