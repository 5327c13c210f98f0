"""The Kubernetes backend against an in-memory API (tests/unit/k8s_fakeapi.py) on the virtual clock:
create → running → agent, image pull errors, start timeouts, pods lost or replaced, restart adoption."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.backends.kubernetes.backend import ANN_POD_UID, KubernetesBackend, LaunchError
from broker.backends.kubernetes.manifests import ANN_GPUS, ANN_READY
from broker.clock import VirtualClock
from broker.errors import AgentError, BackendError
from broker.pods import ANNOTATION_PREFIX
from broker.pools import parse_pool
from broker.ports.agent import FakeAgent
from broker.ports.backend import PodRequest
from tests.unit.k8s_fakeapi import FakeKubeApi

UUID = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
CPU = parse_pool({"name": "cpu", "template": {"image": "sandbox:1", "start_timeout_s": 60}})
GPU = parse_pool({"name": "h100", "gpus": 1, "standbys_per_active": 1, "template": {
    "image": "sandbox-gpu:1", "resources": {"limits": {"nvidia.com/gpu": 1}, "requests": {"nvidia.com/gpu": 1}},
    "standby": {"resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1},
                              "requests": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1}}}}})


class Harness:
    def __init__(self, api: FakeKubeApi | None = None) -> None:
        self.clock = VirtualClock()
        self.api = api or FakeKubeApi()
        self.agents: dict[str, FakeAgent] = {}
        self.secrets: dict[str, str] = {}
        self.backend = KubernetesBackend(self.clock, self.api, agent_factory=self._agent)  # type: ignore[arg-type]

    def _agent(self, endpoint: str, secret: str, pod: str) -> FakeAgent:
        self.secrets[pod] = secret
        return self.agents.setdefault(pod, FakeAgent(pod, self.clock))


async def settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = Harness()
    yield harness
    await harness.backend.close()


async def start(h: Harness, name: str, pool: Any = CPU, allocated: str = "", **kw: Any) -> Any:
    task = asyncio.create_task(h.backend.create(PodRequest(name=name, pool=pool, **kw)))
    await settle()
    await h.api.run_pod(name, allocated=allocated)
    return await asyncio.wait_for(task, 5)


async def test_create_returns_once_running_and_answering_with_ready_record_and_gpu_uuid(h: Harness) -> None:
    info = await start(h, "h100-0001", GPU, allocated=f"{UUID},NVIDIA,81920,100:;")
    assert info.gpus == (UUID,) and info.endpoint == "tcp:10.0.0.7:7070"
    assert set(info.details["ready"]) == {"scheduled", "image_pulled", "container_started", "agent_answered"}
    ann = h.api.pod("h100-0001")["metadata"]["annotations"]
    assert ann[ANN_GPUS] == UUID and '"agent_answered"' in ann[ANN_READY]
    secret = h.api.objects[("Secret", "h100-0001-agent")]
    assert secret["metadata"]["annotations"][ANN_POD_UID] == h.api.pod("h100-0001")["metadata"]["uid"]


async def test_standby_is_pinned_to_the_given_card(h: Harness) -> None:
    info = await start(h, "h100-0002", GPU, gpus=(UUID,))
    assert info.gpus == (UUID,)
    pod = h.api.pod("h100-0002")
    assert pod["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] == UUID
    assert pod["metadata"]["labels"]["firepool.io/role"] == "standby"


async def test_image_pull_error_is_a_typed_launch_error_and_the_next_create_fails_fast(h: Harness) -> None:
    task = asyncio.create_task(h.backend.create(PodRequest(name="cpu-0001", pool=CPU)))
    await settle()
    await h.api.fail_pull("cpu-0001")
    with pytest.raises(LaunchError) as caught:
        await asyncio.wait_for(task, 5)
    assert caught.value.details["reason"] == "ErrImagePull"
    assert not h.api.objects  # pod and Secret deleted: the budget goes back with the failed create
    creates = h.api.calls.count("create Pod")
    with pytest.raises(LaunchError, match="not retried"):
        await h.backend.create(PodRequest(name="cpu-0002", pool=CPU))
    assert h.api.calls.count("create Pod") == creates  # no retry storm against the API


async def test_pod_pending_past_start_timeout_is_deleted(h: Harness) -> None:
    task = asyncio.create_task(h.backend.create(PodRequest(name="cpu-0003", pool=CPU)))
    await settle()
    h.clock.advance_to(h.clock.now() + 61)
    with pytest.raises(BackendError, match="still not running"):
        await asyncio.wait_for(task, 5)
    assert not h.api.objects


async def test_creates_are_retried_on_429_and_5xx(h: Harness) -> None:
    h.api.fail_next = [429, 500]
    task = asyncio.create_task(h.backend.create(PodRequest(name="cpu-0004", pool=CPU)))
    for _ in range(5):
        await settle()
        h.clock.advance_to(h.clock.now() + 5)
    await h.api.run_pod("cpu-0004")
    await asyncio.wait_for(task, 5)
    assert h.api.calls.count("create Secret") == 3


async def test_pod_deleted_from_outside_is_lost_and_its_agent_unreachable(h: Harness) -> None:
    await start(h, "cpu-0005")
    client = h.backend.agent("cpu-0005")
    await h.api.delete("Pod", "cpu-0005")
    await settle()
    with pytest.raises(BackendError, match="deleted from outside"):
        h.backend.agent("cpu-0005")
    with pytest.raises(AgentError, match="was lost"):  # a client held by a running attempt: PodLost, not a result
        await client.status("job-1:0")


async def test_deletion_during_a_410_is_found_by_the_relist(h: Harness) -> None:
    await start(h, "cpu-0006")
    h.api.gone_once = True
    h.api.history.clear()  # the events are compacted away: only a re-list can tell
    h.api.objects.pop(("Pod", "cpu-0006"))
    h.api.rv += 1
    async with h.api.changed:
        h.api.changed.notify_all()
    await settle()
    assert h.backend.watcher.relists == 2
    with pytest.raises(BackendError, match="deleted from outside"):
        h.backend.agent("cpu-0006")


async def test_pod_replaced_under_the_same_name_is_not_trusted(h: Harness) -> None:
    await start(h, "cpu-0007")
    await h.api.replace_pod("cpu-0007")
    await settle()
    with pytest.raises(BackendError, match="is gone"):
        h.backend.agent("cpu-0007")
    assert await h.backend.list_pods() == []
    assert ("Pod", "cpu-0007") not in h.api.objects


async def test_restarted_backend_adopts_its_pods_with_their_owner_annotations(h: Harness) -> None:
    await start(h, "cpu-0008")
    await h.backend.annotate("cpu-0008", {ANNOTATION_PREFIX + "caller": "alice"})
    secret = h.secrets["cpu-0008"]
    await h.backend.close()
    again = Harness(h.api)
    try:
        infos = await again.backend.list_pods()
        assert [i.name for i in infos] == ["cpu-0008"]
        assert infos[0].annotations[ANNOTATION_PREFIX + "caller"] == "alice"
        assert again.secrets["cpu-0008"] == secret  # the agent is reached with the pod's own secret
    finally:
        await again.backend.close()


async def test_restarted_backend_distrusts_a_pod_whose_secret_names_another_uid(h: Harness) -> None:
    await start(h, "cpu-0009")
    await h.backend.close()
    await h.api.replace_pod("cpu-0009")
    again = Harness(h.api)
    try:
        assert await again.backend.list_pods() == []
        assert not h.api.objects  # the stranger and its Secret are deleted
    finally:
        await again.backend.close()


async def test_a_placed_pod_asks_the_scheduler_for_its_node_and_the_pools_node_set(h: Harness) -> None:
    from k8s_emulator.nodes import make_node

    h.api.objects[("Node", "gpu-a")] = make_node("gpu-a", gpus=2, labels={"firepool.io/shape": "small"})
    pool = parse_pool({**{"name": "small", "gpus": 1, "node_selector": {"firepool.io/shape": "small"}},
                       "template": {"image": "sandbox-gpu:1", "nodeSelector": {"zone": "a"}}})
    await start(h, "small-1", pool, node="gpu-a")
    assert h.api.pod("small-1")["spec"]["nodeSelector"] == {
        "zone": "a", "firepool.io/shape": "small", "kubernetes.io/hostname": "gpu-a"}
    assert [n.id for n in h.backend.nodes()] == ["gpu-a"]


async def test_topology_domains_come_from_the_configured_node_labels(h: Harness) -> None:
    from k8s_emulator.nodes import make_node

    h.api.objects[("Node", "gpu-a")] = make_node("gpu-a", gpus=1, labels={"example.com/rack": "r7",
                                                                         "topology.kubernetes.io/zone": "z1"})
    assert [n.domain for n in await h.backend.refresh_nodes()] == ["z1"]  # today's keys by default
    h.backend.set_domain_labels(["example.com/rack"])  # the catalog's topology_domain_labels
    assert [n.domain for n in await h.backend.refresh_nodes()] == ["r7"]
    h.backend.set_domain_labels(None)
    assert [n.domain for n in await h.backend.refresh_nodes()] == ["z1"]


async def test_a_node_whose_every_card_is_avoided_is_excluded_by_node_affinity(h: Harness) -> None:
    from k8s_emulator.nodes import gpu_uuid, make_node

    for name in ("gpu-a", "gpu-b"):
        h.api.objects[("Node", name)] = make_node(name, gpus=2)
    await h.backend.refresh_nodes()
    quarantined = frozenset({gpu_uuid("gpu-a", 0), gpu_uuid("gpu-a", 1), gpu_uuid("gpu-b", 0)})
    await start(h, "cpu-1", CPU, avoid=quarantined)  # a CPU pod stays off a quarantined node too
    affinity = h.api.pod("cpu-1")["spec"]["affinity"]["nodeAffinity"]
    assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-a"]}]}]
    await start(h, "cpu-2", CPU, avoid=frozenset({gpu_uuid("gpu-b", 0)}))  # one card of gpu-b: no node is out
    assert "affinity" not in h.api.pod("cpu-2")["spec"]


async def test_a_quarantined_node_the_node_list_leaves_out_is_excluded_by_node_affinity_too(h: Harness) -> None:
    # A node quarantined for faults of pods that hold no GPU (CPU pods) has no card to avoid, and the node
    # list (GPU nodes only) does not name it: its key in `avoid` keeps new pods off it.
    await start(h, "cpu-3", CPU, avoid=frozenset({"node:cpu-node-7"}))
    affinity = h.api.pod("cpu-3")["spec"]["affinity"]["nodeAffinity"]
    assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["cpu-node-7"]}]}]


async def test_a_pod_records_its_nodes_boot_epoch_and_a_fenced_pod_refuses_agent_calls(h: Harness) -> None:
    from k8s_emulator.nodes import make_node

    node = make_node("node-1", gpus=1)  # where the fake kubelet runs pods
    h.api.objects[("Node", "node-1")] = node
    info = await start(h, "cpu-1", CPU)
    assert info.node == "node-1" and info.details["node_epoch"] == node["status"]["nodeInfo"]["bootID"]
    h.backend.fence("cpu-1", "its node node-1 has another boot epoch")
    with pytest.raises(BackendError, match="another boot epoch"):
        h.backend.agent("cpu-1")


async def test_a_failed_node_list_keeps_the_last_one_and_the_next_read_recovers(h: Harness) -> None:
    from k8s_emulator.nodes import make_node

    h.api.objects[("Node", "gpu-a")] = make_node("gpu-a", gpus=1)
    assert [n.id for n in await h.backend.refresh_nodes()] == ["gpu-a"]
    h.api.objects[("Node", "gpu-b")] = make_node("gpu-b", gpus=1)
    h.api.fail_nodes = [503]  # the API server restarting: the node-epoch loop must not die of it
    assert [n.id for n in await h.backend.refresh_nodes()] == ["gpu-a"]
    assert [n.id for n in await h.backend.refresh_nodes()] == ["gpu-a", "gpu-b"]
