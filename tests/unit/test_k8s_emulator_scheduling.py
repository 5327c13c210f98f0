"""The Kubernetes emulator's scheduler: pure placement over node and pod JSON."""

from __future__ import annotations

from typing import Any

from k8s_emulator.nodes import ALLOCATED, USE_UUID, gpu_uuid, make_node
from k8s_emulator.scheduling import place, quantity

GANG = {"labelSelector": {"matchLabels": {"firepool.io/gang": "g1"}}, "topologyKey": "kubernetes.io/hostname"}


def pod(name: str, *, node: str = "", labels: dict[str, str] | None = None, limits: dict[str, str] | None = None,
        requests: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels or {}, "annotations": annotations or {}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {
                "limits": limits or {}, "requests": requests or {}}}], **spec}}


def test_quantities_read_as_cores_and_bytes() -> None:
    assert quantity("500m") == 0.5 and quantity("2") == 2 and quantity("1Gi") == 2**30 and quantity("1M") == 1e6


def test_a_taint_keeps_pods_off_unless_they_tolerate_it() -> None:
    tainted = make_node("gpu-0", gpus=1, taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    assert place(pod("p"), [tainted], [])[0] is None
    assert "untolerated taint" in place(pod("p"), [tainted], [])[2]
    tolerant = pod("p", tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    assert place(tolerant, [tainted], [])[0] == "gpu-0"


def test_cpu_requests_count_against_allocatable() -> None:
    node = make_node("n", cpu="2")
    running = [pod("a", node="n", requests={"cpu": "1500m"})]
    assert place(pod("b", requests={"cpu": "1"}), [node], running)[2].endswith("1 Insufficient cpu.")
    assert place(pod("b", requests={"cpu": "500m"}), [node], running)[0] == "n"


def test_required_pod_affinity_follows_the_first_of_the_gang_which_may_start_anywhere() -> None:
    nodes = [make_node("n0"), make_node("n1")]
    first = pod("r0", labels={"firepool.io/gang": "g1"}, affinity={"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [GANG]}})
    assert place(first, nodes, [])[0] == "n0"
    placed = [{**first, "spec": {**first["spec"], "nodeName": "n1"}}]
    second = pod("r1", labels={"firepool.io/gang": "g1"}, affinity=first["spec"]["affinity"])
    assert place(second, nodes, placed)[0] == "n1"
    stranger = pod("x", affinity=first["spec"]["affinity"])  # does not match its own term: cannot start a group
    assert place(stranger, nodes, [])[0] is None


def test_preferred_pod_affinity_ranks_the_node_of_the_gang_first() -> None:
    nodes = [make_node("n0"), make_node("n1")]
    placed = [pod("r0", node="n1", labels={"firepool.io/gang": "g1"})]
    second = pod("r1", labels={"firepool.io/gang": "g1"}, affinity={"podAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": GANG}]}})
    assert place(second, nodes, placed)[0] == "n1"
    assert place(second, nodes, [])[0] == "n0"


def test_whole_cards_are_exclusive_shares_are_not_and_a_pin_names_the_card() -> None:
    node = make_node("n", gpus=2)
    card0, card1 = gpu_uuid("n", 0), gpu_uuid("n", 1)
    active = pod("active", node="n", limits={"nvidia.com/gpu": "1"}, annotations={ALLOCATED: f"{card0},NVIDIA,0,100:;"})
    assert place(pod("b", limits={"nvidia.com/gpu": "1"}), [node], [active])[1] == [card1]
    assert place(pod("c", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1"}), [node], [active])[1] == [card1]
    pinned = pod("s", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1"}, annotations={USE_UUID: card0})
    assert place(pinned, [node], [active])[1] == [card0]
    second = pod("b", node="n", limits={"nvidia.com/gpu": "1"}, annotations={ALLOCATED: f"{card1},NVIDIA,0,100:;"})
    both = [active, second]
    assert place(pod("d", limits={"nvidia.com/gpu": "1"}), [node], both)[0] is None


def test_volcano_vgpu_requests_count_as_cards_and_shares() -> None:
    node = make_node("n", gpus=1)
    card = gpu_uuid("n", 0)
    assert node["metadata"]["annotations"]["volcano.sh/node-vgpu-register"].startswith(card)
    whole = pod("v", limits={"volcano.sh/vgpu-number": "1"}, schedulerName="volcano")
    assert place(whole, [node], [])[1] == [card]
    holder = pod("a", node="n", limits={"volcano.sh/vgpu-number": "1"}, annotations={ALLOCATED: f"{card},NVIDIA,0,100:;"})
    share = pod("s", limits={"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1"},
                annotations={USE_UUID: card})
    assert place(share, [node], [holder])[1] == [card]
    assert place(whole, [node], [holder])[0] is None


def test_required_node_affinity_keeps_a_pod_off_the_nodes_it_excludes() -> None:
    nodes = [make_node("n0", gpus=1, labels={"tier": "a"}), make_node("n1", gpus=1, labels={"tier": "b"})]
    limits = {"nvidia.com/gpu": "1"}
    assert place(pod("p", limits=limits), nodes, [])[0] == "n0"
    notin = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n0"]}]}]}}}
    assert place(pod("p", limits=limits, affinity=notin), nodes, [])[0] == "n1"
    both = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n0", "n1"]}]}]}}}
    node, _, why = place(pod("p", limits=limits, affinity=both), nodes, [])
    assert node is None and "didn't match Pod's node affinity" in why
    tier = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["b"]}]},
        {"matchExpressions": [{"key": "missing", "operator": "Exists"}]}]}}}
    assert place(pod("p", limits=limits, affinity=tier), nodes, [])[0] == "n1"  # terms are ORed


def test_cards_a_pod_must_not_use_are_never_given_to_it() -> None:
    node = make_node("n0", gpus=2)
    limits = {"nvidia.com/gpu": "1"}
    assert place(pod("p", limits=limits), [node], [])[1] == [gpu_uuid("n0", 0)]
    avoiding = pod("p", limits=limits, annotations={"nvidia.com/nouse-gpuuuid": gpu_uuid("n0", 0)})
    assert place(avoiding, [node], [])[1] == [gpu_uuid("n0", 1)]
    both = pod("p", limits=limits, annotations={"nvidia.com/nouse-gpuuuid": f"{gpu_uuid('n0', 0)},{gpu_uuid('n0', 1)}"})
    assert place(both, [node], [])[0] is None
