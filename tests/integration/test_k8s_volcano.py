"""Volcano gangs through the official client against the emulator: the backend makes one PodGroup per batch of
a gang's pods (minMember, the pool's queue) and deletes it with the last of them; the emulated scheduler binds
a PodGroup's pods all (minMember) or none."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from broker.backends.kubernetes.backend import KubernetesBackend
from broker.pools import parse_pool
from broker.ports.backend import PodRequest
from k8s_emulator import Emulator
from k8s_emulator.kubelet import KubeletConfig
from tests.integration.conftest import run_job
from tests.integration.test_k8s_backend import core, new_backend

pytestmark = pytest.mark.integration

PODGROUPS = ("scheduling.volcano.sh", "v1beta1", "default", "podgroups")
GROUP_KEY = "scheduling.k8s.io/group-name"
VOLCANO = parse_pool({"name": "vgpu", "gpus": 1, "template": {
    "image": "firepool/sandbox-gpu:0.1.0", "schedulerName": "volcano", "queue": "research", "start_timeout_s": 60}})


def custom(emu: Emulator) -> Any:
    return kubernetes.client.CustomObjectsApi(emu.client())


def groups(emu: Emulator) -> dict[str, Any]:
    return {g["metadata"]["name"]: g for g in custom(emu).list_namespaced_custom_object(*PODGROUPS)["items"]}


def until(check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {check}")
        time.sleep(0.02)
    return value


async def _gang(b: KubernetesBackend, names: list[str]) -> list[Any]:
    batch = (names[0], len(names))
    return list(await asyncio.gather(*(b.create(PodRequest(name=n, pool=VOLCANO, gang="j0123456789abcdefgh",
                                                           gang_size=4, gang_batch=batch)) for n in names)))


async def test_a_volcano_gang_batch_gets_one_podgroup_in_the_pools_queue_that_goes_with_its_last_pod(
        tmp_path: Path) -> None:
    with Emulator(tmp_path / "k8s", gpus=2, nodes=2) as emu:
        emu.hurry_deletes()  # each delete here is about the PodGroups, not the pods' grace (5 s each)
        b = new_backend(emu)
        try:
            infos = await _gang(b, ["vgpu-r0", "vgpu-r1"])
            assert all(i.details["node"] for i in infos)
            group = groups(emu)["vgpu-r0-gang"]
            assert group["kind"] == "PodGroup" and group["spec"] == {"minMember": 2, "queue": "research"}
            assert group["metadata"]["labels"]["firepool.io/broker"] == "firepool"
            for name in ("vgpu-r0", "vgpu-r1"):
                pod = emu.pod(name)
                assert pod["metadata"]["annotations"][GROUP_KEY] == "vgpu-r0-gang"
                assert pod["spec"]["schedulerName"] == "volcano"
            await b.delete("vgpu-r0")
            assert "vgpu-r0-gang" in groups(emu)  # the gang still has a pod
            await b.delete("vgpu-r1")
            assert groups(emu) == {}
            # A pod outside any gang names the pool's queue instead; no PodGroup is made for it.
            await b.create(PodRequest(name="vgpu-solo", pool=VOLCANO))
            assert emu.pod("vgpu-solo")["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] == "research"
            assert groups(emu) == {}
        finally:
            emu.hurry_deletes()  # the teardown tests nothing of the grace
            await asyncio.gather(*(b.delete(n) for n in list(b.cache.pods)))
            await b.close()


async def test_a_restarted_broker_deletes_the_podgroups_whose_pods_went_and_keeps_its_live_gangs(
        tmp_path: Path) -> None:
    with Emulator(tmp_path / "k8s", gpus=2, nodes=2) as emu:
        emu.hurry_deletes()  # each delete here is about the PodGroups, not the pods' grace (5 s each)
        first = new_backend(emu)
        await _gang(first, ["vgpu-a0", "vgpu-a1"])
        await first.close()
        custom(emu).create_namespaced_custom_object(*PODGROUPS, {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "vgpu-gone-gang", "labels": {"firepool.io/broker": "firepool"}},
            "spec": {"minMember": 2, "queue": "research"}})
        custom(emu).create_namespaced_custom_object(*PODGROUPS, {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "someone-elses"}, "spec": {"minMember": 2}})
        second = new_backend(emu)
        try:
            assert {p.name for p in await second.list_pods()} == {"vgpu-a0", "vgpu-a1"}
            assert set(groups(emu)) == {"vgpu-a0-gang", "someone-elses"}
            await second.delete("vgpu-a0")
            await second.delete("vgpu-a1")
            assert set(groups(emu)) == {"someone-elses"}
        finally:
            emu.hurry_deletes()  # the teardown tests nothing of the grace
            await asyncio.gather(*(second.delete(n) for n in list(second.cache.pods)))
            await second.close()


def _member(name: str, group: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {GROUP_KEY: group} if group else {}},
            "spec": {"restartPolicy": "Never", "schedulerName": "volcano",
                     "containers": [{"name": "agent", "image": "firepool/agent:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def test_the_emulated_scheduler_binds_a_podgroups_pods_all_or_none(tmp_path: Path) -> None:
    with Emulator(tmp_path / "k8s", gpus=1, nodes=2, kubelet=KubeletConfig(agents=False, retry_s=0.05)) as emu:
        api, crd = core(emu), custom(emu)
        crd.create_namespaced_custom_object(*PODGROUPS, {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": "g"},
            "spec": {"minMember": 2, "queue": "default"}})
        api.create_namespaced_pod("default", _member("busy", ""))  # holds node-0's card
        until(lambda: emu.pod("busy")["spec"].get("nodeName"))
        api.create_namespaced_pod("default", _member("g-0", "g"))
        api.create_namespaced_pod("default", _member("g-1", "g"))
        # One free card for a group of two: neither binds (a plain pod would take it).
        until(lambda: "minMember 2" in str(emu.pod("g-0")["status"].get("conditions")))
        time.sleep(0.3)
        assert not emu.pod("g-0")["spec"].get("nodeName") and not emu.pod("g-1")["spec"].get("nodeName")
        api.delete_namespaced_pod("busy", "default", grace_period_seconds=0)
        until(lambda: all(emu.pod(n)["spec"].get("nodeName") for n in ("g-0", "g-1")))
        assert {emu.pod(n)["spec"]["nodeName"] for n in ("g-0", "g-1")} == {"node-0", "node-1"}


def test_the_emulator_serves_podgroups_to_get_select_and_watch(tmp_path: Path) -> None:
    with Emulator(tmp_path / "k8s", kubelet=False) as emu:
        crd = custom(emu)
        stream = crd.list_namespaced_custom_object(*PODGROUPS, watch=True, timeout_seconds=2,
                                                   _preload_content=False)
        crd.create_namespaced_custom_object(*PODGROUPS, {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "mine", "labels": {"firepool.io/broker": "b1"}}, "spec": {"minMember": 3}})
        crd.create_namespaced_custom_object(*PODGROUPS, {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": "other"},
            "spec": {"minMember": 1}})
        assert crd.get_namespaced_custom_object(*PODGROUPS, "mine")["spec"]["minMember"] == 3
        selected = crd.list_namespaced_custom_object(*PODGROUPS, label_selector="firepool.io/broker=b1")["items"]
        assert [g["metadata"]["name"] for g in selected] == ["mine"]
        first = stream.readline()
        assert b'"ADDED"' in first and b'"mine"' in first
        stream.release_conn()


VOLCANO_CATALOG = """
pools:
  - name: vgpu
    gpus: 1
    max_count: 2
    idle_timeout: 600
    step: 2
    template: {image: "firepool/sandbox-gpu:0.1.0", schedulerName: volcano, queue: research, start_timeout_s: 60}
"""


@pytest.mark.parametrize("backend_kind", ["kubernetes"], indirect=True)
def test_a_gang_job_on_a_volcano_pool_runs_on_pods_of_one_podgroup_in_its_queue(
        broker_factory: Any, cluster: Emulator) -> None:
    b = broker_factory(pools=VOLCANO_CATALOG)
    job = run_job(b.client("alice"), {"pool": "vgpu", "pods": 2, "command": ["true"]})
    assert job["state"] == "SUCCEEDED", job
    (group,) = groups(cluster).values()
    assert group["spec"] == {"minMember": 2, "queue": "research"}
    pods = core(cluster).list_namespaced_pod("default", label_selector="firepool.io/pool=vgpu").items
    assert len(pods) == 2 and {p.metadata.annotations.get(GROUP_KEY) for p in pods} == {group["metadata"]["name"]}
