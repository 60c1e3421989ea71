"""The Grafana dashboard (deploy/observability/writ-dashboard.json) shows one installation at a
time: it has `namespace` and `release` variables, and every series a target reads is filtered by
both, so two installations scraped by one Prometheus never add up on the same panel."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from tests.deploy.k8s import ROOT

DASHBOARD = ROOT / "deploy" / "observability" / "writ-dashboard.json"
# A series selector: a metric name (writ_* or up) with its optional {matchers}, not a function.
SELECTOR = re.compile(r"(?<![A-Za-z0-9_:\"$])(writ_[A-Za-z0-9_:]+|up)(\{[^}]*\})?(?!\s*\()")
SCOPE = ('namespace=~"$namespace"', 'release=~"$release"')


def _targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop()
        panels.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield panel.get("title", ""), target["expr"]


def test_the_dashboard_chooses_a_namespace_and_a_release() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for name in ("namespace", "release"):
        variable = variables[name]
        assert variable["type"] == "query"
        assert variable["includeAll"] and variable["allValue"] == ".*"
        assert f", {name})" in variable["query"]["query"]
    # Releases are those of the chosen namespaces.
    assert '$namespace"' in variables["release"]["query"]["query"]


def test_every_series_a_panel_reads_is_scoped_to_the_chosen_installation() -> None:
    unscoped = [
        (title, match.group(0))
        for title, expr in _targets(json.loads(DASHBOARD.read_text()))
        for match in SELECTOR.finditer(expr)
        if not all(part in (match.group(2) or "") for part in SCOPE)
    ]
    assert unscoped == []
    assert sum(1 for _ in _targets(json.loads(DASHBOARD.read_text()))) > 40
