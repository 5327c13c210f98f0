"""Pod resource limits on real bubblewrap sandboxes and this host's real cgroups.

A job past its memory, pids or disk cap fails with a typed error (OutOfMemory, TooManyProcesses,
DiskFull) while the host and a concurrent pod carry on; a CPU cap throttles; a deleted pod leaves
no cgroup and no mounted disk behind, even when the broker died while the pod was starting.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from broker.backends import cgroups
from broker.backends.local import LocalBackend
from broker.clock import RealClock
from broker.pools import PoolSpec
from broker.ports.agent import AttemptStatus, LaunchRequest, ResetRequest
from broker.ports.backend import PodRequest
from tests.integration.conftest import delete_pods, run_job

pytestmark = pytest.mark.integration

MiB = 1 << 20
HOG = "import time\nchunks = []\nwhile True:\n    chunks.append(bytearray(32 << 20))\n    time.sleep(0.01)\n"
FORK_BOMB = ("import os, time\nwhile True:\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)\n")


def need_limits(backend: LocalBackend) -> None:
    assert backend.limiter.cgroups.enabled, f"this host should have writable cgroups: {backend.limiter.cgroups.reason}"
    assert backend.limiter.disk_off is None, f"this host should cap pod disks: {backend.limiter.disk_off}"


async def run(backend: LocalBackend, pod: str, attempt_id: str, *argv: str, wait_s: float = 60) -> AttemptStatus:
    agent = backend.agent(pod)
    await agent.launch(LaunchRequest(attempt_id=attempt_id, argv=argv, env={}, session="s"))
    status = await agent.wait(attempt_id, wait_s)
    assert not status.running, f"{attempt_id} still running after {wait_s} s"
    return status


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable")


async def test_memory_cap_kills_only_its_pod_with_out_of_memory_and_the_pod_resets(backend: LocalBackend) -> None:
    need_limits(backend)
    pool = PoolSpec(name="small", template={"memory": "192Mi"})
    await asyncio.gather(backend.create(PodRequest(name="hog", pool=pool)),
                         backend.create(PodRequest(name="calm", pool=pool)))
    lowest = [mem_available()]
    before = lowest[0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            lowest[0] = min(lowest[0], mem_available())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        calm, hog = await asyncio.gather(
            run(backend, "calm", "a-calm", "sh", "-c", "sleep 2; echo fine"),
            run(backend, "hog", "a-hog", "python3", "-c", HOG))
    finally:
        stop.set()
        sampler.join()
    assert hog.error_class == "OutOfMemory" and hog.oom, hog
    assert calm.exit_code == 0 and calm.error_class is None, calm
    # The hog asked for unbounded memory; the host lost at most about its cap (plus others' noise).
    assert before - lowest[0] < 1024 * MiB, f"host MemAvailable fell by {(before - lowest[0]) >> 20} MiB"
    await backend.agent("hog").reset(ResetRequest(wipe_workspace=True))
    after = await run(backend, "hog", "a-after", "python3", "-c", "print(sum(range(10)))")
    assert after.exit_code == 0 and after.error_class is None


async def test_fork_bomb_is_bounded_by_pids_and_fails_too_many_processes(backend: LocalBackend) -> None:
    need_limits(backend)
    await backend.create(PodRequest(name="forky", pool=PoolSpec(name="forky", template={"pids": 48})))
    status = await run(backend, "forky", "a-bomb", "python3", "-c", FORK_BOMB)
    assert status.error_class == "TooManyProcesses", status
    name = cgroups.cgroup_name("forky", backend.state_dir)
    assert int((backend.limiter.cgroups.bases["pids"] / name / "pids.max").read_text()) == 48
    await backend.agent("forky").reset(ResetRequest(wipe_workspace=True))
    assert (await run(backend, "forky", "a-next", "true")).exit_code == 0


@pytest.mark.parametrize("target", ["/workspace/big", "/tmp/big", "/dev/shm/big", "/scratch/big"])
async def test_writing_past_a_disk_cap_fails_disk_full_and_spares_the_host(backend: LocalBackend, target: str) -> None:
    need_limits(backend)
    pool = PoolSpec(name="disk", wipe_paths=("/scratch",),
                    template={"workspace_size": "64Mi", "tmp_size": "32Mi", "shm_size": "32Mi"})
    await backend.create(PodRequest(name="filler", pool=pool))
    free_before = shutil.disk_usage(backend.state_dir).free
    status = await run(backend, "filler", "a-fill", "dd", "if=/dev/zero", f"of={target}", "bs=1M", "count=400")
    assert status.error_class == "DiskFull", status
    assert free_before - shutil.disk_usage(backend.state_dir).free < 100 * MiB


async def test_deleting_a_pod_removes_its_cgroup_and_unmounts_its_disk(backend: LocalBackend) -> None:
    need_limits(backend)
    info = await backend.create(PodRequest(name="brief", pool=PoolSpec(name="b", template={"memory": "1Gi"})))
    name = cgroups.cgroup_name("brief", backend.state_dir)
    dirs = {c: base / name for c, base in backend.limiter.cgroups.bases.items()}
    agent_pid = info.details["agent_pid"]
    for directory in dirs.values():
        assert str(agent_pid) in (directory / "cgroup.procs").read_text().split()
    assert (dirs["memory"] / "memory.limit_in_bytes").read_text().strip() == str(1 << 30)
    disk = backend.state_dir / "pods" / "brief" / "disk"
    assert os.path.ismount(disk)
    await backend.delete("brief")
    assert not any(d.exists() for d in dirs.values())
    assert not os.path.ismount(disk) and not disk.exists()


async def test_cpu_cap_throttles_a_busy_job(backend: LocalBackend) -> None:
    need_limits(backend)
    await backend.create(PodRequest(name="slow", pool=PoolSpec(name="slow", cpus=0.2)))
    busy = ("import time\nw = time.monotonic()\nwhile time.monotonic() - w < 1.5:\n    pass\n"
            "print(time.process_time() / (time.monotonic() - w))")
    agent = backend.agent("slow")
    status = await run(backend, "slow", "a-busy", "python3", "-c", busy)
    share = float((await agent.read_log("a-busy")).data.decode().split()[-1])
    assert status.exit_code == 0 and share < 0.4, share
    stat = (backend.limiter.cgroups.bases["cpu"] / cgroups.cgroup_name("slow", backend.state_dir) / "cpu.stat").read_text()
    assert cgroups.counter(stat, "nr_throttled") > 0


def test_each_limit_reaches_the_jobs_error_class_and_the_next_job_on_the_pod_runs(broker_factory) -> None:
    pools = ("pools:\n  - name: small\n    max_count: 1\n    min_count: 0\n"
             "    template: {memory: 192Mi, pids: 48, tmp_size: 16Mi}\n")
    broker = broker_factory(pools=pools)
    c = broker.client()
    used: set[str] = set()
    for command, error in ((["python3", "-c", HOG], "OutOfMemory"),
                           (["python3", "-c", FORK_BOMB], "TooManyProcesses"),
                           (["dd", "if=/dev/zero", "of=/tmp/big", "bs=1M", "count=64"], "DiskFull")):
        job = run_job(c, {"pool": "small", "command": command}, wait=120)
        assert job["state"] == "FAILED" and job["error_class"] == error, job
        nxt = run_job(c, {"pool": "small", "command": ["python3", "-c", "print('ok')"]}, wait=120)
        assert nxt["state"] == "SUCCEEDED", nxt
        used.update(job["bound_pods"] + nxt["bound_pods"])
    assert len(used) == 1, used  # one pod served every job: each reset after a limit proved it clean


async def test_a_pod_that_died_while_the_broker_was_away_leaves_no_cgroup_or_mount(backend: LocalBackend) -> None:
    need_limits(backend)
    info = await backend.create(PodRequest(name="gone", pool=PoolSpec(name="g")))
    dirs = list(cgroups.from_record(backend.limiter.cgroups, backend._records["gone"]).dirs.values())  # type: ignore[union-attr]
    await backend.close()
    os.kill(info.details["agent_pid"], signal.SIGKILL)  # the sandbox's PID 1: the whole pod goes
    heir = LocalBackend(backend.state_dir, RealClock(), sandbox="bwrap")
    for _ in range(200):
        if await heir.list_pods() == [] and not any(d.exists() for d in dirs):
            break
        await asyncio.sleep(0.02)
    assert not any(d.exists() for d in dirs)
    assert not os.path.ismount(backend.state_dir / "pods" / "gone" / "disk")
    await heir.close()


async def test_many_small_processes_past_the_memory_cap_never_kill_the_agent(backend: LocalBackend) -> None:
    need_limits(backend)
    await backend.create(PodRequest(name="swarm", pool=PoolSpec(name="swarm", template={"memory": "96Mi"})))
    # Each child is smaller than the agent: without the agent's shield the OOM killer would pick the agent.
    swarm = ('for i in $(seq 24); do python3 -c "import time; b = bytearray(2 << 20); time.sleep(4)" & done; '
             'wait; exit 1')
    status = await run(backend, "swarm", "a-swarm", "sh", "-c", swarm)
    assert status.error_class == "OutOfMemory", status
    assert (await backend.agent("swarm").health()).pod == "swarm"


STUCK_CREATE = """
import asyncio, sys, time
from pathlib import Path
import broker.backends.localstart as localstart
from broker.backends.local import LocalBackend
from broker.clock import RealClock
from broker.pools import PoolSpec
from broker.ports.backend import PodRequest

localstart.next_incarnation = lambda path: time.sleep(600)  # holds the start once its disk is mounted
backend = LocalBackend(Path(sys.argv[1]), RealClock(), sandbox="bwrap")
asyncio.run(backend.create(PodRequest(name="half", pool=PoolSpec(name="h", template={"memory": "256Mi"}))))
"""


async def test_a_broker_killed_while_a_pod_starts_leaves_the_next_one_its_disk_and_cgroup_to_release(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    child = subprocess.Popen([sys.executable, "-c", STUCK_CREATE, str(state)], start_new_session=True)
    disk, record_file = state / "pods" / "half" / "disk", state / "pods" / "half" / "pod.json"
    try:
        for _ in range(300):  # its disk mounted and its cgroup made (the record names the cgroup's directories)
            if os.path.ismount(disk) and "cgroup_dirs" in (record_file.read_text() if record_file.exists() else ""):
                break
            await asyncio.sleep(0.05)
        assert os.path.ismount(disk), "the pod's disk was never mounted"
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
    heir = LocalBackend(state, RealClock(), sandbox="bwrap")
    try:
        need_limits(heir)
        cgroup = cgroups.from_record(heir.limiter.cgroups, json.loads(record_file.read_text()))
        assert cgroup is not None and any(d.exists() for d in cgroup.dirs.values())
        assert await heir.list_pods() == []
        assert not os.path.ismount(disk) and not (state / "pods" / "half").exists()
        assert not any(d.exists() for d in cgroup.dirs.values())
    finally:
        await heir.close()
        delete_pods(state)
