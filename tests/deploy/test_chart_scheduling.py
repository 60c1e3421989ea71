"""The chart schedules like the reference charts: node selectors, tolerations, affinity, spread
across zones and nodes, a priority class, pod annotations and labels, extra environment and
volumes (a CSI secrets-store volume among them), chart-wide with a service's own on top, all
validated by the values schema. Rendered offline."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.k8s import by_kind, component, render, validate

SCHEDULING: dict[str, Any] = {
    "nodeSelector": {"pool": "writ"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "writ", "effect": "NoSchedule"}
    ],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "arch", "operator": "In", "values": ["amd64"]}]}
                ]
            }
        }
    },
    "priorityClassName": "writ-critical",
    "podAnnotations": {"example.org/owner": "platform"},
    "podLabels": {"team": "platform"},
    "extraEnv": [
        {"name": "WRIT_LOG_LEVEL", "value": "debug"},
        {
            "name": "REGION",
            "valueFrom": {"configMapKeyRef": {"name": "cluster-info", "key": "region"}},
        },
    ],
    "extraVolumes": [
        {
            "name": "vault",
            "csi": {
                "driver": "secrets-store.csi.k8s.io",
                "readOnly": True,
                "volumeAttributes": {"secretProviderClass": "writ"},
            },
        }
    ],
    "extraVolumeMounts": [{"name": "vault", "mountPath": "/mnt/vault", "readOnly": True}],
}


def _pod(objects: list[dict[str, Any]], service: str) -> dict[str, Any]:
    [deployment] = [o for o in by_kind(objects, "Deployment") if component(o) == service]
    return dict(deployment["spec"]["template"])


def test_by_default_replicas_spread_across_zones_and_nodes() -> None:
    objects = render()
    for deployment in by_kind(objects, "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        spread = {
            c["topologyKey"]: c["whenUnsatisfiable"] for c in spec["topologySpreadConstraints"]
        }
        assert spread == {
            "topology.kubernetes.io/zone": "ScheduleAnyway",
            "kubernetes.io/hostname": "DoNotSchedule",
        }
        for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
            assert key not in spec, key
        assert "annotations" not in deployment["spec"]["template"]["metadata"]


def test_chart_wide_scheduling_reaches_every_pod_and_a_service_overrides_it() -> None:
    objects = render(
        {
            "scheduling": SCHEDULING,
            "services": {
                "planner": {
                    "scheduling": {
                        "nodeSelector": {"pool": "planner"},
                        "podAnnotations": {"example.org/cost": "llm"},
                    }
                }
            },
        }
    )
    deployments = by_kind(objects, "Deployment")
    assert len(deployments) == 6
    for deployment in deployments:
        validate(deployment)
        name = component(deployment)
        pod = _pod(objects, name)
        spec = pod["spec"]
        assert spec["priorityClassName"] == "writ-critical"
        assert spec["tolerations"] == SCHEDULING["tolerations"]
        assert spec["affinity"] == SCHEDULING["affinity"]
        assert pod["metadata"]["labels"]["team"] == "platform"
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == name
        [container] = spec["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["WRIT_LOG_LEVEL"]["value"] == "debug"
        assert env["REGION"]["valueFrom"]["configMapKeyRef"]["name"] == "cluster-info"
        assert {"name": "vault", "mountPath": "/mnt/vault", "readOnly": True} in container[
            "volumeMounts"
        ]
        [vault] = [v for v in spec["volumes"] if v["name"] == "vault"]
        assert vault["csi"]["driver"] == "secrets-store.csi.k8s.io"
        if name == "planner":
            assert spec["nodeSelector"] == {"pool": "planner"}
            assert pod["metadata"]["annotations"] == {
                "example.org/owner": "platform",
                "example.org/cost": "llm",
            }
        else:
            assert spec["nodeSelector"] == {"pool": "writ"}
            assert pod["metadata"]["annotations"] == {"example.org/owner": "platform"}


@pytest.mark.parametrize(
    "values",
    [
        {"scheduling": {"nodeSelectors": {"pool": "writ"}}},  # a misspelt key
        {"scheduling": {"podLabels": {"app.kubernetes.io/component": "x"}}},  # the selector's
        {"services": {"planner": {"scheduling": {"extraEnv": [{"value": "no name"}]}}}},
        {"scheduling": {"extraVolumeMounts": [{"name": "v", "mountPath": "relative"}]}},
        {"topologySpread": {"hostnameWhenUnsatisfiable": "Sometimes"}},
    ],
)
def test_the_values_schema_refuses_what_would_not_schedule(values: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="(?i)schema|valid"):
        render(values)
