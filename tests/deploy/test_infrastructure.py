"""The production NATS and PostgreSQL Writ documents: the official NATS chart rendered with
deploy/nats/values.yaml, and deploy/cloudnative-pg/cluster.yaml, each valid and agreeing with
what Writ's chart expects of them."""

from __future__ import annotations

import re
from typing import Any

import helm_python
import pytest
import yaml

from libs.db import role_name
from tests.deploy.k8s import (
    CHART,
    ROOT,
    by_kind,
    production_values,
    restricted_violations,
    selects,
    validate,
)
from writ.migrate import expected_versions

CLUSTER = ROOT / "deploy" / "cloudnative-pg" / "cluster.yaml"
NATS_VALUES = ROOT / "deploy" / "nats" / "values.yaml"
NATS_CHART = ROOT / "tests" / "deploy" / "charts" / "nats"


def _chart_defaults() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


@pytest.fixture(scope="module")
def cnpg() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(CLUSTER.read_text()) if d]


@pytest.fixture(scope="module")
def nats() -> list[dict[str, Any]]:
    chart = helm_python.Chart.load(NATS_CHART)
    rendered = chart.render(yaml.safe_load(NATS_VALUES.read_text()), name="nats", namespace="nats")
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]


def test_cloudnative_pg_objects_are_valid(cnpg: list[dict[str, Any]]) -> None:
    assert {o["kind"] for o in cnpg} == {"Cluster", "PodMonitor"}
    for obj in cnpg:
        validate(obj)


def test_postgres_is_three_instances_with_required_synchronous_replication(
    cnpg: list[dict[str, Any]],
) -> None:
    [cluster] = by_kind(cnpg, "Cluster")
    spec = cluster["spec"]
    assert spec["instances"] == 3
    sync = spec["postgresql"]["synchronous"]
    assert sync["number"] >= 1 and sync["dataDurability"] == "required"
    assert spec["affinity"]["podAntiAffinityType"] == "required"


def test_managed_roles_are_the_services_roles_with_their_secrets(
    cnpg: list[dict[str, Any]],
) -> None:
    [cluster] = by_kind(cnpg, "Cluster")
    pg = _chart_defaults()["postgres"]
    assert cluster["spec"]["bootstrap"]["initdb"]["database"] == pg["database"]
    assert cluster["spec"]["bootstrap"]["initdb"]["secret"]["name"] == pg["ownerSecret"]
    roles = {r["name"]: r for r in cluster["spec"]["managed"]["roles"]}
    expected = {role_name(pg["database"], s): s for s in expected_versions()}
    assert set(roles) == set(expected)
    for name, service in expected.items():
        role = roles[name]
        assert role["login"] and not role.get("superuser") and not role.get("createrole")
        assert role["passwordSecret"]["name"] == f"{pg['secretPrefix']}{service}"


def test_writ_chart_finds_the_cluster(cnpg: list[dict[str, Any]]) -> None:
    [cluster] = by_kind(cnpg, "Cluster")
    name = cluster["metadata"]["name"]
    for values in (_chart_defaults(), production_values()):
        pg = values["postgres"]
        assert pg["host"].split(".")[0] == f"{name}-rw"  # CloudNativePG's read-write Service
        assert pg["roles"] == "managed"
    assert selects(
        {"matchLabels": _chart_defaults()["postgres"]["podLabels"]},
        {"cnpg.io/cluster": name, "cnpg.io/podRole": "instance"},
    )


def test_nats_objects_are_valid(nats: list[dict[str, Any]]) -> None:
    assert {"StatefulSet", "ConfigMap", "Service", "PodDisruptionBudget", "PodMonitor"} <= {
        o["kind"] for o in nats
    }
    for obj in nats:
        validate(obj)


def test_nats_is_a_three_node_jetstream_cluster_syncing_always(nats: list[dict[str, Any]]) -> None:
    [statefulset] = by_kind(nats, "StatefulSet")
    assert statefulset["spec"]["replicas"] == 3
    [config] = by_kind(nats, "ConfigMap")
    conf = config["data"]["nats.conf"]
    assert re.search(r'"sync_interval":\s*"always"', conf), conf
    assert len(re.findall(r"nats://nats-\d\.nats-headless:6222", conf)) == 3
    assert '"store_dir": "/data"' in conf
    assert statefulset["spec"]["volumeClaimTemplates"], "JetStream must use file storage on a PVC"


def test_writ_streams_are_replicated_on_every_node(nats: list[dict[str, Any]]) -> None:
    [statefulset] = by_kind(nats, "StatefulSet")
    assert production_values()["nats"]["streamReplicas"] == statefulset["spec"]["replicas"]
    # The NetworkPolicies let Writ's pods reach exactly these pods.
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert selects({"matchLabels": _chart_defaults()["nats"]["podLabels"]}, labels)
    monitor = [
        s for s in by_kind(nats, "Service") if any(p["port"] == 8222 for p in s["spec"]["ports"])
    ]
    assert monitor, "KEDA reads consumer lag from the monitoring port"


def test_nats_pods_pass_restricted_and_admit_writs_pods(nats: list[dict[str, Any]]) -> None:
    [statefulset] = by_kind(nats, "StatefulSet")
    assert restricted_violations(statefulset["spec"]["template"]) == []
    [policy] = by_kind(nats, "NetworkPolicy")
    assert selects(
        policy["spec"]["podSelector"], statefulset["spec"]["template"]["metadata"]["labels"]
    )
    clients = [
        peer
        for rule in policy["spec"]["ingress"]
        if {"port": 4222, "protocol": "TCP"} in rule["ports"]
        for peer in rule["from"]
    ]
    assert any(
        selects(peer.get("podSelector", {}), {"app.kubernetes.io/name": "writ"}) for peer in clients
    )
