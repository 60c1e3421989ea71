"""Rendering the chart offline and checking Kubernetes objects without a cluster.

- `render`: the chart through Helm's own library (the helm-python-sdk wheel embeds it).
- `validate`: built-in kinds with kubernetes-validate (strict) for a current Kubernetes;
  custom resources against the JSON schemas vendored in deploy/schemas/ from the projects'
  CRDs, made strict the way kubeconform's `-strict` is (unknown fields rejected).
- `restricted_violations`: the Pod Security Standards' "restricted" profile (baseline
  included), rule by rule as the admission controller applies them to a pod spec.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "writ"
SCHEMAS = ROOT / "deploy" / "schemas"
PRODUCTION = ROOT / "deploy" / "helm" / "values-production.yaml"
KUBERNETES_VERSION = kubernetes_validate.latest_version()


def render(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = "writ",
    namespace: str = "writ",
    revision: int = 1,
) -> list[dict[str, Any]]:
    """Every object the chart renders with `values` over its defaults."""
    chart = helm_python.Chart.load(CHART)
    manifests = chart.render(
        dict(values or {}), name=name, namespace=namespace, revision=revision, is_install=True
    )
    return [
        doc
        for path, text in manifests.items()
        if not path.endswith("NOTES.txt")  # what `helm install` prints, not an object
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def render_notes(values: Mapping[str, Any] | None = None, *, name: str = "writ") -> str:
    """What `helm install` prints after installing with `values` (templates/NOTES.txt)."""
    chart = helm_python.Chart.load(CHART)
    manifests = chart.render(
        dict(values or {}), name=name, namespace="writ", revision=1, is_install=True
    )
    return "".join(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def production_values() -> dict[str, Any]:
    """deploy/helm/values-production.yaml."""
    return dict(yaml.safe_load(PRODUCTION.read_text()))


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The objects of one kind, in rendering order."""
    return [o for o in objects if o["kind"] == kind]


def pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(object, pod template) of every Deployment and Job."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield obj, obj["spec"]["template"]


def component(obj: Mapping[str, Any]) -> str:
    """The service (or `migrate`) an object belongs to."""
    return str(obj["metadata"]["labels"].get("app.kubernetes.io/component", ""))


# -- schemas ---------------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and pattern.startswith("^(?i)"):
            schema["pattern"] = "(?i)^" + pattern[5:]  # Go's regexp takes flags anywhere
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


@functools.cache
def _custom_schema(api_version: str, kind: str) -> dict[str, Any] | None:
    group, _, version = api_version.rpartition("/")
    path = SCHEMAS / group / f"{kind.lower()}_{version}.json"
    if not group or not path.exists():
        return None
    schema = _strict(json.loads(path.read_text()))
    # A CRD's schema leaves metadata open; apiVersion and kind are the CRD's own.
    schema["properties"]["metadata"] = {"type": "object"}
    return dict(schema)


def validate(obj: Mapping[str, Any]) -> None:
    """Raise if `obj` is not a valid object of its kind (see the module's docstring)."""
    custom = _custom_schema(obj["apiVersion"], obj["kind"])
    if custom is not None:
        jsonschema.validate(dict(obj), custom, cls=jsonschema.Draft7Validator)
        return
    kubernetes_validate.validate(copy.deepcopy(dict(obj)), KUBERNETES_VERSION, strict=True)


# -- Pod Security "restricted" ---------------------------------------------------------------

_RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
_BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def restricted_violations(pod: Mapping[str, Any]) -> list[str]:
    """Why the Pod Security "restricted" profile would refuse a pod with this spec ([] if not)."""
    spec = pod["spec"] if "spec" in pod else pod
    psc = spec.get("securityContext") or {}
    containers = [
        *spec.get("initContainers", []),
        *spec.get("containers", []),
        *spec.get("ephemeralContainers", []),
    ]
    found: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"{key} is set")
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if kinds - _RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']} is of type {sorted(kinds)}")
    for sysctl in psc.get("sysctls", []):
        if sysctl["name"] not in _SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl['name']} is not safe")
    found += _context_violations("pod", psc)
    if (psc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        unset = [
            c["name"]
            for c in containers
            if (c.get("securityContext") or {}).get("seccompProfile", {}).get("type")
            not in ("RuntimeDefault", "Localhost")
        ]
        if unset:
            found.append(f"seccompProfile not RuntimeDefault/Localhost for {unset}")
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c["name"]
        found += _context_violations(f"container {name}", sc)
        if sc.get("privileged"):
            found.append(f"container {name} is privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"container {name} does not set allowPrivilegeEscalation: false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in caps.get("drop", []):
            found.append(f"container {name} does not drop ALL capabilities")
        added = set(caps.get("add", []))
        if added - {"NET_BIND_SERVICE"} or added - _BASELINE_CAPABILITIES:
            found.append(f"container {name} adds capabilities {sorted(added)}")
        if sc.get("procMount", "Default") != "Default":
            found.append(f"container {name} has procMount {sc['procMount']}")
        for port in c.get("ports", []):
            if port.get("hostPort"):
                found.append(f"container {name} uses hostPort {port['hostPort']}")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            found.append(f"container {name} may run as root (runAsNonRoot not true)")
    return found


def _context_violations(where: str, sc: Mapping[str, Any]) -> list[str]:
    found = []
    if sc.get("runAsUser") == 0:
        found.append(f"{where} runs as uid 0")
    if sc.get("runAsNonRoot") is False:
        found.append(f"{where} sets runAsNonRoot: false")
    if (sc.get("windowsOptions") or {}).get("hostProcess"):
        found.append(f"{where} is a Windows host process")
    seccomp = (sc.get("seccompProfile") or {}).get("type")
    if seccomp == "Unconfined":
        found.append(f"{where} has seccompProfile Unconfined")
    apparmor = (sc.get("appArmorProfile") or {}).get("type")
    if apparmor not in (None, "RuntimeDefault", "Localhost"):
        found.append(f"{where} has appArmorProfile {apparmor}")
    selinux = sc.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in _SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        found.append(f"{where} has seLinuxOptions {selinux}")
    return found


# -- NetworkPolicies -------------------------------------------------------------------------


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a label selector (matchLabels and matchExpressions) matches `labels`."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def policies_for(objects: list[dict[str, Any]], labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """The NetworkPolicies that select a pod with `labels`."""
    return [
        p for p in by_kind(objects, "NetworkPolicy") if selects(p["spec"]["podSelector"], labels)
    ]


def egress_cidrs(objects: list[dict[str, Any]], labels: Mapping[str, str]) -> set[str]:
    """Every ipBlock CIDR a pod with `labels` may send to."""
    cidrs = set()
    for policy in policies_for(objects, labels):
        for rule in policy["spec"].get("egress", []):
            for peer in rule.get("to", []):
                if "ipBlock" in peer:
                    cidrs.add(peer["ipBlock"]["cidr"])
    return cidrs
