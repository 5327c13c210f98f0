"""`open_exec` through a real control plane (local backend, bubblewrap pods): processes beside a session's
running job, in its sandbox, gone when the session's pod is reset or the session ends."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.backends.local import LocalBackend
from broker.clock import RealClock
from broker.control import ControlPlane
from broker.errors import AgentError, NotFound
from broker.jobs import Job, JobSpec, JobState
from broker.pools import default_catalog
from broker.running.execstream import ExecProcess, open_exec, run_collected
from broker.running.jobenv import session_id
from broker.running.logstore import FileLogStore
from broker.store.sql import SqlJobStore
from tests.integration.conftest import delete_pods

pytestmark = pytest.mark.integration
LIST_PROCESSES = ["sh", "-c", "for p in /proc/[0-9]*; do cat $p/cmdline; echo; done 2>/dev/null"]


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    assert shutil.which("bwrap"), "bubblewrap is not installed"
    clock = RealClock()
    store = SqlJobStore.open(f"sqlite:///{tmp_path / 'jobs.db'}")
    backend = LocalBackend(tmp_path / "state", clock, virtual_gpus=0, sandbox="bwrap")
    plane = ControlPlane(clock=clock, store=store, backend=backend, logs=FileLogStore(tmp_path / "logs"),
                         catalog=default_catalog(0))
    await plane.start()
    try:
        yield plane
    finally:
        await plane.stop(delete_idle_pods=True)
        delete_pods(tmp_path / "state")
        store.close()


async def _holding_job(cp: ControlPlane, tag: str) -> Job:
    job, _ = await cp.submit("alice", JobSpec(pool="cpu", command=("sleep", "60"), lease_tag=tag))
    async with asyncio.timeout(60):
        while (job := await cp.get("alice", job.id)).state is not JobState.RUNNING:
            assert job.state in (JobState.PENDING, JobState.QUEUED), job
            await asyncio.sleep(0.05)
    return job


async def _ended(proc: ExecProcess) -> None:
    """The process's stream ends within 10 s: with a signal's exit, or broken with its pod."""
    async with asyncio.timeout(10):
        try:
            async for kind, data in proc.events():
                if kind == "exit":
                    assert data["signal"] is not None, data
        except AgentError:
            pass


async def test_a_process_runs_beside_the_sessions_job_in_its_sandbox(cp: ControlPlane) -> None:
    await _holding_job(cp, "t")
    pod = cp.streams.pod("alice", "t")
    session = session_id("alice", "default", "t", cp.tracker.pool(pod.pool))
    code, out, err = await run_collected(cp.streams, "alice", "t", ["sh", "-c", "echo $MINE; echo e >&2; exit 5"],
                                         env={"MINE": "mine"}, session=session)
    assert (code, out, err) == (5, b"mine\n", b"e\n")
    _, listing, _ = await run_collected(cp.streams, "alice", "t", LIST_PROCESSES)
    assert b"sleep\x0060" in listing  # the job's process: the same sandbox
    with pytest.raises(NotFound):
        await open_exec(cp.streams, "bob", "t", ["true"])


async def test_ending_the_session_kills_its_exec_processes(cp: ControlPlane) -> None:
    await _holding_job(cp, "t")
    proc = await open_exec(cp.streams, "alice", "t", ["sleep", "61"])
    await cp.end_session("alice", "t")
    await _ended(proc)


async def test_a_reset_after_the_holding_job_kills_its_exec_processes(cp: ControlPlane) -> None:
    job = await _holding_job(cp, "t")
    proc = await open_exec(cp.streams, "alice", "t", ["bash", "-c", "sleep 61 & wait"])
    await cp.cancel("alice", job.id)
    await _ended(proc)
    await _holding_job(cp, "t")  # the session's next job, on the reset sandbox
    _, listing, _ = await run_collected(cp.streams, "alice", "t", LIST_PROCESSES)
    assert b"sleep\x0061" not in listing
