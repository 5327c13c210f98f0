"""Fencing at the pod: a real agent process refuses a deposed broker's commands, never runs two attempts of
one job at once, and ends its sandbox when no broker has spoken to it for its orphan bound."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broker.backends.local import LocalBackend
from broker.clock import RealClock
from broker.errors import AgentError
from broker.fencing import Term
from broker.pools import PoolSpec
from broker.ports.agent import LaunchRequest, ResetRequest
from broker.ports.backend import PodRequest
from broker.running.agent_http import HttpAgentClient

pytestmark = pytest.mark.integration

AGENT_ROOT = Path(__file__).resolve().parents[2] / "sandbox_image"
PY = sys.executable


def start_agent(root: Path, secret: str, *extra: str) -> subprocess.Popen[bytes]:
    read_end, write_end = os.pipe()
    os.write(write_end, secret.encode())
    os.close(write_end)
    argv = [PY, "-S", "-m", "firepool_agent", "--pod", "term-pod", "--listen", f"unix:{root}/run/agent.sock",
            "--secret-fd", str(read_end), "--workspace", str(root / "ws"), "--package-dir", str(root / "pkg"),
            "--run-dir", str(root / "run"), "--tmp-dir", str(root / "tmp"), *extra]
    env = {"PYTHONPATH": str(AGENT_ROOT), "PATH": os.environ["PATH"]}
    with open(root / "agent.log", "ab") as log:
        try:
            return subprocess.Popen(argv, pass_fds=(read_end,), env=env, stdout=log, stderr=log,
                                    start_new_session=True)
        finally:
            os.close(read_end)


async def healthy(client: HttpAgentClient, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            await client.health()
            return
        except AgentError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.01)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fp-term-"))  # short: a Unix socket path holds ~107 bytes
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


class Broker:
    """One broker's view of the agent: its term, and whether it learned it was deposed."""

    def __init__(self, root: Path, secret: str, term: int) -> None:
        self.deposed: list[str] = []
        self.term = Term(term, on_deposed=self.deposed.append)
        self.client = HttpAgentClient(f"unix:{root}/run/agent.sock", secret, pod="term-pod", term=self.term)


@pytest.fixture
async def agent(root: Path) -> AsyncIterator[tuple[Path, str, subprocess.Popen[bytes]]]:
    secret = secrets.token_urlsafe(32)
    process = start_agent(root, secret, "--state-dir", str(root / "state"))
    try:
        yield root, secret, process
    finally:
        process.terminate()
        process.wait(10)


def sleeper(attempt_id: str, seconds: float = 60) -> LaunchRequest:
    return LaunchRequest(attempt_id=attempt_id, argv=(PY, "-S", "-c", f"import time; time.sleep({seconds})"),
                         env={}, session="s1")


async def test_a_deposed_brokers_commands_are_refused_and_it_ends(
        agent: tuple[Path, str, subprocess.Popen[bytes]]) -> None:
    root, secret, process = agent
    old, new = Broker(root, secret, 4), Broker(root, secret, 5)
    try:
        await healthy(old.client, process)
        running = await old.client.launch(sleeper("job-1:0"))  # term 4 leads: its launch runs
        await new.client.health()  # the new leader's first probe teaches the agent term 5
        package = root / "package.zip"
        with zipfile.ZipFile(package, "w") as archive:
            archive.writestr("main.py", "print('never')\n")
        digest = hashlib.sha256(package.read_bytes()).hexdigest()
        for command in (old.client.launch(sleeper("job-2:0")), old.client.cancel("job-1:0"),
                        old.client.signal("job-1:0", "KILL"), old.client.reset(ResetRequest()),
                        old.client.keep_kernels(True), old.client.upgrade("/v1/exec", {"argv": "true"}, "firepool-exec"),
                        old.client.put_package(digest, str(package), 1 << 20, 10.0)):
            with pytest.raises(AgentError) as refused:
                await command
            assert refused.value.details["agent_class"] == "StaleTerm"
        assert len(old.deposed) == 7 and not new.deposed
        assert running.pid is not None and alive(running.pid)  # nothing of the old term's commands landed
        assert await new.client.status("job-2:0") is None
        status = await old.client.status("job-1:0")  # reads stay open: the old broker may still look
        assert status is not None and status.running
        health = await new.client.health()
        assert health.info["term"] == 5 and health.info["stale_term_refused"] == 7
        assert (root / "agent.log").read_text().count("stale term refused") == 7
        await new.client.cancel("job-1:0", grace_s=0.5)  # the leader's own commands are obeyed
        assert not (await new.client.wait("job-1:0", 10)).running
    finally:
        await old.client.close()
        await new.client.close()


async def test_an_agent_restart_keeps_the_newest_term(root: Path) -> None:
    secret = secrets.token_urlsafe(32)
    process = start_agent(root, secret, "--state-dir", str(root / "state"))
    old, new = Broker(root, secret, 1), Broker(root, secret, 2)
    try:
        await healthy(new.client, process)
        process.terminate()
        process.wait(10)
        process = start_agent(root, secret, "--state-dir", str(root / "state"))
        await healthy(old.client, process)
        with pytest.raises(AgentError):
            await old.client.launch(sleeper("job-1:0", 0))
        assert old.deposed
    finally:
        await old.client.close()
        await new.client.close()
        process.terminate()
        process.wait(10)


async def test_a_relaunch_of_a_running_job_waits_for_its_predecessor(
        agent: tuple[Path, str, subprocess.Popen[bytes]]) -> None:
    root, secret, process = agent
    broker = Broker(root, secret, 1)
    try:
        await healthy(broker.client, process)
        await broker.client.launch(sleeper("job-1:0"))
        with pytest.raises(AgentError) as busy:
            await broker.client.launch(sleeper("job-1:1"))
        details = busy.value.details
        assert details["status"] == 409 and details["agent_class"] == "Conflict" and details["agent_retryable"]
        assert "same job is still running" in details["agent_message"]
        assert await broker.client.status("job-1:1") is None  # refused before anything of it was recorded
        await broker.client.cancel("job-1:0", grace_s=0.5)
        assert not (await broker.client.wait("job-1:0", 10)).running
        assert (await broker.client.launch(sleeper("job-1:1", 0))).attempt_id == "job-1:1"
        assert not broker.deposed
    finally:
        await broker.client.close()


async def test_an_agent_no_broker_speaks_to_kills_its_attempts_and_exits(root: Path) -> None:
    secret = secrets.token_urlsafe(32)
    process = start_agent(root, secret, "--orphan-after-s", "1.5")
    broker = Broker(root, secret, 1)
    try:
        await healthy(broker.client, process)
        started = await broker.client.launch(sleeper("job-1:0"))
        assert started.pid is not None
        began = time.monotonic()
        for _ in range(4):  # a broker that keeps talking keeps the pod
            await asyncio.sleep(0.5)
            await broker.client.health()
        assert process.poll() is None and alive(started.pid)
        code = await asyncio.to_thread(process.wait, 15)  # then silence: the agent ends on its own
        assert code == 3 and not alive(started.pid)
        assert time.monotonic() - began >= 1.5 + 2.0 - 0.1
        assert "orphaned: no broker request" in (root / "agent.log").read_text()
    finally:
        await broker.client.close()
        if process.poll() is None:
            process.kill()
            process.wait(10)


async def test_an_orphaned_pod_ends_its_whole_sandbox(tmp_path: Path) -> None:
    """The agent is the sandbox's PID 1: its exit takes bwrap and every job process with it."""
    assert shutil.which("bwrap"), "bubblewrap is not installed"
    backend = LocalBackend(tmp_path / "state", RealClock(), sandbox="bwrap", orphan_after_s=2.0)
    try:
        info = await backend.create(PodRequest(name="lonely", pool=PoolSpec(name="cpu")))
        started = await backend.agent("lonely").launch(sleeper("job-1:0"))
        assert started.running
        record = json.loads((backend.pods_dir / "lonely" / "pod.json").read_text())
        sandbox = [record["launcher_pid"], record["pid"]]
        assert all(alive(pid) for pid in sandbox), info
        deadline = time.monotonic() + 20
        while any(alive(pid) for pid in sandbox) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not any(alive(pid) for pid in sandbox)
        assert "orphaned: no broker request" in (backend.pods_dir / "lonely" / "agent.log").read_text()
        assert await backend.list_pods() == []  # the backend drops the dead pod's record
    finally:
        for pod in await backend.list_pods():
            await backend.delete(pod.name)
        await backend.close()
