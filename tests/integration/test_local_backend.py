"""The local backend with real bubblewrap sandboxes (and its unisolated fallback): pods' whole life.

create/list/annotate/delete, restart recovery through a second backend over the same state
directory, exclusive virtual GPUs, the venue start delay and a venue model's draw on the injected clock, and resets that
cannot be proven clean.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from broker.backends.local import LocalBackend
from broker.clock import RealClock, VirtualClock
from broker.errors import AgentError, BackendError
from broker.pools import PoolSpec
from broker.ports.agent import LaunchRequest, ResetRequest
from broker.ports.backend import PodRequest

pytestmark = pytest.mark.integration

CPU = PoolSpec(name="cpu")
GPU = PoolSpec(name="gpu", gpus=1, accelerator="virtual")


async def run(backend: LocalBackend, pod: str, attempt_id: str, *argv: str, session: str = "s") -> tuple[int, str]:
    agent = backend.agent(pod)
    await agent.launch(LaunchRequest(attempt_id=attempt_id, argv=argv, env={}, session=session))
    status = await agent.wait(attempt_id, 30)
    assert not status.running
    return status.exit_code or 0, (await agent.read_log(attempt_id)).data.decode()


def host_processes_running(needle: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if needle.encode() in f.read().replace(b"\0", b" "):
                        found.append(int(name))
            except OSError:
                pass
    return found


async def test_create_list_annotate_delete(backend: LocalBackend) -> None:
    began = time.perf_counter()
    info = await backend.create(PodRequest(name="pod-1", pool=CPU, annotations={"owner": "alice"}))
    print(f"bwrap pod created in {(time.perf_counter() - began) * 1000:.0f} ms")
    assert info.isolated and info.pool == "cpu" and info.gpus == () and info.annotations == {"owner": "alice"}
    health = await backend.agent("pod-1").health()
    assert health.pod == "pod-1" and health.isolated and health.info["pid_namespace"]

    await backend.annotate("pod-1", {"hold_until": "123"})
    [listed] = await backend.list_pods()
    assert listed.name == "pod-1" and listed.annotations == {"owner": "alice", "hold_until": "123"}
    record = backend.pods_dir / "pod-1" / "pod.json"
    assert json.loads(record.read_text())["annotations"]["hold_until"] == "123"
    assert record.stat().st_mode & 0o777 == 0o600

    code, out = await run(backend, "pod-1", "job:0", "sh", "-c", "sleep 31337 & echo started")
    assert code == 0 and out == "started\n"
    assert host_processes_running("sleep 31337")
    await backend.delete("pod-1")
    assert await backend.list_pods() == []
    assert not (backend.pods_dir / "pod-1").exists()
    assert not host_processes_running("sleep 31337")
    await backend.delete("pod-1")  # idempotent
    with pytest.raises(BackendError):
        backend.agent("pod-1")


async def test_a_new_backend_over_the_same_state_finds_running_pods(backend: LocalBackend) -> None:
    await backend.create(PodRequest(name="survivor", pool=GPU, annotations={"owner": "bob"}))
    second = LocalBackend(backend.state_dir, RealClock(), virtual_gpus=2, sandbox="bwrap")
    try:
        [found] = await second.list_pods()
        assert found.name == "survivor" and found.annotations == {"owner": "bob"} and found.gpus == ("virtual-gpu-0",)
        code, out = await run(second, "survivor", "after-restart:0", "echo", "still here")
        assert (code, out) == (0, "still here\n")
        # The survivor's GPU stays taken in the new instance.
        other = await second.create(PodRequest(name="newcomer", pool=GPU))
        assert other.gpus == ("virtual-gpu-1",)
        await second.delete("survivor")
        await second.delete("newcomer")
    finally:
        await second.close()
    assert await backend.list_pods() == []


async def test_virtual_gpus_are_bound_exclusively(backend: LocalBackend) -> None:
    assert [d.key for d in backend.devices()] == ["virtual-gpu-0", "virtual-gpu-1"]
    first, second = await asyncio.gather(backend.create(PodRequest(name="g0", pool=GPU)),
                                         backend.create(PodRequest(name="g1", pool=GPU)))
    assert set(first.gpus) | set(second.gpus) == {"virtual-gpu-0", "virtual-gpu-1"}
    seen = {(await run(backend, name, "cvd:0", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"))[1] for name in ("g0", "g1")}
    assert seen == {"0\n", "1\n"}
    with pytest.raises(BackendError):
        await backend.create(PodRequest(name="g2", pool=GPU))
    assert not (backend.pods_dir / "g2").exists()
    await backend.delete("g0")
    third = await backend.create(PodRequest(name="g2", pool=GPU))
    assert third.gpus == first.gpus


async def test_start_delay_runs_on_the_injected_clock(tmp_path: Path) -> None:
    assert shutil.which("bwrap"), "bubblewrap is not installed"
    clock = VirtualClock()
    backend = LocalBackend(tmp_path / "state", clock, sandbox="bwrap")
    slow = PoolSpec(name="slow", template={"start_delay_s": 22.0})
    try:
        creating = asyncio.ensure_future(backend.create(PodRequest(name="slow-1", pool=slow)))
        while not (backend.pods_dir / "slow-1" / "pod.json").exists():
            await asyncio.sleep(0.01)
        for _ in range(500):  # the real start finishes while the venue delay is still running
            try:
                await backend.agent("slow-1").health()
                break
            except AgentError:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert not creating.done()
        clock.advance(22.0)
        info = await asyncio.wait_for(creating, 5)
        assert info.name == "slow-1"
    finally:
        await backend.delete("slow-1")
        await backend.close()


async def test_venue_delay_adds_the_models_draw_to_a_real_start_and_records_it(tmp_path: Path) -> None:
    assert shutil.which("bwrap"), "bubblewrap is not installed"
    clock = VirtualClock()
    backend = LocalBackend(tmp_path / "state", clock, sandbox="bwrap")
    # a fixed 30 s cold start at a tenth of the venue's time; two pods starting at once take twice as long
    model = {"median_s": 30.0, "p90_s": 30.0, "crowd_n": 2, "crowd_factor": 2.0, "scale": 0.1, "seed": 1}
    venue = PoolSpec(name="venue", template={"venue_delay": model})
    try:
        alone = asyncio.ensure_future(backend.create(PodRequest(name="v-1", pool=venue)))
        while not (backend.pods_dir / "v-1" / "pod.json").exists():
            await asyncio.sleep(0.01)
        crowded = asyncio.ensure_future(backend.create(PodRequest(name="v-2", pool=venue)))
        while not (backend.pods_dir / "v-2" / "pod.json").exists():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # both real sandboxes start; the model's delay keeps both creates waiting
        assert not alone.done() and not crowded.done()
        clock.advance(3.0)
        first = await asyncio.wait_for(alone, 10)
        assert not crowded.done()  # the second started while the first was starting: 6 s
        clock.advance(3.0)
        second = await asyncio.wait_for(crowded, 10)
        assert first.details["venue_delay_s"] == 3.0 and second.details["venue_delay_s"] == 6.0
        assert json.loads((backend.pods_dir / "v-2" / "pod.json").read_text())["venue_delay_s"] == 6.0
        await backend.agent("v-1").health()  # the pod really started
        with pytest.raises(BackendError, match="venue_delay"):
            await backend.create(PodRequest(name="v-3", pool=PoolSpec(name="bad", template={
                "venue_delay": {"median_s": 1.0, "colour": "red"}})))
        assert not (backend.pods_dir / "v-3").exists()
    finally:
        for name in ("v-1", "v-2"):
            await backend.delete(name)
        await backend.close()


async def test_unprovable_reset_is_reported_unclean(backend: LocalBackend, tmp_path: Path) -> None:
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "shard-0").write_text("read-only input")
    pool = PoolSpec(name="ro", template={"binds": [{"src": str(data), "dst": "/data", "ro": True}]},
                    wipe_paths=("/data",))
    await backend.create(PodRequest(name="ro-1", pool=pool))
    code, out = await run(backend, "ro-1", "read:0", "cat", "/data/shard-0")
    assert (code, out) == (0, "read-only input")
    result = await backend.agent("ro-1").reset(ResetRequest(wipe_paths=pool.wipe_paths))
    assert not result.clean and any("/data/shard-0" in p for p in result.problems)
    assert (data / "shard-0").exists()


async def test_reset_inside_the_sandbox_is_clean_and_fast(backend: LocalBackend) -> None:
    await backend.create(PodRequest(name="r-1", pool=CPU))
    agent = backend.agent("r-1")
    await run(backend, "r-1", "dirty:0", "sh", "-c", "echo x > /dev/shm/seg; echo y > /pkg/mod.py; sleep 300 &")
    result = await agent.reset(ResetRequest(wipe_workspace=True))
    assert result.clean and result.killed == 1, result.problems
    samples = sorted([(await agent.reset(ResetRequest())).duration_s for _ in range(20)])
    print(f"clean reset in a sandbox: median {samples[10] * 1000:.2f} ms")
    assert samples[10] < 0.02
    code, out = await run(backend, "r-1", "look:0", "sh", "-c", "ls -A /dev/shm /pkg /workspace /tmp")
    assert code == 0 and "seg" not in out and "mod.py" not in out


async def test_failed_create_leaves_nothing_behind(backend: LocalBackend, tmp_path: Path) -> None:
    broken = PoolSpec(name="broken", gpus=1, template={"binds": [{"src": str(tmp_path / "missing"), "dst": "/x"}]})
    with pytest.raises(BackendError):
        await backend.create(PodRequest(name="broken-1", pool=broken))
    assert not (backend.pods_dir / "broken-1").exists()
    assert (await backend.create(PodRequest(name="ok-1", pool=GPU))).gpus == ("virtual-gpu-0",)
    with pytest.raises(BackendError):
        await backend.create(PodRequest(name="../escape", pool=CPU))
    with pytest.raises(BackendError):
        await backend.create(PodRequest(name="ok-1", pool=CPU))


async def test_delete_removes_read_only_leftovers(backend: LocalBackend) -> None:
    await backend.create(PodRequest(name="ro-dirs", pool=CPU))
    code, _ = await run(backend, "ro-dirs", "lock:0", "sh", "-c",
                        "mkdir -p a/b && touch a/b/f && chmod 000 a/b && chmod 500 a")
    assert code == 0
    await backend.delete("ro-dirs")
    assert not (backend.pods_dir / "ro-dirs").exists()


async def test_unisolated_fallback_works_and_says_so(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state", RealClock(), virtual_gpus=1, sandbox="none")
    try:
        assert not backend.isolated
        info = await backend.create(PodRequest(name="plain", pool=GPU))
        assert not info.isolated and info.gpus == ("virtual-gpu-0",)
        assert not (await backend.agent("plain").health()).isolated
        code, out = await run(backend, "plain", "env:0", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES $HOME; sleep 31338 &")
        assert code == 0 and out == f"0 {backend.pods_dir / 'plain' / 'disk' / 'workspace'}\n"
        assert host_processes_running("sleep 31338")
        assert [p.name for p in await backend.list_pods()] == ["plain"]
        await backend.delete("plain")
        assert not host_processes_running("sleep 31338")
        assert await backend.list_pods() == []
    finally:
        await backend.close()


async def test_a_pod_that_died_is_dropped_and_its_gpu_freed(backend: LocalBackend) -> None:
    info = await backend.create(PodRequest(name="doomed", pool=GPU))
    os.kill(info.details["agent_pid"], signal.SIGKILL)  # the sandbox's PID 1: the whole pod goes
    for _ in range(200):
        if not host_processes_running("--pod doomed "):
            break
        await asyncio.sleep(0.01)
    assert await backend.list_pods() == []
    assert not (backend.pods_dir / "doomed").exists()
    assert (await backend.create(PodRequest(name="heir", pool=GPU))).gpus == info.gpus


async def test_python_in_a_sandbox_skips_the_hosts_editable_install_hooks(backend: LocalBackend) -> None:
    # The hooks point into the source tree, which a sandbox does not mount: importing them only costs time.
    await backend.create(PodRequest(name="pod-py", pool=CPU))
    code = "import sys; print(sorted(m for m in sys.modules if 'editable' in m))"
    assert await run(backend, "pod-py", "job:py", "python3", "-c", code) == (0, "[]\n")
    await backend.delete("pod-py")
