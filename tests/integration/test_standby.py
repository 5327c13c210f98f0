"""Standby pods on the real local backend: no CUDA in a standby, promotion only after the old tree is gone."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import BrokerProcess, both_backends, paths, run_job

pytestmark = pytest.mark.integration

CUDA_MAPPING = re.compile(r"libcuda\.|libcudart|libnvidia-|/dev/nvidia")
"""What a process that initialised CUDA (or loaded NVML) has mapped: the driver libraries and device nodes."""


def cuda_mappings(pid: int) -> list[str]:
    """The lines of /proc/<pid>/maps that belong to a CUDA library or a GPU device node."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert maps, f"/proc/{pid}/maps is empty"
    return [line for line in maps.splitlines() if CUDA_MAPPING.search(line)]


def pods(c: httpx.Client) -> list[dict]:
    return c.get("/v1/pods").json()["pods"]


def wait_for(cond, timeout: float = 30.0):  # noqa: ANN001, ANN201 - test helper
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def agent_pid(b: BrokerProcess, pod: str, cluster: Any = None) -> int:
    """The host pid of a pod's agent (its sandbox's PID 1): from the local pod record or the fake kubelet."""
    if cluster is not None:
        uid = cluster.pod(pod)["metadata"]["uid"]
        return int(cluster.kubelet.running[uid].record["pid"])
    return int(json.loads((b.state_dir / "pods" / pod / "pod.json").read_text())["pid"])


def gpu_pool(extra: str = "") -> str:
    return ("pools:\n  - {name: gpu, gpus: 1, max_count: 1, min_count: 1, standbys_per_active: 1, "
            f"idle_timeout: 60, caller_hold_seconds: 60{extra}}}\n")


def test_the_mapping_check_sees_a_loaded_cuda_library(tmp_path: Path) -> None:
    """The check below must be able to fail: a process that loaded a libcuda.so is caught."""
    name = ctypes.util.find_library("z")
    assert name, "zlib is needed as a stand-in shared object"
    ctypes.CDLL(name)
    source = next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                  if "libz.so" in line)
    fake = tmp_path / "libcuda.so.1"
    shutil.copy(source, fake)
    code = f"import ctypes, time; ctypes.CDLL({str(fake)!r}); print('ok', flush=True); time.sleep(30)"
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ok"
            assert any("libcuda.so.1" in line for line in cuda_mappings(proc.pid))
        finally:
            proc.kill()


@both_backends
def test_a_standby_runs_only_the_agent_and_never_maps_a_cuda_library(broker_factory, cluster: Any) -> None:
    b = broker_factory(pools=gpu_pool())
    c = b.client()
    ops = b.client("ops")  # standby pods have no caller yet: the operator's view
    job = run_job(c, {"pool": "gpu", "command": ["true"], "lease_tag": "a"})
    assert job["state"] == "SUCCEEDED"
    standby = wait_for(lambda: next((p for p in pods(ops) if p["standby"] and p["state"] == "idle"), None))
    active = next(p for p in pods(ops) if p["name"] == job["bound_pods"][0])
    assert standby["gpus"] == active["gpus"]  # pinned to the active pod's card
    pid = agent_pid(b, standby["name"], cluster)
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "python" in maps  # it is the agent we are looking at
    assert cuda_mappings(pid) == []
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert children == []  # nothing but the agent runs in a standby
    view = next(p for p in c.get("/v1/pools").json()["pools"] if p["name"] == "gpu")
    assert (view["standby"], view["physical"]) == (1, 1)  # the group counts as one GPU


def test_a_standby_is_promoted_only_after_the_previous_jobs_tree_is_gone(broker_factory, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    # reuse_tag: retire, the paper's rule: the boundary-crossing pod retires and the standby takes over.
    b = broker_factory(pools=gpu_pool(f", reuse_tag: retire, template: {{binds: [{{src: {shared}, dst: /shared, ro: false}}]}}"))
    c = b.client()
    ops = b.client("ops")  # standby pods have no caller yet: the operator's view
    first = run_job(c, {"pool": "gpu", "command": ["true"], "lease_tag": "a"})
    wait_for(lambda: any(p["standby"] and p["state"] == "idle" for p in pods(ops)))
    # Job 2 (a new tag: it runs once on the old pod) leaves a child holding a lock after rank 0 exits.
    holder = ("import fcntl, os, time\n"
              "f = open('/shared/lock', 'w'); fcntl.flock(f, fcntl.LOCK_EX)\n"
              "if os.fork() == 0:\n"
              "    os.setsid(); fd = os.open('/dev/null', os.O_RDWR)\n"
              "    [os.dup2(fd, n) for n in (0, 1, 2)]\n"
              "    time.sleep(120)\n"
              "    os._exit(0)\n"
              "time.sleep(1.5)\n")
    second = c.post("/v1/jobs", json={"pool": "gpu", "command": ["python3", "-c", holder], "lease_tag": "b"}).json()
    wait_for(lambda: c.get(f"/v1/jobs/{second['id']}").json()["state"] == "RUNNING")
    # Job 3 (another new tag) arrives while job 2 runs: it can only take the standby, and may start only
    # once job 2's whole tree (the lock holder included) is verified gone.
    probe = ("import fcntl, sys\n"
             "f = open('/shared/lock', 'w')\n"
             "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "except BlockingIOError:\n    sys.exit('the previous job still holds the lock')\n"
             "print('free')\n")
    third = run_job(c, {"pool": "gpu", "command": ["python3", "-c", probe], "lease_tag": "c"})
    assert third["state"] == "SUCCEEDED", c.get(f"/v1/jobs/{third['id']}/logs").text
    assert paths(third) == ["standby"], third
    second = c.get(f"/v1/jobs/{second['id']}").json()
    assert second["state"] == "SUCCEEDED" and paths(second) == ["recycled"]
    assert third["bound_pods"] != first["bound_pods"]
    # The old pod retired off the critical path and a fresh standby was staged into the open slot.
    wait_for(lambda: first["bound_pods"][0] not in {p["name"] for p in pods(ops)})
    wait_for(lambda: any(p["standby"] and p["state"] == "idle" for p in pods(ops)))


@both_backends
def test_a_gpu_job_gets_the_full_card_limit_and_a_fresh_shared_cache_per_attempt(broker_factory,
                                                                                   backend_kind: str) -> None:
    b = broker_factory(pools=gpu_pool())
    c = b.client()
    show = ["sh", "-c", 'echo "$CUDA_DEVICE_MEMORY_LIMIT_0 $CUDA_DEVICE_MEMORY_SHARED_CACHE"; '
            'touch "$CUDA_DEVICE_MEMORY_SHARED_CACHE"; ls "$(dirname "$CUDA_DEVICE_MEMORY_SHARED_CACHE")"']
    outputs = []
    for _ in range(2):
        job = run_job(c, {"pool": "gpu", "command": show, "lease_tag": "a",
                          "env": {"CUDA_DEVICE_MEMORY_LIMIT_0": "1m"}})
        assert job["state"] == "SUCCEEDED"
        outputs.append(c.get(f"/v1/jobs/{job['id']}/logs").text.split())
    (limit1, cache1, *listed1), (limit2, cache2, *listed2) = outputs
    # The whole card, not the caller's value: a virtual card's size, or the one HAMi allocated (the emulator's).
    assert limit1 == limit2 == ("143771m" if backend_kind == "local" else "81920m")
    assert cache1 != cache2
    assert listed1 == [Path(cache1).name]
    assert listed2 == [Path(cache2).name]  # the reset removed the first attempt's accounting file


@both_backends
def test_a_restarted_broker_restores_its_standbys_and_promotes_them_after_the_sweep(broker_factory) -> None:
    b = broker_factory(pools=gpu_pool())
    c = b.client()
    ops = b.client("ops")  # standby pods have no caller yet: the operator's view
    first = run_job(c, {"pool": "gpu", "command": ["true"], "lease_tag": "a"})
    standby = wait_for(lambda: next((p for p in pods(ops) if p["standby"] and p["state"] == "idle"), None))
    b.kill()
    b.start()
    c = b.client("bob")
    restored = {p["name"]: p for p in pods(ops)}
    assert restored[standby["name"]]["standby"] and not restored[first["bound_pods"][0]]["standby"]
    job = run_job(c, {"pool": "gpu", "command": ["true"], "lease_tag": "b"})
    assert job["state"] == "SUCCEEDED" and paths(job) == ["standby"]  # alice's pod stays held for her
    assert job["bound_pods"] == [standby["name"]]
