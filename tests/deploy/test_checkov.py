"""checkov's Kubernetes checks, offline, on Writ's chart rendered with default and production
values and on the NATS chart with deploy/nats/values.yaml: nothing fails but the exceptions
deploy/checkov-exceptions.yaml lists and justifies."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import helm_python
import pytest
import yaml

from tests.deploy.k8s import ROOT, production_values, render

EXCEPTIONS = ROOT / "deploy" / "checkov-exceptions.yaml"
NATS_CHART = ROOT / "tests" / "deploy" / "charts" / "nats"


def _checkov() -> str:
    found = shutil.which("checkov", path=str(Path(sys.executable).parent))
    assert found, "checkov not installed: `make setup` installs the dev group"
    return found


def _nats() -> list[dict]:
    rendered = helm_python.Chart.load(NATS_CHART).render(
        yaml.safe_load((ROOT / "deploy" / "nats" / "values.yaml").read_text()),
        name="nats",
        namespace="nats",
    )
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("what", ["writ", "nats"])
def test_checkov_fails_nothing_but_the_listed_exceptions(tmp_path: Path, what: str) -> None:
    if what == "writ":
        (tmp_path / "default.yaml").write_text(yaml.safe_dump_all(render()))
        (tmp_path / "production.yaml").write_text(yaml.safe_dump_all(render(production_values())))
    else:
        (tmp_path / "nats.yaml").write_text(yaml.safe_dump_all(_nats()))
    result = subprocess.run(
        [
            _checkov(),
            "-d",
            str(tmp_path),
            "--framework",
            "kubernetes",
            "--skip-download",
            "--quiet",
            "--compact",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    report = json.loads(result.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report["summary"]["resource_count"] > 5, report["summary"]
    failed: dict[str, set[str]] = {}
    for check in report["results"]["failed_checks"]:
        failed.setdefault(check["check_id"], set()).add(check["resource"])
    allowed = yaml.safe_load(EXCEPTIONS.read_text())[what]
    unexpected = {k: sorted(v) for k, v in failed.items() if k not in allowed}
    assert not unexpected, unexpected
    stale = set(allowed) - set(failed)
    assert not stale, f"exceptions no longer needed, remove them: {sorted(stale)}"
    assert all(len(reason) > 40 for reason in allowed.values())
