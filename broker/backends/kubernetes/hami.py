"""HAMi (and Volcano vGPU) rules: what a pod requests, where a standby is pinned, and the card sweep.

The active pod requests `nvidia.com/gpu: 1` with `gpumem`/`gpucores` unset (the whole card); a standby
requests `gpu: 1` **with** `gpumem: 1`, since `gpu: 1` alone is booked as a whole card, and is pinned with
`nvidia.com/use-gpuuuid` to the UUID HAMi wrote into the active pod's `hami.io/vgpu-devices-allocated`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

ALLOCATED = "hami.io/vgpu-devices-allocated"
NODE_REGISTER = "hami.io/node-nvidia-register"
VOLCANO_ALLOCATED = "volcano.sh/vgpu-ids-new"
"""Volcano's vGPU plugin (a HAMi fork) writes the same format under its own keys."""
VOLCANO_REGISTER = "volcano.sh/node-vgpu-register"
USE_UUID = "nvidia.com/use-gpuuuid"
_SHARE = {"hami": ("nvidia.com/gpu", "nvidia.com/gpumem"), "volcano": ("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory")}
_WHOLE_CARD_ONLY = {"hami": ("nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"),
                    "volcano": ("volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores")}


def _extended(name: str) -> bool:
    """Extended resources: namespaced and not kubernetes.io's own (cpu, memory, ... are unprefixed)."""
    return "/" in name and not name.split("/", 1)[0].endswith("kubernetes.io")


def resource_problem(resources: Mapping[str, Mapping[str, str]], *, standby: bool, sharing: str) -> str:
    """What is wrong with a pod's resources for its role, or "" (the rules the API schema cannot say)."""
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    for name in sorted(set(requests) | set(limits)):
        if _extended(name) and name in requests and requests.get(name) != limits.get(name):
            return f"extended resource {name} must request what it limits ({requests.get(name)} vs {limits.get(name)})"
    wanted = {**requests, **limits}
    if sharing not in _SHARE:
        return "standby pods need template.sharing hami or volcano" if standby else ""
    card, share = _SHARE[sharing]
    if standby:
        if card not in wanted or share not in wanted:
            return f"a standby must request {card} together with {share} (alone, {card} books a whole card)"
        return ""
    partial = [n for n in _WHOLE_CARD_ONLY[sharing] if n in wanted]
    if partial:
        return f"an active pod gets the whole card: leave {', '.join(partial)} unset"
    return ""


def allocated_uuids(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """GPU UUIDs from `hami.io/vgpu-devices-allocated` (`UUID,TYPE,MEM,CORES:...;` per container)."""
    raw = annotations.get(ALLOCATED) or annotations.get(VOLCANO_ALLOCATED, "")
    out: list[str] = []
    for container in raw.split(";"):
        for device in container.split(":"):
            uuid = device.split(",", 1)[0].strip()
            if uuid and uuid not in out:
                out.append(uuid)
    return tuple(out)


def allocated_memory_mb(annotations: Mapping[str, str]) -> dict[str, int]:
    """Memory (MiB) HAMi allocated per card; for an active pod (gpumem unset) that is the whole card."""
    out: dict[str, int] = {}
    for container in (annotations.get(ALLOCATED) or annotations.get(VOLCANO_ALLOCATED, "")).split(";"):
        for device in container.split(":"):
            fields = [f.strip() for f in device.split(",")]
            if len(fields) >= 3 and fields[0] and fields[2].isdigit():
                out[fields[0]] = max(out.get(fields[0], 0), int(fields[2]))
    return out


def registered_uuids(node_annotations: Mapping[str, str]) -> set[str]:
    """Cards a node's device plugin registered (`hami.io/node-nvidia-register`: `UUID,COUNT,MEM,...:` each)."""
    raw = node_annotations.get(NODE_REGISTER) or node_annotations.get(VOLCANO_REGISTER, "")
    return {d.split(",", 1)[0].strip() for d in raw.split(":") if d.split(",", 1)[0].strip()}


NOUSE_UUID = "nvidia.com/nouse-gpuuuid"


def avoid_annotations(uuids: Iterable[str]) -> dict[str, str]:
    """Annotations that keep a new pod off these cards (quarantined); only real card UUIDs are named."""
    cards = sorted(u for u in uuids if u.startswith("GPU-"))
    return {NOUSE_UUID: ",".join(cards)} if cards else {}


def pin_annotations(uuids: Iterable[str], sharing: str) -> dict[str, str]:
    """Annotations that pin a standby to its group's card(s)."""
    del sharing  # HAMi's and Volcano's vGPU device plugins read the same pin annotation
    return {USE_UUID: ",".join(uuids)}


def exclusive(uuid: str, node: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], group: str) -> bool:
    """True when `uuid` is registered on `node` and every pod with a share on it belongs to `group` (a
    pool's `firepool.io/pool` label value). A card missing from the register counts as not exclusive."""
    node_ann = (node.get("metadata") or {}).get("annotations") or {}
    if uuid not in registered_uuids(node_ann):
        return False
    for pod in pods:
        meta = pod.get("metadata") or {}
        if uuid in allocated_uuids(meta.get("annotations") or {}) and \
                (meta.get("labels") or {}).get("firepool.io/pool") != group:
            return False
    return True


def foreign_cards(info_gpus: tuple[str, ...], pool: str, node: Mapping[str, Any] | None,
                  pods: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The cards of a pod that are not its group's alone (all of them when the node could not be read)."""
    on_node = list(pods)
    return tuple(g for g in info_gpus if node is None or not exclusive(g, node, on_node, pool))
