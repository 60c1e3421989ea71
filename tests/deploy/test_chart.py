"""The Helm chart, rendered offline with default and production values: every object valid,
every pod admitted by Pod Security "restricted", and the isolation the design promises."""

from __future__ import annotations

import copy
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import msgspec
import pytest
import yaml

from tests.deploy.k8s import (
    CHART,
    KUBERNETES_VERSION,
    ROOT,
    by_kind,
    component,
    egress_cidrs,
    pod_templates,
    policies_for,
    production_values,
    render,
    restricted_violations,
    validate,
)

SERVICES = ("ingress", "retrieval", "planner", "governance", "admission", "dispatcher")
JOURNALS = ("planner", "governance", "admission", "dispatcher")
WITH_DATABASE = ("retrieval", "planner", "governance", "admission", "dispatcher")
VALUES = {"default": None, "production": "production"}


@pytest.fixture(scope="module", params=list(VALUES))
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(production_values() if VALUES[request.param] else None)


@pytest.fixture(scope="module")
def production() -> list[dict[str, Any]]:
    return render(production_values())


def _deployment(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [found] = [d for d in by_kind(objects, "Deployment") if component(d) == name]
    return found


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _secrets(template: dict[str, Any]) -> set[str]:
    return {v["secret"]["secretName"] for v in template["spec"].get("volumes", []) if "secret" in v}


# -- the chart as Helm sees it ---------------------------------------------------------------


def test_helm_lint_is_clean() -> None:
    for values in (None, production_values()):
        report = helm_python.lint(CHART, values, strict=True, kube_version=f"v{KUBERNETES_VERSION}")
        assert report["errors"] == [] and report["messages"] == [], report


@pytest.mark.parametrize(
    "bad",
    [
        {"nats": {"streamReplicas": 2}},
        {"services": {"dispatcher": {"bogus": True}}},
        {"postgres": {"roles": "superuser"}},
        {"networkPolicy": {"connectors": {"cidrs": ["not-a-cidr"], "ports": [443]}}},
        {"networkPolicy": {"hostApi": {"cidrs": ["0.0.0.0"], "ports": [443]}}},
        {"networkPolicy": {"mcpServers": {"cidrs": ["192.0.2.0/24"], "ports": [0]}}},
        {"networkPolicy": {"hostApi": {"cidrs": [], "ports": [443], "any": True}}},
    ],
)
def test_values_schema_rejects_what_would_misconfigure(bad: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render(bad)


def test_every_object_is_valid_for_its_kind(rendered: list[dict[str, Any]]) -> None:
    kinds = {o["kind"] for o in rendered}
    assert {"Deployment", "PodDisruptionBudget", "Job", "NetworkPolicy", "ServiceAccount"} <= kinds
    for obj in rendered:
        validate(obj)


def test_validation_is_strict_for_built_in_and_custom_kinds(
    production: list[dict[str, Any]],
) -> None:
    deployment = copy.deepcopy(_deployment(production, "planner"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    [scaled] = [o for o in by_kind(production, "ScaledObject") if component(o) == "planner"]
    scaled = copy.deepcopy(scaled)
    scaled["spec"]["minReplicas"] = 3  # the field is minReplicaCount
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)


def test_production_renders_every_custom_resource(production: list[dict[str, Any]]) -> None:
    kinds = [o["kind"] for o in production]
    assert kinds.count("ScaledObject") == len(SERVICES)
    assert {"PodMonitor", "PrometheusRule"} <= set(kinds)


# -- Pod Security "restricted" ---------------------------------------------------------------


def test_every_pod_passes_restricted(rendered: list[dict[str, Any]]) -> None:
    templates = list(pod_templates(rendered))
    assert len(templates) == len(SERVICES) + 1  # the services and the migrate Job
    for obj, template in templates:
        assert restricted_violations(template) == [], obj["metadata"]["name"]


@pytest.mark.parametrize(
    "change, why",
    [
        (
            lambda s: s["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
            "allowPrivilegeEscalation",
        ),
        (
            lambda s: (
                s["securityContext"].pop("seccompProfile")
                and [
                    c["securityContext"].pop("seccompProfile")
                    for c in s["containers"] + s.get("initContainers", [])
                ]
            ),
            "seccompProfile",
        ),
        (
            lambda s: s["containers"][0]["securityContext"]["capabilities"].update(
                add=["NET_ADMIN"]
            ),
            "adds capabilities",
        ),
        (lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "volume h"),
        (lambda s: s["containers"][0]["securityContext"].update(runAsUser=0), "uid 0"),
        (lambda s: s.update(hostNetwork=True), "hostNetwork"),
    ],
)
def test_the_restricted_check_catches_violations(
    production: list[dict[str, Any]], change: Any, why: str
) -> None:
    template = copy.deepcopy(_deployment(production, "dispatcher")["spec"]["template"])
    change(template["spec"])
    assert any(why in v for v in restricted_violations(template))


# -- the Deployments -------------------------------------------------------------------------


def test_each_service_has_probes_resources_and_a_pdb(rendered: list[dict[str, Any]]) -> None:
    pdbs = {component(p): p for p in by_kind(rendered, "PodDisruptionBudget")}
    for name in SERVICES:
        deployment = _deployment(rendered, name)
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        assert container["args"] == ["service", name]
        port = int(_env(container)["WRIT_METRICS_PORT"])
        assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == port
        assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert container["startupProbe"]["httpGet"]["path"] == "/livez"
        assert container["resources"]["requests"] and container["resources"]["limits"]
        assert (
            pdbs[name]["spec"]["selector"]["matchLabels"]
            == deployment["spec"]["selector"]["matchLabels"]
        )


def test_grace_period_outlasts_drain_and_span_flush(rendered: list[dict[str, Any]]) -> None:
    for name in SERVICES:
        spec = _deployment(rendered, name)["spec"]["template"]["spec"]
        env = _env(spec["containers"][0])
        drain = float(env["WRIT_DRAIN_TIMEOUT_S"])
        flush = float(env["OTEL_BSP_EXPORT_TIMEOUT"]) / 1000
        # libs/runtime.serve: handlers for up to the drain timeout, then the NATS drain for as
        # long again, then the tracer provider's flush.
        assert spec["terminationGracePeriodSeconds"] > 2 * drain + flush


def test_services_with_a_database_wait_for_migrations(rendered: list[dict[str, Any]]) -> None:
    for name in SERVICES:
        spec = _deployment(rendered, name)["spec"]["template"]["spec"]
        inits = spec.get("initContainers", [])
        if name not in WITH_DATABASE:
            assert inits == []
            continue
        [init] = inits
        assert init["args"][:3] == ["migrate", "--check", "--wait"]
        assert _env(init)["WRIT_DATABASE_URL"] == _env(spec["containers"][0])["WRIT_DATABASE_URL"]
        assert f"_{name}@" in _env(init)["WRIT_DATABASE_URL"]  # as the service's own role


def test_every_setting_the_chart_gives_a_service_is_one_it_reads(
    rendered: list[dict[str, Any]],
) -> None:
    import importlib

    every: set[str] = set()
    pending: dict[str, set[str]] = {}
    for name in SERVICES:
        module = importlib.import_module(f"services.{name}.__main__")
        [settings] = [
            v
            for k, v in vars(module).items()
            if k.endswith("Settings") and isinstance(v, type) and v.__module__ == module.__name__
        ]
        fields = {f"WRIT_{f.encode_name.upper()}" for f in msgspec.structs.fields(settings)}
        container = _deployment(rendered, name)["spec"]["template"]["spec"]["containers"][0]
        unknown = (
            {k for k in _env(container) if k.startswith("WRIT_")}
            - fields
            - every
            - pending.get(name, set())
        )
        assert not unknown, f"{name} has no setting for {unknown}"


def test_keda_consumers_are_the_services_own() -> None:
    from services.admission.service import INBOX as admission
    from services.dispatcher.service import inbox
    from services.governance.service import INBOX as governance
    from services.planner.service import INBOX as planner

    specs = {
        "admission": admission,
        "governance": governance,
        "planner": planner,
        "dispatcher": inbox(30.0),
    }
    objects = render(production_values())
    scaled = {component(o): o for o in by_kind(objects, "ScaledObject")}
    # Retrieval consumes no stream (it answers requests only): KEDA scales it on its CPU.
    assert scaled["retrieval"]["spec"]["triggers"] == [
        {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "70"}}
    ]
    assert "replicas" not in _deployment(objects, "retrieval")["spec"]
    for name, spec in specs.items():
        [trigger] = scaled[name]["spec"]["triggers"]
        assert trigger["type"] == "nats-jetstream"
        assert (trigger["metadata"]["stream"], trigger["metadata"]["consumer"]) == (
            spec.stream,
            spec.durable,
        )
        assert (
            scaled[name]["spec"]["scaleTargetRef"]["name"]
            == _deployment(objects, name)["metadata"]["name"]
        )
        # KEDA owns the replica count: the Deployment must not fight it.
        assert "replicas" not in _deployment(objects, name)["spec"]


def test_keda_watches_each_tenants_stream_of_a_per_tenant_consumer() -> None:
    from services.ingress.service import inbox, runs_inbox

    objects = render({"keda": {"enabled": True}, "tenants": ["acme", "globex"]})
    [ingress] = [o for o in by_kind(objects, "ScaledObject") if component(o) == "ingress"]
    # Both of ingress's consumers of each tenant: its run requests' lag scales it too.
    assert [
        (t["metadata"]["stream"], t["metadata"]["consumer"]) for t in ingress["spec"]["triggers"]
    ] == [
        (spec.stream, spec.durable)
        for t in ("acme", "globex")
        for spec in (inbox(t), runs_inbox(t))
    ]
    for obj in objects:
        validate(obj)


def test_keda_scales_ingress_on_its_http_load_too() -> None:
    address = "http://prometheus.monitoring:9090"
    objects = render(
        {
            "keda": {"enabled": True, "http": {"prometheusServerAddress": address}},
            "tenants": ["acme"],
        }
    )
    scaled = {component(o): o for o in by_kind(objects, "ScaledObject")}
    http = [t for t in scaled["ingress"]["spec"]["triggers"] if t["type"] == "prometheus"]
    assert [t["metadata"]["query"].split("{")[0] for t in http] == [
        "sum(writ_http_requests_in_flight",
        "sum(rate(writ_http_requests_total",
    ]
    assert all(t["metadata"]["serverAddress"] == address for t in http)
    assert all('service="ingress"' in t["metadata"]["query"] for t in http)
    assert [t["metadata"]["threshold"] for t in http] == ["20", "50"]
    # The stream trigger stays; no other service watches HTTP.
    assert [t["type"] for t in scaled["ingress"]["spec"]["triggers"]][0] == "nats-jetstream"
    assert all(
        t["type"] != "prometheus"
        for name, o in scaled.items()
        if name != "ingress"
        for t in o["spec"]["triggers"]
    )
    for obj in objects:
        validate(obj)


def test_keda_is_off_by_default() -> None:
    objects = render()
    assert not by_kind(objects, "ScaledObject")
    assert all(d["spec"]["replicas"] >= 2 for d in by_kind(objects, "Deployment"))


# -- the migrate Job -------------------------------------------------------------------------


def test_migrate_is_a_hook_by_default_and_a_plain_job_on_request() -> None:
    [hook] = by_kind(render(), "Job")
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    [plain] = by_kind(render({"migrate": {"hook": False}}, revision=7), "Job")
    assert "annotations" not in plain["metadata"]
    assert plain["metadata"]["name"].endswith("-migrate-7")


def test_migrate_runs_as_the_owner_with_every_role_password(rendered: list[dict[str, Any]]) -> None:
    [job] = by_kind(rendered, "Job")
    spec = job["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert container["args"][0] == "migrate"
    env = {e["name"]: e for e in container["env"]}
    assert env["WRIT_ADMIN_DATABASE_URL"]["value"].startswith("postgresql://writ@")
    mounted = {m["mountPath"] for m in container["volumeMounts"]}
    roles_dir = env["WRIT_ROLE_PASSWORDS_DIR"]["value"]
    assert {f"{roles_dir}/{name}" for name in WITH_DATABASE} <= mounted
    # It mounts database credentials only (and, for provisioning the bus, the NATS users
    # `provision`'s and `provision-audit`'s passwords): no journal key, no connector or model
    # secret.
    assert all(
        s in ("writ-db-app", "writ-nats-provision", "writ-nats-provision-audit")
        or s.startswith("writ-pg-")
        for s in _secrets(job["spec"]["template"])
    )


def test_the_migrate_job_provisions_the_bus_first(production: list[dict[str, Any]]) -> None:
    # Streams, consumers and buckets are made by provisioning alone, before any service binds.
    [job] = by_kind(production, "Job")
    spec = job["spec"]["template"]["spec"]
    [init] = spec["initContainers"]
    assert init["args"][:2] == ["nats", "provision"]
    env = _env(init)
    assert env["WRIT_NATS_URL"] and env["WRIT_STREAM_REPLICAS"]
    if "WRIT_NATS_PASSWORD_FILE" in env:
        mounted = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
        assert set(mounted) == {"nats-provision", "nats-provision-audit"}
        # The audit record is provisioned in its own account, by that account's identity.
        assert env["WRIT_AUDIT_NATS_PASSWORD_FILE"].startswith(mounted["nats-provision-audit"])
        secrets = _secrets(job["spec"]["template"])
        assert {"writ-nats-provision", "writ-nats-provision-audit"} <= secrets


# -- isolation -------------------------------------------------------------------------------


def test_only_the_dispatcher_mounts_connector_secrets(rendered: list[dict[str, Any]]) -> None:
    for obj, template in pod_templates(rendered):
        connectors = {s for s in _secrets(template) if s.startswith("writ-connector-")}
        if component(obj) == "dispatcher":
            assert connectors
        else:
            assert not connectors, component(obj)


def test_only_admission_mounts_the_receipt_signing_key(rendered: list[dict[str, Any]]) -> None:
    # The dispatcher forwards approval receipts; it must not be able to sign one.
    for obj, template in pod_templates(rendered):
        signing = "writ-receipt-signing" in _secrets(template)
        assert signing == (component(obj) == "admission"), component(obj)


def test_only_ingress_mounts_the_operators_key(rendered: list[dict[str, Any]]) -> None:
    """The operators' public key (who may open the console's MCP pages and classify MCP tools)
    is ingress's alone, read-only, where WRIT_OPERATORS_KEY_FILE says; no pod mounts anything
    of the operators' signing half."""
    for obj, template in pod_templates(rendered):
        secrets = _secrets(template)
        assert not [s for s in secrets if "signing" in s and "operators" in s], component(obj)
        assert ("writ-operators-key" in secrets) == (component(obj) == "ingress"), component(obj)
        for container in template["spec"]["containers"]:
            if component(obj) != "ingress":
                assert "WRIT_OPERATORS_KEY_FILE" not in _env(container), component(obj)
    template = _deployment(rendered, "ingress")["spec"]["template"]
    [volume] = [
        v
        for v in template["spec"]["volumes"]
        if v.get("secret", {}).get("secretName") == "writ-operators-key"
    ]
    # Optional: without the Secret ingress starts and lets nobody in as an operator.
    assert volume["secret"]["optional"] is True
    [container] = template["spec"]["containers"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert _env(container)["WRIT_OPERATORS_KEY_FILE"] == f"{mount['mountPath']}/operators-key.pem"


def test_the_planner_mounts_no_credential_but_the_model_key(rendered: list[dict[str, Any]]) -> None:
    template = _deployment(rendered, "planner")["spec"]["template"]
    allowed = {
        "writ-pg-planner",
        "writ-journal-planner",
        "writ-model-key",
        "writ-nats-planner",
        "writ-nats-seal-planner",
    }
    assert _secrets(template) <= allowed
    assert "writ-model-key" in _secrets(template)


def test_each_service_mounts_only_its_own_database_and_journal_secrets(
    rendered: list[dict[str, Any]],
) -> None:
    for name in SERVICES:
        secrets = _secrets(_deployment(rendered, name)["spec"]["template"])
        for other in set(SERVICES) - {name}:
            assert (
                not {
                    f"writ-pg-{other}",
                    f"writ-journal-{other}",
                    f"writ-nats-{other}",
                    f"writ-nats-seal-{other}",
                }
                & secrets
            )


def test_each_journaled_service_seals_as_its_own_nats_user(
    production: list[dict[str, Any]],
) -> None:
    # Its sealer's password, and no other identity's: only it may append to its record.
    for name in SERVICES:
        template = _deployment(production, name)["spec"]["template"]
        [container] = template["spec"]["containers"]
        env = _env(container)
        secrets = _secrets(template)
        if name in JOURNALS and "WRIT_NATS_PASSWORD_FILE" in env:
            assert f"writ-nats-seal-{name}" in secrets
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert env["WRIT_SEAL_NATS_PASSWORD_FILE"].startswith(mounts["nats-seal"])
        else:
            assert "WRIT_SEAL_NATS_PASSWORD_FILE" not in env
            assert not [s for s in secrets if s.startswith("writ-nats-seal-")]


def test_default_deny_covers_every_pod(rendered: list[dict[str, Any]]) -> None:
    for _, template in pod_templates(rendered):
        labels = template["metadata"]["labels"]
        policies = policies_for(rendered, labels)
        deny = [p for p in policies if "ingress" not in p["spec"] and "egress" not in p["spec"]]
        assert deny and set(deny[0]["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        for policy in policies:  # no rule that opens everything
            for rule in policy["spec"].get("egress", []):
                assert rule.get("to"), policy["metadata"]["name"]
            for rule in policy["spec"].get("ingress", []):
                assert rule.get("from"), policy["metadata"]["name"]


def test_external_egress_is_each_services_own(production: list[dict[str, Any]]) -> None:
    values = production_values()["networkPolicy"]
    owners = {
        "dispatcher": set(values["connectors"]["cidrs"]) | set(values["hostApi"]["cidrs"]),
        "planner": set(values["modelProvider"]["cidrs"]),
        "retrieval": set(values["mcpServers"]["cidrs"]),
    }
    assert all(owners.values())
    for obj, template in pod_templates(production):
        reachable = egress_cidrs(production, template["metadata"]["labels"])
        assert reachable == owners.get(component(obj), set()), component(obj)


def _destinations(objects: list[dict[str, Any]], labels: dict[str, str]) -> set[tuple[str, int]]:
    """Every (CIDR, TCP port) outside the cluster a pod with `labels` may send to."""
    return {
        (peer["ipBlock"]["cidr"], port["port"])
        for policy in policies_for(objects, labels)
        for rule in policy["spec"].get("egress", [])
        for peer in rule.get("to", [])
        if "ipBlock" in peer
        for port in rule.get("ports", [])
        if port["protocol"] == "TCP"
    }


def test_federation_egress_is_the_registered_servers_and_the_host_api_only(
    production: list[dict[str, Any]],
) -> None:
    """Retrieval reaches the MCP servers' CIDRs on their ports and nothing of the host's REST
    API; the dispatcher the REST API's CIDRs on its port (besides the connectors), never the
    MCP servers' ports; a CIDR both list opens each service only its own ports."""
    values = production_values()["networkPolicy"]
    mcp = {(c, p) for c in values["mcpServers"]["cidrs"] for p in values["mcpServers"]["ports"]}
    rest = {(c, p) for c in values["hostApi"]["cidrs"] for p in values["hostApi"]["ports"]}
    connectors = {
        (c, p) for c in values["connectors"]["cidrs"] for p in values["connectors"]["ports"]
    }
    assert mcp and rest and not mcp & rest
    for obj, template in pod_templates(production):
        seen = _destinations(production, template["metadata"]["labels"])
        if component(obj) == "retrieval":
            assert seen == mcp
        elif component(obj) == "dispatcher":
            assert seen == rest | connectors
        else:
            assert not seen & (mcp | rest), component(obj)


def test_default_values_open_no_federation_egress() -> None:
    """Nothing registered, nothing opened: the default render has no policy to the MCP servers
    or the host's API, and no pod may send outside the cluster at all."""
    objects = render(None)
    names = {p["metadata"]["name"] for p in by_kind(objects, "NetworkPolicy")}
    assert not {n for n in names if n.endswith(("-mcp-servers", "-host-api"))}
    for _, template in pod_templates(objects):
        assert egress_cidrs(objects, template["metadata"]["labels"]) == set()
    # Setting only the host's API opens it for the dispatcher alone.
    values = {"networkPolicy": {"hostApi": {"cidrs": ["198.18.0.0/15"], "ports": [8443]}}}
    objects = render(values)
    for obj, template in pod_templates(objects):
        seen = _destinations(objects, template["metadata"]["labels"])
        assert seen == ({("198.18.0.0/15", 8443)} if component(obj) == "dispatcher" else set()), (
            component(obj)
        )


def test_only_ingress_accepts_hosts(production: list[dict[str, Any]]) -> None:
    hosts = production_values()["networkPolicy"]["hosts"]
    for obj, template in pod_templates(production):
        peers = [
            peer
            for p in policies_for(production, template["metadata"]["labels"])
            for rule in p["spec"].get("ingress", [])
            for peer in rule["from"]
        ]
        assert (all(h in peers for h in hosts)) == (component(obj) == "ingress")
    [service] = by_kind(production, "Service")
    assert component(service) == "ingress"
    assert service["spec"]["ports"][0]["targetPort"] == "http"


# -- monitoring ------------------------------------------------------------------------------


def test_prometheus_rule_is_the_alerts_file(production: list[dict[str, Any]]) -> None:
    text = (ROOT / "deploy/observability/writ-alerts.yaml").read_text()
    base = production_values()["monitoring"]["prometheusRule"]["runbookBaseUrl"]
    alerts = yaml.safe_load(text.replace("https://writ.invalid/docs/runbooks/", base))
    [rule] = by_kind(production, "PrometheusRule")
    assert rule["spec"] == alerts
    urls = [
        r["annotations"]["runbook_url"]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "runbook_url" in r.get("annotations", {})
    ]
    assert urls and all(u.startswith(base + "#") for u in urls)
    [monitor] = by_kind(production, "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    [dashboard] = [
        c
        for c in by_kind(production, "ConfigMap")
        if c["metadata"]["labels"].get("grafana_dashboard") == "1"
    ]
    assert (
        dashboard["data"]["writ-dashboard.json"]
        == (ROOT / "deploy/observability/writ-dashboard.json").read_text()
    )
