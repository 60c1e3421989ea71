"""The committed host contracts beside the JSON Schemas: `schemas/openapi.json` (the HTTP door)
and `schemas/asyncapi.json` (the NATS door). `make schemas` rewrites them; a test fails when
they drift from the code."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

__all__ = ["CONTRACTS", "FOLDER", "check_contracts", "write_contracts"]

FOLDER: Final = Path(__file__).resolve().parent.parent / "schemas"


def _openapi() -> str:
    from services.ingress.http import openapi_document

    return openapi_document()


def _asyncapi() -> str:
    from writ.asyncapi import asyncapi_document

    return asyncapi_document()


CONTRACTS: Final[dict[str, Callable[[], str]]] = {
    "openapi.json": _openapi,
    "asyncapi.json": _asyncapi,
}


def write_contracts(folder: Path = FOLDER) -> list[Path]:
    """Write each contract document; returns the files written."""
    written = []
    for name, render in CONTRACTS.items():
        path = folder / name
        path.write_text(render())
        written.append(path)
    return written


def check_contracts(folder: Path = FOLDER) -> list[str]:
    """How the committed contracts differ from the code (empty when they agree)."""
    drift = []
    for name, render in CONTRACTS.items():
        path = folder / name
        if not path.exists():
            drift.append(f"{path} is missing: run `make schemas`")
        elif path.read_text() != render():
            drift.append(f"{path} differs from the code: run `make schemas`")
    return drift
