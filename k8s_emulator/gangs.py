"""Volcano's gang rule in the emulated scheduler: no pod of a PodGroup binds until `minMember` of them can.

A pod sent to the `volcano` scheduler that names a PodGroup (`scheduling.k8s.io/group-name`) waits while its
group is missing or has fewer than `minMember` pods, and while the group's unbound pods, placed together (this
pod first, then the others by name, each seeing the ones before it bound), cannot bring the bound count up to
`minMember`. Once that many are bound, later members schedule one by one as any pod. Volcano binds the chosen
set at once; here each member's kubelet binds its own pod at its next scheduling try, which reaches the same
set unless the cluster changed in between (a test-support simplification).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

from k8s_emulator import scheduling
from k8s_emulator.nodes import ALLOCATED, allocation, gpu_request
from k8s_emulator.objects import Obj

GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
SCHEDULER = "volcano"


def _group_name(pod: Obj) -> str:
    if pod["spec"].get("schedulerName") != SCHEDULER:
        return ""
    return str((pod["metadata"].get("annotations") or {}).get(GROUP_ANNOTATION, ""))


def _bound_copy(pod: Obj, node: str, uuids: list[str]) -> Obj:
    """`pod` as it would be once bound to `node` with `uuids` (for placing the group's next member)."""
    out = copy.deepcopy(pod)
    out["spec"]["nodeName"] = node
    if uuids:
        out["metadata"].setdefault("annotations", {})[ALLOCATED] = allocation(uuids, gpu_request(pod))
    return out


def place(pod: Obj, nodes: Sequence[Obj], pods: Sequence[Obj],
          groups: Callable[[], Sequence[Obj]]) -> tuple[str | None, list[str], str]:
    """`scheduling.place`, with a PodGroup's pods bound all (minMember) or none; `groups()` lists the PodGroups
    (read only for a pod that names one)."""
    name = _group_name(pod)
    if not name:
        return scheduling.place(pod, nodes, pods)
    ns = pod["metadata"].get("namespace", "")
    group = next((g for g in groups() if g["metadata"]["name"] == name and g["metadata"].get("namespace", "") == ns),
                 None)
    if group is None:
        return None, [], f"podgroup {ns}/{name} not found"
    minimum = int((group.get("spec") or {}).get("minMember") or 1)
    members = [p for p in pods if _group_name(p) == name and p["metadata"].get("namespace", "") == ns
               and not p["metadata"].get("deletionTimestamp")]
    bound = [p for p in members if p["spec"].get("nodeName")]
    if len(bound) >= minimum:
        return scheduling.place(pod, nodes, pods)
    if len(members) < minimum:
        return None, [], (f"pod group {name} is not ready: {len(members)} pods exist, minMember {minimum}")
    uid = pod["metadata"].get("uid")
    others = sorted((p for p in members if not p["spec"].get("nodeName") and p["metadata"].get("uid") != uid),
                    key=lambda p: str(p["metadata"]["name"]))
    seen = list(pods)
    chosen: tuple[str, list[str]] | None = None
    placed = len(bound)
    for member in [pod, *others]:
        node, uuids, why = scheduling.place(member, nodes, seen)
        if node is None:
            if chosen is None:
                return None, [], why
            continue
        chosen = chosen or (node, uuids)
        member_uid = member["metadata"].get("uid")
        seen = [p for p in seen if p["metadata"].get("uid") != member_uid] + [_bound_copy(member, node, uuids)]
        placed += 1
        if placed >= minimum:
            return chosen[0], chosen[1], ""
    return None, [], f"pod group {name}: only {placed} of minMember {minimum} pods fit the cluster together"
