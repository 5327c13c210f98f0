"""Cluster nodes as the fleet sees them (broker.fleet): read from Node objects, never guessed.

A node's GPUs are the cards HAMi registered on it (`hami.io/node-nvidia-register`: UUID and model per
card; Volcano's vGPU plugin, a HAMi fork, writes the same under `volcano.sh/node-vgpu-register`, and its
`volcano.sh/vgpu-number` capacity counts shares, not cards); without either annotation, `capacity["nvidia.com/gpu"]` cards keyed `<node>/gpu<i>`. The topology
domain is the value of the first label set of `KubernetesSettings.domain_labels` (the catalog's
`topology_domain_labels`; default `firepool.io/topology-domain`, else `topology.kubernetes.io/zone`), the
boot epoch `status.nodeInfo.bootID` (a node replaced under the same name gets a new one). Nodes that are
not Ready or are cordoned are left out: placement must not choose them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from broker.fleet.nodes import Node

DOMAIN_LABELS: tuple[str, ...] = ("firepool.io/topology-domain", "topology.kubernetes.io/zone")
REGISTER = "hami.io/node-nvidia-register"
VOLCANO_REGISTER = "volcano.sh/node-vgpu-register"
GPU = "nvidia.com/gpu"


def _cards(name: str, annotations: Mapping[str, str], capacity: Mapping[str, Any]) -> tuple[list[str], str]:
    register = annotations.get(REGISTER) or annotations.get(VOLCANO_REGISTER, "")
    keys, model = [], ""
    for entry in register.split(":"):
        parts = entry.split(",")
        if len(parts) >= 5 and parts[0]:
            keys.append(parts[0])
            model = model or parts[4]
    if keys:
        return keys, model
    try:
        count = int(str(capacity.get(GPU, "0")))
    except ValueError:
        count = 0
    return [f"{name}/gpu{i}" for i in range(count)], ""


def parse_node(obj: Mapping[str, Any], domain_labels: Sequence[str] = DOMAIN_LABELS) -> Node | None:
    """One Node object as a fleet node; None when it has no GPUs, is not Ready or is cordoned."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    name = str(meta.get("name", ""))
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    if not name or not ready or (obj.get("spec") or {}).get("unschedulable"):
        return None
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    keys, model = _cards(name, meta.get("annotations") or {}, status.get("capacity") or {})
    if not keys:
        return None
    domain = next((labels[k] for k in domain_labels if labels.get(k)), "")
    return Node(id=name, gpus=tuple(keys), model=model, domain=domain,
                boot_epoch=str((status.get("nodeInfo") or {}).get("bootID", "")), labels=labels)


def parse_nodes(objs: Iterable[Mapping[str, Any]], domain_labels: Sequence[str] = DOMAIN_LABELS) -> list[Node]:
    return [n for n in (parse_node(o, domain_labels) for o in objs) if n is not None]
