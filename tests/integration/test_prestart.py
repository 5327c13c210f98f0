"""Pre-started kernels in real bubblewrap pods: bound fast, with the job's env, fresh keys, replaced per reset.

A broker with a `kern` pool (`kernels: prestart`, no GPU) and a `gpu` pool (`kernels: prestart`, one
virtual GPU); kernels start through jupyter_client's AsyncKernelManager and the Firepool provisioner, as
a notebook would. The pod's agent is asked directly (its socket and secret from the pod record) which
process it keeps pre-started.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager

from broker.backends.sandboxing import PodDirs
from broker.running.agent_http import HttpAgentClient
from tests.integration.sandboxpids import prestarted_host_pids
from tests.integration.test_jupyter import TIMEOUT, job_of, run, use

pytestmark = pytest.mark.integration

POOLS = """
pools:
  - name: kern
    gpus: 0
    max_count: 2
    kernels: prestart
  - name: gpu
    gpus: 1
    max_count: 1
    kernels: prestart
"""


@pytest.fixture
def kernel_broker(broker_factory, tmp_path, monkeypatch):
    broker = broker_factory(pools=POOLS)
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    use(broker, monkeypatch, "alice")
    for name, pool in (("kern", "kern"), ("gpu", "gpu"), ("gpu2", "gpu"), ("gpu3", "gpu"), ("gpu4", "gpu")):
        r = subprocess.run([sys.executable, "-m", "broker.cli", "kernelspec", "install", "--pool", pool,
                            "--name", f"fp-{name}", "--user", "--tag", f"prestart-{name}"],
                           env=broker.env("alice") | {"JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data")},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    return broker


@asynccontextmanager
async def kernel(name: str) -> AsyncIterator[tuple[AsyncKernelManager, Any, float]]:
    began = time.perf_counter()
    km = AsyncKernelManager(kernel_name=name)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=TIMEOUT)
        yield km, kc, time.perf_counter() - began
    finally:
        kc.stop_channels()
        await km.shutdown_kernel()


@asynccontextmanager
async def pod_agent(broker, pod: str) -> AsyncIterator[HttpAgentClient]:
    dirs = PodDirs(Path(broker.state_dir) / "pods" / pod)
    record = json.loads(dirs.record.read_text())
    fd = os.open(dirs.run, os.O_PATH | os.O_DIRECTORY)  # the run dir is on the pod's capped disk
    client = HttpAgentClient(f"unix:{dirs.socket}", record["secret"], pod=pod,
                             uds_path=f"/proc/self/fd/{fd}/agent.sock")
    try:
        yield client
    finally:
        await client.close()
        os.close(fd)


async def prestarted(broker, pod: str, *, other_than: int | None = None, timeout_s: float = 30) -> dict[str, Any]:
    """The agent's pre-started kernel once it is ready (and is not `other_than`)."""
    deadline = time.monotonic() + timeout_s
    async with pod_agent(broker, pod) as agent:
        while True:
            state = (await agent.health()).info["kernel_prestart"]
            if state["pid"] is not None and state["pid"] != other_than and state.get("ready"):
                return dict(state)
            assert time.monotonic() < deadline, state
            await asyncio.sleep(0.05)


def attempt_timings(job: dict[str, Any]) -> dict[str, float]:
    return dict(job["attempts"][-1].get("timings") or {})


async def held_idle(broker, pod: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        view = next(p for p in broker.client("ops").get("/v1/pods").json()["pods"] if p["name"] == pod)
        if view["state"] == "idle":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"pod {pod} did not go back idle")


SEE = ("import json, os, tempfile; print(json.dumps({'pid': os.getpid(), 'cwd': os.getcwd(), "
       "'env': dict(os.environ), 'tmp': tempfile.gettempdir(), 'umask': os.umask(0o022), "
       "'names': sorted(n for n in globals() if not n.startswith('_'))}))")


async def test_a_kernel_binds_the_pods_prestarted_process_with_the_jobs_env_cwd_and_fresh_keys(kernel_broker) -> None:
    broker = kernel_broker
    async with kernel("fp-kern") as (km, kc, _):  # the first kernel makes the pod
        pod = job_of(broker, km)["bound_pods"][0]
        await run(kc, "secret_of_the_first = 41")
    await held_idle(broker, pod)
    seen: list[dict[str, Any]] = []
    keys: list[tuple[bytes, str]] = []
    for _ in range(2):
        ready = await prestarted(broker, pod, other_than=seen[-1]["pid"] if seen else None)
        async with kernel("fp-kern") as (km, kc, took):
            job = job_of(broker, km)
            assert job["bound_pods"] == [pod] and job["acquisition"][0]["path"] == "warm"
            timings = attempt_timings(job)
            assert timings["kernel_prestarted"] == 1.0 and timings["kernel_prestart_ready"] == 1.0, timings
            reply, out, _ = await run(kc, SEE)
            assert reply["status"] == "ok", reply
            state = json.loads(out)
            info = km.get_connection_info()
            keys.append((info["key"], str(info.get("curve_publickey"))))
        await held_idle(broker, pod)
        assert state["pid"] == ready["pid"]  # the bound process is the pre-started one
        env = state["env"]
        assert state["cwd"] == "/workspace" and env["HOME"] == "/workspace" and state["tmp"] == "/tmp"
        assert env["FIREPOOL_JOB_ID"] == job["id"] and env["FIREPOOL_CALLER"] == "alice"
        assert env["FIREPOOL_ATTEMPT_ID"] == job["attempts"][-1]["id"] and env["CUDA_VISIBLE_DEVICES"] == ""
        assert state["umask"] == 0o022 and "secret_of_the_first" not in state["names"]
        seen.append(state)
    assert seen[0]["pid"] != seen[1]["pid"]
    assert keys[0][0] != keys[1][0] and keys[0][1] != keys[1][1]  # HMAC key and Curve key pair made per kernel


async def test_a_gpu_kernel_gets_its_gpu_only_at_bind_and_the_idle_process_sees_none(kernel_broker) -> None:
    broker = kernel_broker
    async with kernel("fp-gpu") as (km, kc, _):
        pod = job_of(broker, km)["bound_pods"][0]
    await held_idle(broker, pod)
    ready = await prestarted(broker, pod)
    root = Path(broker.state_dir) / "pods" / pod
    assert ready["rss_kib"] > 0 and ready["pss_kib"] > 0
    async with kernel("fp-gpu") as (km, kc, _):
        assert attempt_timings(job_of(broker, km))["kernel_prestarted"] == 1.0
        _, out, _ = await run(kc, "import os; print(os.getpid(), os.environ['CUDA_VISIBLE_DEVICES'], "
                                  "os.environ.get('CUDA_DEVICE_MEMORY_SHARED_CACHE', ''))")
    pid, cuda, cache = out.split()
    assert int(pid) == ready["pid"] and cuda in ("0", "1") and cache.startswith("/")
    assert root.exists()


async def test_a_new_sessions_kernel_on_the_pod_binds_the_kept_process_and_sees_nothing_of_the_old(
        kernel_broker) -> None:
    broker = kernel_broker  # the gpu pool holds one pod: each next session's kernel takes it (recycled)
    plant = ("old_secret = 41; open('/workspace/old.txt', 'w').write('old'); "
             "open('/tmp/old-tmp.txt', 'w').write('old')")
    look = ("import os, json; print(json.dumps([os.getpid(), sorted(os.listdir('/workspace')), "
            "sorted(os.listdir('/tmp')), 'old_secret' in globals()]))")
    async with kernel("fp-gpu") as (km, kc, _):
        pod = job_of(broker, km)["bound_pods"][0]
        reply, _, _ = await run(kc, plant)
        assert reply["status"] == "ok", reply
    refusals = []
    # The agent keeps the process only when it can prove it took nothing in; a busy machine can make it
    # refuse (and fall back to a cold kernel, also checked here), so the crossing gets three sessions.
    for name in ("fp-gpu2", "fp-gpu3", "fp-gpu4"):
        await held_idle(broker, pod)
        before = await prestarted(broker, pod)
        async with kernel(name) as (km, kc, _):
            job = job_of(broker, km)
            assert job["bound_pods"] == [pod] and job["lease_tag"] == f"prestart-{name[3:]}", job
            timings = attempt_timings(job)
            reply, out, _ = await run(kc, look)
            assert reply["status"] == "ok", reply
            reply, _, _ = await run(kc, plant)  # for the next session to look for
        pid, workspace, tmp, has_old = json.loads(out)
        assert "old.txt" not in workspace and "old-tmp.txt" not in tmp and not has_old
        if timings.get("kernel_prestart_crossed") == 1.0:
            assert timings["kernel_prestarted"] == 1.0, timings
            assert pid == before["pid"]  # started after the old session's last job, kept across the boundary
            return
        log = (Path(broker.state_dir) / "pods" / pod / "agent.log").read_text(errors="replace")
        refusals.append([line for line in log.splitlines() if "session boundary" in line][-1:])
    raise AssertionError(f"no new session bound the kept process: {refusals}")


async def test_a_reset_kills_the_prestarted_process_and_starts_a_new_one(kernel_broker) -> None:
    broker = kernel_broker
    async with kernel("fp-kern") as (km, kc, _):
        pod = job_of(broker, km)["bound_pods"][0]
    await held_idle(broker, pod)
    first = await prestarted(broker, pod)
    # A plain job on the pod: the unbound process dies at its launch, and the reset after it starts a new one.
    c = broker.client()
    listing = ("import os\nfor p in filter(str.isdigit, os.listdir('/proc')):\n"
               "    print(p, open(f'/proc/{p}/cmdline', 'rb').read())")
    job = c.post("/v1/jobs", json={"command": ["python3", "-c", listing], "pool": "kern",
                                   "lease_tag": "prestart-kern"}).json()
    job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 30}).json()
    assert job["state"] == "SUCCEEDED" and job["bound_pods"] == [pod], job
    logs = c.get(f"/v1/jobs/{job['id']}/logs", params={"stream": "stdout"}).text
    assert "firepool_agent" in logs and "--prestarted" not in logs  # no unbound kernel beside another job
    second = await prestarted(broker, pod, other_than=first["pid"])
    assert second["spawned"] > first["spawned"]


async def test_a_killed_prestarted_process_falls_back_to_a_normal_launch(kernel_broker) -> None:
    broker = kernel_broker
    async with kernel("fp-kern") as (km, kc, _):
        pod = job_of(broker, km)["bound_pods"][0]
    await held_idle(broker, pod)
    ready = await prestarted(broker, pod)
    (host_pid,) = prestarted_host_pids(ready["pid"], pod)
    os.kill(host_pid, signal.SIGKILL)
    async with kernel("fp-kern") as (km, kc, _):
        assert attempt_timings(job_of(broker, km))["kernel_prestarted"] == 0.0
        reply, out, _ = await run(kc, "import os; print(os.getpid())")
    assert reply["status"] == "ok" and int(out) != ready["pid"]
