"""The emulated scheduler: which node a new pod goes to, and which GPUs it gets there.

Filters as kube-scheduler does, in a small way: nodeSelector, required nodeAffinity (matchExpressions
In/NotIn/Exists/DoesNotExist), NoSchedule/NoExecute taints without a
matching toleration, CPU and memory requests against allocatable, required podAffinity (a pod that
matches its own term may start a group alone), then GPUs by HAMi's rules (`nodes.gpu_fit`). Among the
nodes left, preferred podAffinity weights rank; ties go to the first node by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from k8s_emulator.nodes import allocated_uuids, gpu_fit, gpu_request, node_gpus
from k8s_emulator.objects import Obj
from k8s_emulator.selectors import label_selector


def quantity(value: Any) -> float:
    """A Kubernetes quantity as a number (cpu in cores, memory in bytes)."""
    text = str(value)
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
                "Ti": 2**40}
    for suffix in sorted(suffixes, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * suffixes[suffix]
    return float(text)


def _requests(pod: Mapping[str, Any], name: str) -> float:
    total = 0.0
    for container in pod.get("spec", {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = (resources.get("requests") or {}).get(name, (resources.get("limits") or {}).get(name))
        total += quantity(asked) if asked is not None else 0.0
    return total


def _tolerated(pod: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    for toleration in pod.get("spec", {}).get("tolerations") or []:
        if toleration.get("effect") not in (None, "", taint.get("effect")):
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration.get("key") == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def _term_selector(term: Mapping[str, Any]) -> str:
    """A podAffinityTerm's labelSelector (matchLabels, matchExpressions) in selector syntax."""
    selector = term.get("labelSelector") or {}
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expression in selector.get("matchExpressions") or []:
        key, op, values = expression["key"], expression["operator"], expression.get("values") or []
        parts.append({"In": f"{key} in ({','.join(values)})", "NotIn": f"{key} notin ({','.join(values)})",
                      "Exists": key, "DoesNotExist": f"!{key}"}[op])
    return ",".join(parts)


def _node_term(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A nodeSelectorTerm: every matchExpression holds on the node's labels (an empty term matches none)."""
    expressions = term.get("matchExpressions") or []
    if not expressions:
        return False
    for expression in expressions:
        key, op, values = expression["key"], expression["operator"], expression.get("values") or []
        held = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values, "Exists": key in labels,
                "DoesNotExist": key not in labels}.get(op, False)
        if not held:
            return False
    return True


def _domain(node: Mapping[str, Any], key: str) -> str | None:
    return (node["metadata"].get("labels") or {}).get(key)


def _affine(pod: Obj, term: Mapping[str, Any], node: Obj, nodes: Sequence[Obj], pods: Sequence[Obj]) -> bool:
    """A pod matching `term` runs in `node`'s topology domain."""
    key = term.get("topologyKey", "kubernetes.io/hostname")
    domain = _domain(node, key)
    if domain is None:
        return False
    matches = label_selector(_term_selector(term))
    in_domain = {n["metadata"]["name"] for n in nodes if _domain(n, key) == domain}
    return any(matches(p) and p["spec"].get("nodeName") in in_domain for p in pods
               if p["metadata"]["uid"] != pod["metadata"].get("uid"))


def _fits(pod: Obj, node: Obj, nodes: Sequence[Obj], pods: Sequence[Obj]) -> str | None:
    """Why `pod` cannot go to `node`, or None."""
    meta = node["metadata"]
    labels = meta.get("labels") or {}
    if any(labels.get(k) != v for k, v in (pod["spec"].get("nodeSelector") or {}).items()):
        return "node(s) didn't match Pod's node affinity/selector"
    required = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is not None and not any(_node_term(term, labels) for term in required.get("nodeSelectorTerms") or []):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(pod, taint):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    here = [p for p in pods if p["spec"].get("nodeName") == meta["name"]]
    allocatable = node.get("status", {}).get("allocatable") or {}
    for resource in ("cpu", "memory"):
        if resource in allocatable and \
                sum(_requests(p, resource) for p in here) + _requests(pod, resource) > quantity(allocatable[resource]):
            return f"Insufficient {resource}"
    affinity = (pod["spec"].get("affinity") or {}).get("podAffinity") or {}
    for term in affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
        if _affine(pod, term, node, nodes, pods):
            continue
        alone = label_selector(_term_selector(term))(pod) and not any(
            label_selector(_term_selector(term))(p) and p["spec"].get("nodeName") for p in pods
            if p["metadata"]["uid"] != pod["metadata"].get("uid"))
        if not alone:  # the first of a group may start anywhere; later ones follow it
            return "node(s) didn't match pod affinity rules"
    return None


def _preference(pod: Obj, node: Obj, nodes: Sequence[Obj], pods: Sequence[Obj]) -> int:
    affinity = (pod["spec"].get("affinity") or {}).get("podAffinity") or {}
    return sum(int(weighted.get("weight", 1)) for weighted in
               affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
               if _affine(pod, weighted.get("podAffinityTerm") or {}, node, nodes, pods))


def _free_cards(node: Obj, pods: Sequence[Obj]) -> int:
    """Cards of `node` no pod holds any share of."""
    held = {u for p in pods if p["spec"].get("nodeName") == node["metadata"]["name"] for u in allocated_uuids(p)}
    return sum(1 for u in node_gpus(node) if u not in held)


def place(pod: Obj, nodes: Sequence[Obj], pods: Sequence[Obj]) -> tuple[str | None, list[str], str]:
    """The node for `pod` and the GPU UUIDs it gets there, or (None, [], why none fits)."""
    request = gpu_request(pod)
    reasons: dict[str, int] = {}
    fitting: list[tuple[tuple[int, int, int], str, list[str]]] = []
    for index, node in enumerate(nodes):
        why = _fits(pod, node, nodes, pods)
        uuids: list[str] | None = None
        if why is None:
            uuids = gpu_fit(request, node, pods)
            if uuids is None:
                why = f"Insufficient nvidia.com/gpu ({request.count} free card(s) wanted)"
        if why is not None or uuids is None:
            reasons[why or ""] = reasons.get(why or "", 0) + 1
            continue
        # Like kube-scheduler's default scoring: pod affinity first, then the least allocated node (free
        # whole cards, for GPU pods), then the node order.
        free = _free_cards(node, pods) if request.count else 0
        fitting.append(((-_preference(pod, node, nodes, pods), -free, index), node["metadata"]["name"], uuids))
    if fitting:
        _rank, name, uuids = min(fitting)
        return name, uuids, ""
    summary = ", ".join(f"{count} {why}" for why, count in sorted(reasons.items()))
    return None, [], f"0/{len(nodes)} nodes are available: {summary}."
