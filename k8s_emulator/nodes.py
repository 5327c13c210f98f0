"""Fake nodes with fake GPUs, and the HAMi annotations that describe them and their pods' shares.

A node carries `hami.io/node-nvidia-register` in HAMi's classic form, one GPU per `:`-ended entry
`UUID,count,devmem,devcore,type,numa,healthy`. A pod given a GPU gets
`hami.io/vgpu-devices-allocated` in HAMi's form, per container `UUID,NVIDIA,usedmem,usedcores:`
then `;`. GPU UUIDs are stable per node name (`GPU-` + a uuid5 of the node and the index).
Volcano's vGPU plugin (a HAMi fork) is served alike: `volcano.sh/vgpu-number` and `-memory` count
as `nvidia.com/gpu` and `gpumem`, nodes also carry `volcano.sh/node-vgpu-register`, and a Volcano
pod also gets `volcano.sh/vgpu-ids-new` (same format as HAMi's allocation).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from k8s_emulator.objects import Obj

GPU = "nvidia.com/gpu"
GPU_MEM = "nvidia.com/gpumem"
GPU_CORES = "nvidia.com/gpucores"
USE_UUID = "nvidia.com/use-gpuuuid"
NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
NODE_REGISTER = "hami.io/node-nvidia-register"
HANDSHAKE = "hami.io/node-handshake"
ALLOCATED = "hami.io/vgpu-devices-allocated"
ASSIGNED_NODE = "hami.io/vgpu-node"
VOLCANO_GPU = "volcano.sh/vgpu-number"
VOLCANO_MEM = "volcano.sh/vgpu-memory"
VOLCANO_CORES = "volcano.sh/vgpu-cores"
VOLCANO_REGISTER = "volcano.sh/node-vgpu-register"
VOLCANO_ALLOCATED = "volcano.sh/vgpu-ids-new"
SPLIT = 10
"""Shares HAMi offers per card (its deviceSplitCount): allocatable nvidia.com/gpu is cards × SPLIT."""
MEMORY_MB = 81_920
MODEL = "NVIDIA-H100-80GB-HBM3"


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{index}.firepool.emulator')}"


@dataclass(frozen=True)
class GpuRequest:
    """What a pod asks of GPUs, summed over its containers (limits, else requests)."""

    count: int
    mem_mb: int | None
    cores: int | None
    pinned: tuple[str, ...]
    volcano: bool = False
    avoided: tuple[str, ...] = ()
    """Cards HAMi must not give the pod (`nvidia.com/nouse-gpuuuid`: quarantined ones)."""
    """Asked through Volcano's `volcano.sh/vgpu-*` resources."""

    @property
    def exclusive(self) -> bool:
        """`nvidia.com/gpu` without `gpumem` books the whole card, as HAMi does."""
        return self.count > 0 and self.mem_mb is None


def _quantity(value: Any) -> int:
    text = str(value)
    for suffix, factor in (("Ki", 1 / 1024), ("Mi", 1), ("Gi", 1024), ("k", 1), ("M", 1)):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(float(text))


def gpu_request(pod: Mapping[str, Any]) -> GpuRequest:
    count, mem, cores, volcano = 0, None, None, False
    for container in pod.get("spec", {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        volcano = volcano or VOLCANO_GPU in asked
        count += _quantity(asked.get(GPU, 0)) + _quantity(asked.get(VOLCANO_GPU, 0))
        for name in (GPU_MEM, VOLCANO_MEM):
            if name in asked:
                mem = (mem or 0) + _quantity(asked[name])
        for name in (GPU_CORES, VOLCANO_CORES):
            if name in asked:
                cores = (cores or 0) + _quantity(asked[name])
    raw = (pod.get("metadata", {}).get("annotations") or {}).get(USE_UUID, "")
    pinned = tuple(u.strip() for u in raw.split(",") if u.strip())
    nouse = (pod.get("metadata", {}).get("annotations") or {}).get(NOUSE_UUID, "")
    return GpuRequest(count, mem, cores, pinned, volcano, tuple(u.strip() for u in nouse.split(",") if u.strip()))


def node_gpus(node: Mapping[str, Any]) -> list[str]:
    """The GPU UUIDs a node registers (from its HAMi annotation)."""
    raw = (node.get("metadata", {}).get("annotations") or {}).get(NODE_REGISTER, "")
    return [entry.split(",")[0] for entry in raw.split(":") if entry.strip()]


def allocated_uuids(pod: Mapping[str, Any]) -> list[str]:
    """The GPU UUIDs written into a pod's `hami.io/vgpu-devices-allocated`."""
    raw = (pod.get("metadata", {}).get("annotations") or {}).get(ALLOCATED, "")
    return [device.split(",")[0] for container in raw.split(";") for device in container.split(":") if device]


def allocation(uuids: Sequence[str], request: GpuRequest) -> str:
    mem = MEMORY_MB if request.mem_mb is None else request.mem_mb
    cores = 100 if request.cores is None and request.exclusive else (request.cores or 0)
    return "".join(f"{u},NVIDIA,{mem},{cores}:" for u in uuids) + ";"


def make_node(name: str, *, gpus: int = 0, labels: Mapping[str, str] | None = None,
              annotations: Mapping[str, str] | None = None, allocatable: Mapping[str, str] | None = None,
              taints: Sequence[Mapping[str, str]] = (), cpu: str = "256", memory: str = "2Ti") -> Obj:
    """A Ready node with `gpus` HAMi-registered cards (allocatable nvidia.com/gpu = gpus × SPLIT); CPU and
    memory are ample by default, so only a test that sets them meets Insufficient cpu or memory."""
    register = "".join(f"{gpu_uuid(name, i)},{SPLIT},{MEMORY_MB},100,{MODEL},0,true:" for i in range(gpus))
    resources = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "100Gi"}
    if gpus:
        resources[GPU] = str(gpus * SPLIT)
        resources[GPU_MEM] = str(gpus * MEMORY_MB)
        resources[GPU_CORES] = str(gpus * 100)
        resources[VOLCANO_GPU] = str(gpus * SPLIT)
        resources[VOLCANO_MEM] = str(gpus * MEMORY_MB)
    resources.update(allocatable or {})
    node_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.firepool.emulator"))
    handshake = {HANDSHAKE: f"Reported {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M:%S} +0000 UTC"}
    registers = {NODE_REGISTER: register, VOLCANO_REGISTER: register, **handshake} if gpus else {}
    meta_annotations = {**registers, **(annotations or {})}
    return {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                              **(labels or {})},
                     "annotations": meta_annotations},
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources),
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "kubelet is posting ready status (firepool emulator)"}],
                   "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                 {"type": "Hostname", "address": name}],
                   "nodeInfo": {"kubeletVersion": "v1.31.0-firepool-emulator", "kubeProxyVersion": "",
                                "architecture": "amd64", "operatingSystem": "linux", "osImage": "firepool emulator",
                                "kernelVersion": "", "containerRuntimeVersion": "firepool://bwrap",
                                "machineID": node_id, "systemUUID": node_id, "bootID": node_id}},
    }


def gpu_fit(request: GpuRequest, node: Obj, pods: Sequence[Obj]) -> list[str] | None:
    """The cards of `node` a pod asking `request` gets, or None when they are not free (HAMi's rules,
    simplified: a whole-card request takes a card no one shares; a `gpumem` share any card not held
    whole; `nvidia.com/use-gpuuuid` pins to those cards)."""
    if request.count == 0:
        return []
    cards = [u for u in node_gpus(node) if u not in request.avoided]
    if request.pinned:
        return list(request.pinned) if all(u in cards for u in request.pinned) else None
    holders: dict[str, list[bool]] = {u: [] for u in cards}
    for other in pods:
        if other["spec"].get("nodeName") == node["metadata"]["name"]:
            for u in allocated_uuids(other):
                holders.setdefault(u, []).append(gpu_request(other).exclusive)
    free = [u for u in cards if not holders[u]] if request.exclusive else [u for u in cards if not any(holders[u])]
    return free[:request.count] if len(free) >= request.count else None
