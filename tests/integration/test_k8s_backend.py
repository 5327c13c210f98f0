"""The kubernetes backend against the API emulator, through the official client over HTTP, with real
agents: watch drops and 410s, pods deleted or replaced from outside, image pull errors, 429/5xx."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from broker.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings, LaunchError
from broker.backends.kubernetes.kubeapi import KubeApi
from broker.clock import RealClock
from broker.errors import BackendError
from broker.pools import parse_pool
from broker.ports.backend import PodRequest
from k8s_emulator import BROKER_TOKEN, Emulator
from k8s_emulator.rbac import DEPLOY, shipped_grants
from tests.integration.conftest import BrokerProcess, run_job

pytestmark = pytest.mark.integration

CPU = parse_pool({"name": "cpu", "template": {"image": "firepool/sandbox-cpu:0.1.0", "start_timeout_s": 60}})


def core(emu: Emulator) -> Any:
    """The test's own client: the emulator's admin, past RBAC."""
    return kubernetes.client.CoreV1Api(emu.client())


def new_backend(emu: Emulator, broker_id: str = "firepool", settings: KubernetesSettings | None = None
                ) -> KubernetesBackend:
    """A backend as the broker's service account: the shipped Role is all it may do."""
    settings = settings or KubernetesSettings(broker_id=broker_id)
    api = KubeApi(emu.client(BROKER_TOKEN), "default", settings.timeouts)
    return KubernetesBackend(RealClock(), api, settings)


@pytest.fixture
def emu(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Emulator]:
    """The broker's rights are the base deploy's, or an overlay's (`indirect` param: hami, volcano), whose
    card sweep may list pods in every namespace."""
    overlay = getattr(request, "param", None)
    rbac = shipped_grants(DEPLOY / "overlays" / overlay) if overlay else True
    with Emulator(tmp_path / "k8s", gpus=2, rbac=rbac) as emulator:
        yield emulator


@pytest.fixture
async def backend(emu: Emulator) -> AsyncIterator[KubernetesBackend]:
    b = new_backend(emu)
    try:
        yield b
    finally:
        emu.hurry_deletes()  # the teardown's deletes test nothing of the grace: skip its 5 s per pod
        for name in list(b.cache.pods):
            await b.delete(name)
        await b.close()


async def until_gone(b: KubernetesBackend, name: str, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            b.agent(name)
        except BackendError as exc:
            return str(exc)
        await asyncio.sleep(0.02)
    raise AssertionError(f"the backend still trusts {name}")


async def test_a_pod_runs_a_job_through_its_agent_at_the_pod_ip(backend: KubernetesBackend, emu: Emulator) -> None:
    info = await backend.create(PodRequest(name="cpu-run", pool=CPU))
    assert info.endpoint.startswith("tcp:127.1.") and info.details["node"] == "node-0"
    assert all(v is not None for v in info.details["ready"].values())
    health = await backend.agent("cpu-run").health()
    assert health.pod == "cpu-run" and health.isolated


async def test_watch_dropped_and_410_mid_stream_loses_no_event_and_forgets_no_pod(
        backend: KubernetesBackend, emu: Emulator) -> None:
    await backend.create(PodRequest(name="cpu-a", pool=CPU))
    emu.drop_watches()
    emu.fail_next("watch", "pods", 410)
    await backend.create(PodRequest(name="cpu-b", pool=CPU))  # its Running arrives only through the new watch
    emu.compact()
    emu.drop_watches()  # the resume from an old version now gets 410: only a re-list sees what follows
    await asyncio.to_thread(core(emu).delete_namespaced_pod, "cpu-a", "default")
    assert "not by this broker" in await until_gone(backend, "cpu-a") or \
        "deleted from outside" in await until_gone(backend, "cpu-a")
    assert backend.watcher.relists >= 2
    assert [p.name for p in await backend.list_pods()] == ["cpu-b"]


async def test_image_pull_error_is_a_typed_launch_error_with_no_retry_storm(
        backend: KubernetesBackend, emu: Emulator) -> None:
    broken = parse_pool({"name": "broken", "template": {"image": "sandbox:does-not-exist"}})
    with pytest.raises(LaunchError) as caught:
        await backend.create(PodRequest(name="broken-1", pool=broken))
    assert caught.value.details["reason"] in ("ErrImagePull", "ImagePullBackOff")
    pods = await asyncio.to_thread(core(emu).list_namespaced_pod, "default")
    secrets = await asyncio.to_thread(core(emu).list_namespaced_secret, "default")
    assert pods.items == [] and secrets.items == []  # deleted: the budget is released with the failed create
    with pytest.raises(LaunchError, match="not retried"):
        await backend.create(PodRequest(name="broken-2", pool=broken))
    pods = await asyncio.to_thread(core(emu).list_namespaced_pod, "default")
    assert pods.items == []  # the second create never reached the API


async def test_creates_back_off_on_429_and_500(backend: KubernetesBackend, emu: Emulator) -> None:
    emu.fail_next("create", "pods", 429, retry_after_s=1)
    emu.fail_next("create", "secrets", 500)
    info = await backend.create(PodRequest(name="cpu-retry", pool=CPU))
    assert info.name == "cpu-retry"


async def test_a_pod_replaced_under_the_same_name_is_not_trusted_after_a_restart(emu: Emulator) -> None:
    first = new_backend(emu)
    await first.create(PodRequest(name="cpu-twin", pool=CPU))
    await first.close()
    api = core(emu)
    old = await asyncio.to_thread(api.read_namespaced_pod, "cpu-twin", "default", _preload_content=False)
    body = __import__("json").loads(old.data)
    await asyncio.to_thread(api.delete_namespaced_pod, "cpu-twin", "default")
    deadline = time.monotonic() + 15
    while any(p.metadata.name == "cpu-twin" for p in (await asyncio.to_thread(api.list_namespaced_pod, "default")).items):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    twin = {"apiVersion": "v1", "kind": "Pod", "spec": body["spec"],
            "metadata": {k: body["metadata"][k] for k in ("name", "labels", "annotations")}}
    await asyncio.to_thread(api.create_namespaced_pod, "default", twin)  # same name, labels, Secret: a new UID
    second = new_backend(emu)
    try:
        assert await second.list_pods() == []
        left = await asyncio.to_thread(api.list_namespaced_pod, "default")
        assert [p.metadata.name for p in left.items if not p.metadata.deletion_timestamp] == []
    finally:
        await second.close()


@pytest.mark.parametrize("backend_kind", ["kubernetes"], indirect=True)
def test_a_pod_deleted_from_outside_during_a_job_ends_the_attempt_pod_lost_and_it_is_retried(
        broker_factory: Any, cluster: Emulator) -> None:
    b: BrokerProcess = broker_factory()
    c = b.client()
    job = c.post("/v1/jobs", json={"pool": "cpu", "max_retries": 1, "lease_tag": "lost",
                                   "command": ["python3", "-c", "import time; time.sleep(4); print('ran')"]}).json()
    deadline = time.monotonic() + 30
    while (view := c.get(f"/v1/jobs/{job['id']}").json())["state"] != "RUNNING":
        assert time.monotonic() < deadline, view
        time.sleep(0.05)
    time.sleep(0.5)
    core(cluster).delete_namespaced_pod(view["bound_pods"][0], "default")
    done = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "other"})
    assert done["state"] == "SUCCEEDED"
    final = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 30}).json()
    assert final["state"] == "SUCCEEDED" and final["retries"] == 1, final
    assert final["attempts"][0].get("error_class") == "PodLost", final["attempts"]
    assert c.get(f"/v1/jobs/{job['id']}/logs").text == "ran\n"
    pods = {p["name"]: p for p in c.get("/v1/pods").json()["pods"]}
    assert view["bound_pods"][0] not in pods
    # Every pod's ready record: seconds from its create call to each stage, in order.
    for pod in pods.values():
        stages = [pod["ready"][s] for s in ("scheduled", "image_pulled", "container_started", "agent_answered")]
        assert None not in stages and stages == sorted(stages), pod


async def test_a_pod_pending_past_its_start_timeout_is_deleted(tmp_path: Path) -> None:
    from k8s_emulator import KubeletConfig

    slow = parse_pool({"name": "slow", "template": {"image": "firepool/sandbox-cpu:0.1.0", "start_timeout_s": 0.5}})
    with Emulator(tmp_path / "k8s", kubelet=KubeletConfig(start_delay_s=5.0)) as emulator:
        b = new_backend(emulator)
        try:
            t0 = time.monotonic()
            with pytest.raises(BackendError, match="still not running") as caught:
                await b.create(PodRequest(name="slow-1", pool=slow))
            assert time.monotonic() - t0 < 4.0
            assert caught.value.details["ready"]["scheduled"] is not None  # where it got stuck
            pods = await asyncio.to_thread(core(emulator).list_namespaced_pod, "default")
            assert [p.metadata.name for p in pods.items if not p.metadata.deletion_timestamp] == []
        finally:
            await b.close()


async def test_an_agent_killed_from_outside_makes_its_pod_lost(backend: KubernetesBackend, emu: Emulator) -> None:
    await backend.create(PodRequest(name="cpu-oom", pool=CPU))
    assert emu.crash("cpu-oom")
    assert "not by this broker" in await until_gone(backend, "cpu-oom")
    assert await backend.list_pods() == []  # and the failed pod is deleted


async def test_an_evicted_pod_is_lost_and_a_410_mid_stream_forgets_nothing(
        backend: KubernetesBackend, emu: Emulator) -> None:
    await backend.create(PodRequest(name="cpu-keep", pool=CPU))
    await backend.create(PodRequest(name="cpu-evict", pool=CPU))
    relists = backend.watcher.relists
    assert emu.expire_watches() >= 1  # ERROR 410 in the open stream: the backend re-lists
    assert emu.evict("cpu-evict")
    assert "Evicted" in await until_gone(backend, "cpu-evict")
    assert backend.watcher.relists > relists
    assert [p.name for p in await backend.list_pods()] == ["cpu-keep"]  # the evicted pod's object is deleted


@pytest.mark.parametrize(("emu", "sharing"), [("hami", "hami"), ("volcano", "volcano")], indirect=["emu"])
async def test_a_standby_lands_on_its_active_pods_card(backend: KubernetesBackend, sharing: str) -> None:
    card, share = (("nvidia.com/gpu", "nvidia.com/gpumem") if sharing == "hami"
                   else ("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory"))
    pool = parse_pool({"name": "h100", "gpus": 1, "standbys_per_active": 1, "template": {
        "image": "firepool/sandbox-gpu:0.1.0", "schedulerName": "volcano" if sharing == "volcano" else "hami-scheduler",
        "resources": {"requests": {card: 1}, "limits": {card: 1}},
        "standby": {"resources": {"requests": {card: 1, share: 1}, "limits": {card: 1, share: 1}}}}})
    active = await backend.create(PodRequest(name="h100-active", pool=pool))
    assert len(active.gpus) == 1 and active.gpus[0].startswith("GPU-")
    standby = await backend.create(PodRequest(name="h100-standby", pool=pool, gpus=active.gpus))
    assert standby.gpus == active.gpus and standby.details["node"] == active.details["node"]
    assert [d.key for d in backend.devices()] == list(active.gpus)  # the card's size, from the active pod only
    infos = {i.name: i for i in await backend.list_pods()}
    assert "foreign" not in infos["h100-active"].details  # the sweep finds the card the group's alone


@pytest.mark.parametrize("emu", ["hami"], indirect=True)
async def test_a_share_held_outside_the_group_fences_the_card(backend: KubernetesBackend, emu: Emulator) -> None:
    pool = parse_pool({"name": "h100", "gpus": 1, "standbys_per_active": 1,
                       "template": {"image": "firepool/sandbox-gpu:0.1.0"}})
    active = await backend.create(PodRequest(name="h100-active", pool=pool))
    await backend.create(PodRequest(name="h100-standby", pool=pool, gpus=active.gpus))
    stranger = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stranger", "annotations": {
        "nvidia.com/use-gpuuuid": active.gpus[0]}}, "spec": {"containers": [{"name": "c", "image": "other:1",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}}}]}}
    await asyncio.to_thread(core(emu).create_namespaced_pod, "default", stranger)
    deadline = time.monotonic() + 10
    while "hami.io/vgpu-devices-allocated" not in (emu.pod("stranger")["metadata"].get("annotations") or {}):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    infos = {i.name: i for i in await backend.list_pods()}
    assert infos["h100-active"].details["foreign"] == active.gpus
    from broker.warmth.standby import exclusive_cards

    assert exclusive_cards(infos.values()) == set()  # promotions on that card stay fenced
    await asyncio.to_thread(core(emu).delete_namespaced_pod, "stranger", "default")


@pytest.mark.parametrize("backend_kind", ["kubernetes"], indirect=True)
async def test_a_notebook_kernel_binds_its_pod_ip_and_runs_code(
        broker_factory: Any, cluster: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod's loopback is reachable from nowhere else: the backend tells the kernel its pod IP, whatever
    `--ip` the kernelspec asked for, and the Jupyter client dials it there."""
    import subprocess
    import sys

    from jupyter_client.manager import AsyncKernelManager

    b: BrokerProcess = broker_factory()
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    monkeypatch.setenv("FIREPOOL_URL", b.url)
    monkeypatch.setenv("FIREPOOL_TOKEN", b.tokens["alice"])
    r = subprocess.run([sys.executable, "-m", "broker.cli", "kernelspec", "install", "--pool", "cpu", "--name", "fp-k8s",
                        "--user"], env=b.env("alice") | {"JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data")},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    km = AsyncKernelManager(kernel_name="fp-k8s")
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        pod_ips = {p.status.pod_ip for p in core(cluster).list_namespaced_pod("default").items}
        assert kc.ip in pod_ips and kc.ip != "127.0.0.1", (kc.ip, pod_ips)
        reply = await kc.execute_interactive("x = 6 * 7", timeout=60)
        assert reply["content"]["status"] == "ok"
        seen: list[str] = []
        await kc.execute_interactive("print(x)", timeout=60,
                                     output_hook=lambda m: seen.append(m["content"].get("text", "")))
        assert "".join(seen) == "42\n"
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
