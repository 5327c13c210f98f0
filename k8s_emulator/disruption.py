"""PodDisruptionBudgets (policy/v1) as the Eviction API applies them.

The real server answers an eviction 429 TooManyRequests when it would take a budget below what it asks;
its disruption controller keeps each budget's status (healthy pods, disruptions allowed). Here the
same figures are computed at the moment of the eviction from the pods the budget selects: healthy is
Ready and not being deleted. A pod that is not healthy may go while the budget is met
(`unhealthyPodEvictionPolicy: IfHealthyBudget`, the default) or always (`AlwaysAllow`); a terminal or
terminating pod is never held; two budgets on one pod are a 500, as the server has it.
"""

from __future__ import annotations

import math
from typing import Any

from k8s_emulator.objects import ApiError, Obj, Store
from k8s_emulator.selectors import label_selector

RESOURCE = "poddisruptionbudgets"


def _healthy(pod: Obj) -> bool:
    conditions = {c.get("type"): c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
    return conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp")


def _selects(budget: Obj, pod: Obj) -> bool:
    selector: dict[str, Any] = (budget.get("spec") or {}).get("selector") or {}
    if not selector:  # policy/v1: an empty selector selects every pod of the namespace
        return True
    terms = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], ",".join(expr.get("values") or [])
        terms.append({"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key,
                      "DoesNotExist": f"!{key}"}[op])
    return label_selector(",".join(terms))(pod)


def _count(value: int | str, of: int) -> int:
    """An int, or a percentage of `of` rounded up (as the disruption controller scales both fields)."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * of / 100)
    return int(value)


def status(budget: Obj, pods: list[Obj]) -> dict[str, int]:
    """What the disruption controller writes in the budget's status, for the pods it selects."""
    spec = budget.get("spec") or {}
    selected = [p for p in pods if _selects(budget, p)]
    expected = len(selected)
    healthy = sum(1 for p in selected if _healthy(p))
    if "maxUnavailable" in spec:
        desired = max(0, expected - _count(spec["maxUnavailable"], expected))
    else:
        desired = _count(spec.get("minAvailable", 1), expected)
    return {"expectedPods": expected, "currentHealthy": healthy, "desiredHealthy": desired,
            "disruptionsAllowed": max(0, healthy - desired)}


def check_eviction(store: Store, namespace: str, name: str) -> None:
    """Raise what the Eviction API answers when evicting this pod would break its budget."""
    pod = store.get("pods", namespace, name)
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp"):
        return
    budgets = [b for b in store.list(RESOURCE, namespace)[0] if _selects(b, pod)]
    if not budgets:
        return
    if len(budgets) > 1:
        raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the eviction "
                       "subresource does not support.")
    (budget,) = budgets
    figures = status(budget, store.list("pods", namespace)[0])
    if not _healthy(pod):
        policy = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        if policy == "AlwaysAllow" or figures["currentHealthy"] >= figures["desiredHealthy"]:
            return
    elif figures["disruptionsAllowed"] > 0:
        return
    budget_name = budget["metadata"]["name"]
    raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                   details={"causes": [{"reason": "DisruptionBudget", "message": (
                       f"The disruption budget {budget_name} needs {figures['desiredHealthy']} healthy pods and "
                       f"has {figures['currentHealthy']} currently")}]})
