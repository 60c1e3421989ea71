"""The alerting rules under `promtool`: they load, every page-level alert has a unit test that
makes it fire (tests/deploy/alerts/), and every page names its runbook in docs/runbooks.md.

promtool comes with Prometheus (Debian: `apt-get install prometheus`; .ci/run installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "observability" / "writ-alerts.yaml"
CASES = Path(__file__).resolve().parent / "alerts" / "writ-alerts.test.yaml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
RUNBOOK_BASE = "https://writ.invalid/docs/runbooks/#"

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (apt-get install prometheus): the alert rules' unit "
    "tests do not run",
)


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def pages() -> set[str]:
    return {r["alert"] for r in rules() if r["labels"]["severity"] == "page"}


def fired_in_cases() -> set[str]:
    cases = yaml.safe_load(CASES.read_text())["tests"]
    return {
        check["alertname"]
        for case in cases
        for check in case.get("alert_rule_test", [])
        if check.get("exp_alerts")
    }


@needs_promtool
def test_the_rules_load() -> None:
    done = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_every_page_fires_in_its_unit_test(tmp_path: Path) -> None:
    # promtool compares annotations verbatim: the cases run against the rules without them.
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "writ-alerts.yaml").write_text(yaml.safe_dump(doc))
    shutil.copy(CASES, tmp_path / CASES.name)
    done = subprocess.run(
        [str(PROMTOOL), "test", "rules", CASES.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert pages() - fired_in_cases() == set(), "page-level alerts without a case that fires them"


@needs_promtool
def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """The harness can fail: a case expecting the wrong service is reported."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "writ-alerts.yaml").write_text(yaml.safe_dump(doc))
    text = CASES.read_text().replace(
        "exp_labels: {severity: page, service: governance}\n",
        "exp_labels: {severity: page, service: ingress}\n",
        1,
    )
    (tmp_path / "bad.test.yaml").write_text(text)
    done = subprocess.run(
        [str(PROMTOOL), "test", "rules", "bad.test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "WritServiceDown" in done.stdout + done.stderr


def test_every_alert_is_written_once_and_names_its_runbook() -> None:
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names)), sorted(names)
    anchors = set(re.findall(r"^#+ .*\{#([a-z0-9-]+)\}", RUNBOOKS.read_text(), re.MULTILINE))
    for rule in rules():
        url = rule["annotations"].get("runbook_url", "")
        assert url.startswith(RUNBOOK_BASE), (rule["alert"], url)
        assert url.removeprefix(RUNBOOK_BASE) in anchors, (rule["alert"], url)


def test_the_service_is_a_label_not_part_of_a_name() -> None:
    services = "ingress|retrieval|planner|governance|admission|dispatcher"
    generic = re.compile(rf"writ_({services})_(messages_|handler_|consumer_|requests_|journal_)")
    for rule in rules():
        assert not generic.search(rule["expr"]), rule["alert"]
        assert "service" not in rule["labels"], rule["alert"]
