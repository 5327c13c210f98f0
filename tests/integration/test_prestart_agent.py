"""The pre-started kernel at the agent: refusals that fall back to a normal launch, no GPU library, the pod's end.

Agents here run unisolated (a subreaper, as in test_agent.py) with `--kernels prestart`, so each case is a
second or so; the sandboxed path runs in test_prestart.py. The last tests use the bubblewrap backend.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.backends.local import LocalBackend, agent_kernels
from broker.pools import PoolSpec
from broker.ports.agent import LaunchRequest, ResetRequest
from broker.ports.backend import PodRequest
from broker.running.agent_http import HttpAgentClient
from firepool_agent.prestart import held_paths
from tests.integration.sandboxpids import prestarted_host_pids
from tests.integration.test_agent import AGENT_ROOT, RunningAgent, alive, wait_healthy

pytestmark = pytest.mark.integration

PY = sys.executable
KERNEL = ("python3", "-m", "firepool_agent.kernel", "--ip", "127.0.0.1")
GPU_MODULES = ("torch", "cupy", "pynvml", "nvidia", "numba", "jax", "tensorflow", "pycuda", "cuda")


@pytest.fixture
async def agent(request: pytest.FixtureRequest) -> AsyncIterator[RunningAgent]:
    mode = getattr(request, "param", "prestart")
    root = Path(tempfile.mkdtemp(prefix="fp-pk-"))  # short: a Unix socket path holds ~107 bytes
    secret = secrets.token_urlsafe(32)
    read_end, write_end = os.pipe()
    os.write(write_end, secret.encode())
    os.close(write_end)
    path = f"{os.path.dirname(PY)}:/usr/bin:/bin"  # the jobs' python3 is this one, which has ipykernel
    argv = [PY, "-S", "-m", "firepool_agent", "--pod", "pk", "--listen", f"unix:{root}/run/agent.sock",
            "--secret-fd", str(read_end), "--workspace", str(root / "ws"), "--package-dir", str(root / "pkg"),
            "--run-dir", str(root / "run"), "--tmp-dir", str(root / "tmp"), "--path", path, "--kernels", mode]
    with open(root / "agent.log", "wb") as log:
        process = subprocess.Popen(argv, pass_fds=(read_end,), env={"PYTHONPATH": str(AGENT_ROOT), "PATH": path},
                                   stdout=log, stderr=log, start_new_session=True)
    os.close(read_end)
    client = HttpAgentClient(f"unix:{root}/run/agent.sock", secret, pod="pk")
    try:
        await wait_healthy(client, process)
        yield RunningAgent(client, process, secret, f"{root}/run/agent.sock", root)
    finally:
        await client.close()
        process.terminate()
        process.wait(10)
        subprocess.run(["rm", "-rf", str(root)], check=False)


async def ready(client: HttpAgentClient, timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        state = (await client.health()).info["kernel_prestart"]
        if state.get("ready"):
            return state
        assert time.monotonic() < deadline, state
        await asyncio.sleep(0.02)


async def kernel_line(client: HttpAgentClient, attempt_id: str) -> dict:
    """The launcher's connection info as the agent serves it; its stdout and stderr never carry the key."""
    report = await client.kernel(attempt_id, wait_s=30.0)
    assert report.running and report.connection is not None, report
    info = dict(report.connection)
    for stream in ("stdout", "stderr", "combined"):
        logged = (await client.read_log(attempt_id, stream, 0)).data
        assert info["key"].encode() not in logged and b"FIREPOOL-KERNEL" not in logged, (stream, logged)
    return info


async def launch_kernel(agent: RunningAgent, attempt_id: str, **env: str) -> tuple[dict, dict]:
    status = await agent.client.launch(LaunchRequest(attempt_id=attempt_id, argv=KERNEL, env=env, session="s1",
                                                     extra={"kernel": True}))
    info = await kernel_line(agent.client, attempt_id)
    await agent.client.signal(attempt_id, "KILL")
    await agent.client.wait(attempt_id, 10)
    return dict(status.timings), info


async def test_a_bound_kernel_is_the_prestarted_process_and_a_reset_replaces_it(agent: RunningAgent) -> None:
    first = await ready(agent.client)
    timings, info = await launch_kernel(agent, "k1")
    assert timings["kernel_prestarted"] == 1.0 and info["pid"] == first["pid"] and info["cwd"] == str(agent.workspace)
    assert (await agent.client.health()).info["kernel_prestart"]["pid"] is None  # nothing unbound beside a kernel
    assert (await agent.client.reset(ResetRequest())).clean
    second = await ready(agent.client)
    assert second["pid"] != first["pid"] and not alive(first["pid"]) and second["spawned"] == first["spawned"] + 1
    timings, again = await launch_kernel(agent, "k2")
    assert timings["kernel_prestarted"] == 1.0 and again["pid"] == second["pid"] and again["key"] != info["key"]


async def test_an_interpreter_setting_in_the_jobs_env_means_a_normal_launch(agent: RunningAgent) -> None:
    prestarted = await ready(agent.client)
    timings, info = await launch_kernel(agent, "k1", PYTHONHASHSEED="7")
    assert timings["kernel_prestarted"] == 0.0 and info["pid"] != prestarted["pid"]
    assert "environment differs in PYTHONHASHSEED" in (agent.root / "agent.log").read_text()


async def test_a_variable_the_imports_read_means_a_normal_launch(agent: RunningAgent) -> None:
    await ready(agent.client)
    timings, _ = await launch_kernel(agent, "k1", PYDEVD_USE_CYTHON="NO")  # debugpy reads it at import
    assert timings["kernel_prestarted"] == 0.0
    assert "PYDEVD_USE_CYTHON" in (agent.root / "agent.log").read_text()


async def test_a_workspace_module_that_shadows_an_imported_one_means_a_normal_launch(agent: RunningAgent) -> None:
    import shlex

    await ready(agent.client)
    # A working copy of shlex in the workspace: a new interpreter there imports it, not the installed one.
    (agent.workspace / "shlex.py").write_text(f"exec(compile(open({shlex.__file__!r}).read(), 'shlex', 'exec'))\n")
    timings, _ = await launch_kernel(agent, "k1")
    assert timings["kernel_prestarted"] == 0.0
    assert "the job's path has its own shlex" in (agent.root / "agent.log").read_text()


async def test_another_command_kills_the_unbound_process_before_it_runs(agent: RunningAgent) -> None:
    prestarted = await ready(agent.client)
    await agent.client.launch(LaunchRequest(attempt_id="ls", argv=("true",), env={}, session="s1"))
    await agent.client.wait("ls", 10)
    deadline = time.monotonic() + 5
    while alive(prestarted["pid"]):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert (await agent.client.health()).info["kernel_prestart"]["pid"] is None


def test_the_prestarted_process_imports_no_gpu_library() -> None:
    code = ("import sys, json\nfrom firepool_agent import kernel_bind\nkernel_bind.Warmed()\n"
            "maps = open('/proc/self/maps').read()\n"
            f"print(json.dumps({{'gpu': sorted(m for m in sys.modules if m.split('.')[0] in {GPU_MODULES!r}), "
            "'libs': [l for l in ('libcuda', 'libnvidia', 'libcudart') if l in maps], "
            "'n': len(sys.modules)}))")
    result = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(AGENT_ROOT), "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["gpu"] == [] and found["libs"] == [] and found["n"] > 300  # torch is installed here, not imported


def test_auto_is_learned_per_pool_and_explicit_modes_pass_through() -> None:
    assert agent_kernels(PoolSpec(name="a")) == "learned"
    assert agent_kernels(PoolSpec(name="b", standbys_per_active=1)) == "learned"  # standby pods are never told
    assert agent_kernels(PoolSpec(name="d", kernels="cold")) == "cold"
    assert agent_kernels(PoolSpec(name="c", standbys_per_active=1, kernels="prestart")) == "prestart"


async def test_deleting_a_pod_leaves_no_prestarted_process(backend: LocalBackend) -> None:
    await backend.create(PodRequest(name="pk-1", pool=PoolSpec(name="kern", kernels="prestart")))
    state = await ready(backend.agent("pk-1"))
    host = prestarted_host_pids(state["pid"], "pk-1")
    assert len(host) == 1
    await backend.delete("pk-1")
    assert not alive(host[0])


async def test_an_unbound_process_dies_with_its_agent(agent: RunningAgent) -> None:
    prestarted = await ready(agent.client)
    agent.process.kill()  # no handler runs: the parent-death signal alone must take it
    agent.process.wait(10)
    deadline = time.monotonic() + 5
    while alive(prestarted["pid"]):
        assert time.monotonic() < deadline, "the pre-started kernel outlived its agent"
        await asyncio.sleep(0.01)


def test_held_paths_finds_an_open_file_under_the_session_dirs_but_not_the_agents_own(tmp_path) -> None:
    session = tmp_path / "workspace"
    session.mkdir()
    (session / "seen.txt").write_text("x")
    # This process stands in for the agent: its own open files never count.
    with open(session / "ours.txt", "w"), subprocess.Popen(
            [sys.executable, "-c", "import sys; f = open(sys.argv[1]); print(flush=True); sys.stdin.read()",
             str(session / "seen.txt")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp_path) as child:
        try:
            assert child.stdout is not None
            child.stdout.readline()
            assert held_paths(child.pid, [str(session)]) == [str(session / "seen.txt")]
            assert held_paths(child.pid, [str(tmp_path / "elsewhere")]) == []
        finally:
            child.kill()


@pytest.mark.parametrize("agent", ["learned"], indirect=True)
async def test_a_learned_pod_keeps_one_while_told_and_only_while_clean(agent: RunningAgent) -> None:
    state = (await agent.client.health()).info["kernel_prestart"]
    assert state["pid"] is None and state["spawned"] == 0  # a new pod of a pool that has not served kernels
    await agent.client.keep_kernels(True)  # a never-used pod: clean since boot, it starts one at once
    first = await ready(agent.client)
    await agent.client.keep_kernels(False)
    assert (await agent.client.health()).info["kernel_prestart"]["pid"] is None
    deadline = time.monotonic() + 5  # killed at once; the exit and the reap follow in a moment
    while not gone(first["pid"]):
        assert time.monotonic() < deadline, "the unbound process outlived `keep: false`"
        await asyncio.sleep(0.01)
    status = await agent.client.launch(LaunchRequest(attempt_id="plain", argv=["sleep", "30"], env={}, session="s1"))
    await agent.client.keep_kernels(True)  # told while a job runs: nothing starts beside it, nor after it ends
    await agent.client.signal(status.attempt_id, "KILL")
    await agent.client.wait(status.attempt_id, 10)
    await agent.client.keep_kernels(True)
    assert (await agent.client.health()).info["kernel_prestart"]["pid"] is None
    assert (await agent.client.reset(ResetRequest())).clean  # the verified reset makes the pod clean again
    second = await ready(agent.client)
    assert second["spawned"] == 2 and second["told"]


async def test_the_kernels_endpoint_takes_only_a_boolean(agent: RunningAgent) -> None:
    for body in ({}, {"keep": "yes"}, {"keep": True, "more": 1}):
        response = await agent.client._client.post("/v1/kernels", json=body)
        assert response.status_code == 400, body


def gone(pid: int) -> bool:
    """Dead or a zombie (a read racing the reaper counts as dead)."""
    try:
        return not alive(pid)
    except ProcessLookupError:
        return True
