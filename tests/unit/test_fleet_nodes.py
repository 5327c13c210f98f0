"""Nodes on the backend port and placement in the broker: the fake backend's nodes, Kubernetes Node
objects as fleet nodes, the pool controller creating a gang's pods on one node, and the CLI flags."""

from __future__ import annotations

import pytest

from broker.backends.kubernetes.nodes import parse_node, parse_nodes
from broker.cli_commands import UsageError, virtual_fleet
from broker.clock import VirtualClock
from broker.jobs import JobState
from broker.ports.backend import FakeBackend
from k8s_emulator.nodes import make_node
from tests.unit.harness import Harness, gpu_pool


def test_the_fake_backend_splits_its_gpus_into_nodes() -> None:
    backend = FakeBackend(VirtualClock(), gpus=8, gpus_per_node=4)
    nodes = backend.nodes()
    assert [(n.id, n.size) for n in nodes] == [("fake-node-0", 4), ("fake-node-1", 4)]
    assert nodes[1].gpus == ("fake-gpu-4", "fake-gpu-5", "fake-gpu-6", "fake-gpu-7")
    assert FakeBackend(VirtualClock(), gpus=0).nodes() == []


def test_a_kubernetes_node_object_becomes_a_fleet_node() -> None:
    obj = make_node("gpu-a", gpus=2, labels={"firepool.io/topology-domain": "rack-1"})
    node = parse_node(obj)
    assert node is not None
    assert node.id == "gpu-a" and node.size == 2 and node.domain == "rack-1"
    assert node.gpus[0].startswith("GPU-") and node.model.startswith("NVIDIA")
    assert node.boot_epoch == obj["status"]["nodeInfo"]["bootID"]
    cordoned = {**obj, "spec": {"unschedulable": True}}
    assert parse_nodes([cordoned, make_node("cpu-only")]) == []


def test_a_volcano_node_counts_the_cards_its_vgpu_plugin_registered() -> None:
    # Volcano's vGPU plugin registers cards under its own key and advertises shares (vgpu-number), not
    # cards: read as no GPUs, the node was invisible to placement and to the ceilings that refuse a node
    # gang no node can hold, so such a gang waited for ever.
    obj = make_node("vc-a", gpus=2)
    annotations = obj["metadata"]["annotations"]
    del annotations["hami.io/node-nvidia-register"]
    obj["status"]["capacity"].pop("nvidia.com/gpu", None)
    obj["status"]["allocatable"].pop("nvidia.com/gpu", None)
    node = parse_node(obj)
    assert node is not None and node.size == 2 and node.gpus[0].startswith("GPU-")
    assert node.model.startswith("NVIDIA")


def test_a_node_without_hami_counts_its_gpu_capacity() -> None:
    obj = make_node("plain", gpus=0, allocatable={"nvidia.com/gpu": "4"})
    node = parse_node(obj)
    assert node is not None and node.gpus == ("plain/gpu0", "plain/gpu1", "plain/gpu2", "plain/gpu3")


async def test_the_pool_controller_makes_a_gangs_pods_on_one_node() -> None:
    backend = FakeBackend(VirtualClock(), gpus=8, gpus_per_node=4)
    h = Harness([gpu_pool(max_count=8, step=8)], backend=backend, clock=backend.clock)  # type: ignore[arg-type]
    await h.start()
    try:
        solo = await h.run_job("alice", pool="gpu", command=("true",), lease_tag="solo")
        gang = await h.run_job("bob", pool="gpu", pods=4, command=("true",), lease_tag="gang")
        assert solo.state is JobState.SUCCEEDED and gang.state is JobState.SUCCEEDED
        node = {p.name: p.node for p in h.cp.tracker.snapshot()}
        (solo_node,) = {node[p] for p in solo.pods}
        gang_nodes = {node[p] for p in gang.pods}
        assert len(gang_nodes) == 1 and solo_node not in gang_nodes  # a whole free node for the gang
        view = next(v for v in h.cp.pools_view() if v["name"] == "gpu")
        assert view["largest_placeable"] == {"1": 3, "2": 1, "4": 0, "8": 0, "node": 0}
    finally:
        await h.stop()


@pytest.mark.parametrize(("args", "expect"), [
    ((2, None, None), (2, None)),
    ((None, 2, 4), (8, 4)),
    ((8, 2, 4), (8, 4)),
])
def test_virtual_nodes_flags(args: tuple[int | None, int | None, int | None], expect: tuple[int, int | None]) -> None:
    assert virtual_fleet(*args) == expect


@pytest.mark.parametrize("args", [(None, 2, None), (None, 0, 4), (6, 2, 4)])
def test_virtual_nodes_flags_that_disagree_are_refused(args: tuple[int | None, int | None, int | None]) -> None:
    with pytest.raises(UsageError):
        virtual_fleet(*args)


def test_a_gang_claims_its_fresh_pods_from_the_tightest_node_that_holds_them() -> None:
    from broker.claiming.tracker import Claim, Lease, Tracker
    from broker.pods import Pod, PodState

    tracker = Tracker({"gpu": gpu_pool(max_count=16)})
    layout = {"a": 2, "b": 5, "c": 4}  # node -> idle never-used pods
    for node, n in layout.items():
        for i in range(n):
            pod = Pod(f"{node}{i}", "gpu", (f"{node}-gpu{i}",), state=PodState.IDLE)
            pod.node = node
            tracker.add(pod)
    lease = tracker.claim(Claim("job-1", "alice", "gpu", pods=4), now=0.0)
    assert isinstance(lease, Lease) and {p.node for p in lease.pods} == {"c"}
    lease = tracker.claim(Claim("job-2", "alice", "gpu", pods=4), now=0.0)
    assert isinstance(lease, Lease) and {p.node for p in lease.pods} == {"b"}
    lease = tracker.claim(Claim("job-3", "alice", "gpu", pods=3), now=0.0)  # 2 on a, 1 on b: no node holds 3
    assert isinstance(lease, Lease) and len(lease.pods) == 3


async def test_a_pool_with_a_node_selector_never_leaves_its_node_set() -> None:
    backend = FakeBackend(VirtualClock(), gpus=8, gpus_per_node=4)
    small = gpu_pool(name="small", min_count=6, max_count=8, step=8,
                     node_selector={"firepool.dev/node": "fake-node-1"})
    h = Harness([small], backend=backend, clock=backend.clock)  # type: ignore[arg-type]
    await h.start()
    try:
        await h.run_for(5.0)
        pods = h.cp.tracker.snapshot()
        assert len(pods) == 4 and {p.node for p in pods} == {"fake-node-1"}  # the floor of 6 stops at the set's 4
        assert "node set" in h.cp.controller.last_plan["small"].reason
        view = next(v for v in h.cp.pools_view() if v["name"] == "small")
        assert view["nodes"] == 1 and view["largest_placeable"]["1"] == 0
    finally:
        await h.stop()


def test_firepool_pools_shows_largest_placeable_in_one_cell() -> None:
    from broker.cli_fleet import placeable_cell

    assert placeable_cell({"1": 3, "2": 1, "4": 0, "8": 0, "node": 0}) == "3/1/0/0/0"
    assert placeable_cell({}) == "-" and placeable_cell(None) == "-"


def test_a_quarantined_gpu_counts_as_taken_in_placement_and_largest_placeable() -> None:
    from broker.fleet.capacity import largest_placeable
    from broker.warmth.placing import fleet_of

    nodes = FakeBackend(VirtualClock(), gpus=8, gpus_per_node=4).nodes()
    whole = largest_placeable(fleet_of(nodes, [], {}))
    fenced = largest_placeable(fleet_of(nodes, [], {}, avoid={"fake-gpu-0", "not-a-gpu-here"}))
    assert whole["4"] == 2 and fenced["4"] == 1
    assert fenced["1"] == whole["1"] - 1
