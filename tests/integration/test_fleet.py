"""Nodes and placement on the local backend: 2 virtual nodes × 4 GPUs, real sandboxes. A 4-pod gang of
1-GPU pods lands on one node (a whole free one when another node is partly used), /v1/pods shows each
pod's node, and largest_placeable in /v1/pools and /metrics follows what is placed."""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import BrokerProcess, run_job

pytestmark = pytest.mark.integration

NODES = ("--virtual-gpus", "8", "--virtual-nodes", "2", "--virtual-gpus-per-node", "4")


def nodes_of(b: BrokerProcess, pods: list[str]) -> set[str | None]:
    view = b.client("ops").get("/v1/pods").json()["pods"]
    return {p["node"] for p in view if p["name"] in pods}


def test_a_4_pod_gang_of_1_gpu_pods_lands_on_one_node(tmp_path) -> None:
    b = BrokerProcess(tmp_path / "fleet", extra=NODES)
    try:
        ops = b.client("ops")
        pools = ops.get("/v1/pools").json()
        gpu = next(p for p in pools["pools"] if p["name"] == "gpu")
        assert gpu["nodes"] == 2
        assert gpu["largest_placeable"] == {"1": 8, "2": 4, "4": 2, "8": 0, "node": 2}
        assert [n["id"] for n in pools["fleet"]["nodes"]] == ["virtual-node-0", "virtual-node-1"]

        one = run_job(b.client("alice"), {"pool": "gpu", "command": ["true"], "lease_tag": "solo"})
        assert one["state"] == "SUCCEEDED"
        (first,) = nodes_of(b, one["bound_pods"])
        assert first in ("virtual-node-0", "virtual-node-1")

        gang = run_job(b.client("bob"), {"pool": "gpu", "pods": 4, "lease_tag": "gang",
                                         "command": ["sh", "-c", "echo rank $RANK of $WORLD_SIZE"]})
        assert gang["state"] == "SUCCEEDED", gang
        assert len(set(gang["bound_pods"])) == 4
        placed = nodes_of(b, gang["bound_pods"])
        assert len(placed) == 1 and first not in placed  # a whole free node, not three GPUs beside alice's pod

        gpu = next(p for p in ops.get("/v1/pools").json()["pools"] if p["name"] == "gpu")
        # 5 warm pods hold GPUs now: 3 free on one node, none on the other
        assert gpu["largest_placeable"] == {"1": 3, "2": 1, "4": 0, "8": 0, "node": 0}
        metrics = ops.get("/metrics").text
        assert 'firepool_pool_largest_placeable{pool="gpu",shape="1"} 3.0' in metrics
        assert 'firepool_largest_placeable{accelerator="virtual",shape="node"} 0.0' in metrics
    finally:
        b.stop()


def test_a_node_topology_gang_never_splits_when_one_node_is_partly_busy(tmp_path) -> None:
    """Job-level `topology: node`: carol's held pod sits on the partly busy node, which has room for 2 more; the
    gang takes 4 new pods on the other node and leaves her pod alone (an unconfined gang would take it first
    and split 1 + 3)."""
    b = BrokerProcess(tmp_path / "fleet", extra=NODES)
    try:
        alice, carol = b.client("alice"), b.client("carol")
        busy = alice.post("/v1/jobs", json={"pool": "gpu", "command": ["sleep", "120"], "lease_tag": "busy"})
        assert busy.status_code in (200, 201), busy.text
        busy_id = busy.json()["id"]
        deadline = time.monotonic() + 60
        while alice.get(f"/v1/jobs/{busy_id}").json()["state"] != "RUNNING":
            assert time.monotonic() < deadline, "alice's job never ran"
            time.sleep(0.1)
        (partly,) = nodes_of(b, alice.get(f"/v1/jobs/{busy_id}").json()["bound_pods"])

        solo = run_job(carol, {"pool": "gpu", "command": ["true"], "lease_tag": "t"})
        assert solo["state"] == "SUCCEEDED"
        assert nodes_of(b, solo["bound_pods"]) == {partly}  # best-fit: beside alice's, 2 GPUs left there

        gang = run_job(carol, {"pool": "gpu", "pods": 4, "lease_tag": "t", "topology": "node",
                               "command": ["sh", "-c", "echo rank $RANK"]})
        assert gang["state"] == "SUCCEEDED", gang
        assert gang["topology"] == "node"
        placed = nodes_of(b, gang["bound_pods"])
        assert len(placed) == 1 and partly not in placed
        assert not set(solo["bound_pods"]) & set(gang["bound_pods"])  # her held pod on the other node stays out
        assert {a["path"] for a in gang["acquisition"]} == {"new"}
        alice.post(f"/v1/jobs/{busy_id}/cancel")
    finally:
        b.stop()


async def test_kubernetes_nodes_come_from_node_objects_and_a_placed_pod_lands_on_its_node(tmp_path) -> None:
    from broker.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings
    from broker.backends.kubernetes.kubeapi import KubeApi
    from broker.clock import RealClock
    from broker.pools import parse_pool
    from broker.ports.backend import PodRequest
    from k8s_emulator import BROKER_TOKEN, Emulator

    pool = parse_pool({"name": "h100", "gpus": 1, "template": {
        "image": "firepool/sandbox-gpu:0.1.0", "schedulerName": "hami-scheduler",
        "resources": {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 1}}}})
    with Emulator(tmp_path / "k8s", gpus=2, nodes=2) as emu:
        api = KubeApi(emu.client(BROKER_TOKEN), "default")
        backend = KubernetesBackend(RealClock(), api, KubernetesSettings())
        try:
            nodes = await backend.refresh_nodes()
            assert [(n.id, n.size) for n in nodes] == [("node-0", 2), ("node-1", 2)]
            assert all(n.boot_epoch and n.gpus[0].startswith("GPU-") for n in nodes)
            for name in ("h100-a", "h100-b"):
                info = await backend.create(PodRequest(name=name, pool=pool, node="node-1"))
                assert info.node == "node-1" and set(info.gpus) <= set(nodes[1].gpus)
        finally:
            for name in list(backend.cache.pods):
                await backend.delete(name)
            await backend.close()
