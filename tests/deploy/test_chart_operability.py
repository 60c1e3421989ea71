"""What the chart gives the people running it: ingress drains before it stops (a preStop delay
within the grace period), `helm test` proves the deployment answers, and NOTES.txt says what
was installed and what is still closed. Rendered offline."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.k8s import (
    by_kind,
    component,
    policies_for,
    render,
    render_notes,
    restricted_violations,
    validate,
)


def _deployment(objects: list[dict[str, Any]], service: str) -> dict[str, Any]:
    [found] = [o for o in by_kind(objects, "Deployment") if component(o) == service]
    return found


def test_ingress_keeps_serving_while_it_is_taken_out_of_rotation() -> None:
    objects = render()
    ingress = _deployment(objects, "ingress")["spec"]["template"]["spec"]
    planner = _deployment(objects, "planner")["spec"]["template"]["spec"]
    [container] = ingress["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command == ["python3", "-c", "import time; time.sleep(10)"]
    # The delay comes on top of the drain: the grace period grows by it, for ingress only.
    assert ingress["terminationGracePeriodSeconds"] == planner["terminationGracePeriodSeconds"] + 10
    assert "lifecycle" not in planner["containers"][0]

    longer = render({"services": {"ingress": {"http": {"preStopSeconds": 25}}}})
    spec = _deployment(longer, "ingress")["spec"]["template"]["spec"]
    assert spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1].endswith("(25)")
    none = render({"services": {"ingress": {"http": {"preStopSeconds": 0}}}})
    assert (
        "lifecycle" not in _deployment(none, "ingress")["spec"]["template"]["spec"]["containers"][0]
    )


def test_helm_test_asks_ingress_for_its_api_and_is_let_through() -> None:
    objects = render()
    [pod] = by_kind(objects, "Pod")
    validate(pod)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert restricted_violations(pod) == []
    script = pod["spec"]["containers"][0]["command"][-1]
    assert "http://writ-ingress:8080/api/v1/openapi.json" in script
    # Its own policy confines the test pod: nothing reaches it, it reaches DNS and ingress's
    # HTTP port only; another admits it to that port, and only it.
    labels = pod["metadata"]["labels"]
    [own] = policies_for(objects, labels)
    validate(own)
    assert own["spec"]["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in own["spec"]
    dns, http = own["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert http["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert http["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "ingress"
    [policy] = [
        o for o in by_kind(objects, "NetworkPolicy") if o["metadata"]["name"] == "writ-test-api"
    ]
    validate(policy)
    [rule] = policy["spec"]["ingress"]
    assert rule["from"] == [
        {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "writ-test",
                    "app.kubernetes.io/instance": "writ",
                }
            }
        }
    ]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "ingress"

    closed = render({"services": {"ingress": {"http": {"enabled": False}}}})
    assert by_kind(closed, "Pod") == []


def test_notes_say_what_was_installed_and_what_is_still_closed() -> None:
    notes = render_notes()
    assert "helm test writ -n writ" in notes
    assert "http://writ-ingress.writ.svc:8080/api/v1" in notes
    assert "networkPolicy.hosts is empty" in notes
    assert "migrate-1" in notes
    opened = render_notes({"networkPolicy": {"hosts": [{"namespaceSelector": {}}]}})
    assert "networkPolicy.hosts is empty" not in opened


def test_keda_with_no_tenant_yet_renders_valid_scaled_objects() -> None:
    objects = render({"keda": {"enabled": True}, "tenants": []})
    scaled = by_kind(objects, "ScaledObject")
    assert len(scaled) == 6
    for obj in scaled:
        validate(obj)
        assert obj["spec"]["triggers"], component(obj)
    [ingress] = [o for o in scaled if component(o) == "ingress"]
    assert [t["type"] for t in ingress["spec"]["triggers"]] == ["cpu"]
    tenants = render({"keda": {"enabled": True}, "tenants": ["acme", "globex"]})
    [ingress] = [o for o in by_kind(tenants, "ScaledObject") if component(o) == "ingress"]
    watched = [
        (t["metadata"]["stream"], t["metadata"]["consumer"]) for t in ingress["spec"]["triggers"]
    ]
    assert watched == [
        (f"WRIT_IN_{tenant}", durable)
        for tenant in ("acme", "globex")
        for durable in ("ingress", "ingress-runs")
    ]


def test_the_pod_monitor_labels_every_target_with_its_service() -> None:
    """WritServiceDown groups Prometheus's own `up` by `service`: the scrape must set it."""
    [monitor] = by_kind(render({"monitoring": {"podMonitor": {"enabled": True}}}), "PodMonitor")
    validate(monitor)
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True
    targets = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert targets == {
        "service": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
        "release": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
    }


def test_alert_rules_link_to_the_runbooks_where_the_docs_are_served() -> None:
    base = "https://docs.example.com/writ/runbooks/"
    rule_on = {"monitoring": {"prometheusRule": {"enabled": True, "runbookBaseUrl": base}}}
    [rule] = by_kind(render(rule_on), "PrometheusRule")
    pages = [
        r for g in rule["spec"]["groups"] for r in g["rules"] if r["labels"]["severity"] == "page"
    ]
    assert pages and all(r["annotations"]["runbook_url"].startswith(base + "#") for r in pages)
    assert "writ.invalid" not in str(rule)


@pytest.mark.parametrize("base", ["", "docs.example.com/runbooks/", "https://x/runbooks"])
def test_alert_rules_without_a_runbook_address_are_refused(base: str) -> None:
    with pytest.raises(Exception, match="runbookBaseUrl"):
        render({"monitoring": {"prometheusRule": {"enabled": True, "runbookBaseUrl": base}}})
