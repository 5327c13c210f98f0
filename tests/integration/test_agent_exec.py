"""Processes beside the job (`GET /v1/exec`) on a real agent process, driven through the broker's client
(`open_exec` over a SessionStreams whose one pod is the agent's): pipes, stdin, signals, hang-up, reset."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

import pytest

from broker.errors import Conflict, InvalidRequest, NotFound
from broker.pods import Pod, PodState
from broker.ports.agent import AgentClient, ResetRequest
from broker.running.execstream import ExecProcess, open_exec, run_collected
from broker.running.sessionstreams import SessionStreams
from tests.integration.test_agent import PY, RunningAgent, agent, alive, launch

pytestmark = pytest.mark.integration
__all__ = ["agent"]
CALLER, TAG = "alice", "t1"


class _OnePod:
    def __init__(self, running: RunningAgent) -> None:
        self.pod = Pod("test-pod", "p", state=PodState.IDLE)
        self.pod.key = (CALLER, "default", TAG)
        self.client = running.client

    def snapshot(self) -> Iterable[Pod]:
        return [self.pod]

    def agent(self, name: str) -> AgentClient:
        return self.client


def _streams(running: RunningAgent) -> SessionStreams:
    one = _OnePod(running)
    return SessionStreams(one, one)


async def _holding(running: RunningAgent) -> SessionStreams:
    """The pod held by a running job of session s1 (the kernel job's role), and streams to it."""
    await running.client.launch(launch("hold", "sleep", "60", session="s1"))
    return _streams(running)


async def _collect(proc: ExecProcess) -> tuple[bytes, bytes, dict[str, object]]:
    out, err = b"", b""
    async with asyncio.timeout(30):
        async for kind, data in proc.events():
            if kind == "stdout":
                out += data
            elif kind == "stderr":
                err += data
            else:
                return out, err, data
    raise AssertionError("no exit")


async def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_two_processes_run_at_once_beside_the_job_with_separate_stdout_and_stderr(agent: RunningAgent) -> None:
    streams = await _holding(agent)
    script = 'echo "out $1 $MINE $PWD"; echo "err $1" >&2; sleep 0.3; exit $2'
    began = time.perf_counter()
    first = await open_exec(streams, CALLER, TAG, ["sh", "-c", script, "sh", "a", "3"], env={"MINE": "m"})
    (agent.workspace / "sub").mkdir()
    second = await open_exec(streams, CALLER, TAG, ["sh", "-c", script, "sh", "b", "4"], cwd="sub")
    assert first.pid != second.pid
    (out1, err1, exit1), (out2, err2, exit2) = await asyncio.gather(_collect(first), _collect(second))
    assert time.perf_counter() - began < 5  # side by side: not one after the other
    assert out1 == f"out a m {agent.workspace}\n".encode() and err1 == b"err a\n"
    assert out2 == f"out b  {agent.workspace}/sub\n".encode() and err2 == b"err b\n"
    assert exit1 == {"exit_code": 3, "signal": None} and exit2 == {"exit_code": 4, "signal": None}


async def test_stdin_reaches_the_process_and_close_stdin_ends_its_input(agent: RunningAgent) -> None:
    streams = await _holding(agent)
    proc = await open_exec(streams, CALLER, TAG, ["cat"], stdin=True)
    await proc.write_stdin(b"hello ")
    await proc.write_stdin(b"world")
    await proc.close_stdin()
    assert await _collect(proc) == (b"hello world", b"", {"exit_code": 0, "signal": None})
    assert await run_collected(streams, CALLER, TAG, ["cat"]) == (0, b"", b"")  # no stdin: /dev/null
    big = bytes(range(256)) * 20000  # 5 MB: more than one frame and than any pipe buffer
    code, out, _ = await run_collected(streams, CALLER, TAG, ["cat"], stdin_data=big, max_bytes=len(big))
    assert code == 0 and out == big


async def test_sigkill_ends_the_whole_group_within_a_second_with_137(agent: RunningAgent) -> None:
    streams = await _holding(agent)
    proc = await open_exec(streams, CALLER, TAG, ["bash", "-c", "sleep 60 & echo $!; wait"])
    events = proc.events()
    kind, child = await anext(events)
    assert kind == "stdout"
    began = time.monotonic()
    await proc.signal("SIGKILL")
    async with asyncio.timeout(1):
        async for kind, data in events:
            if kind == "exit":
                assert data == {"exit_code": 137, "signal": 9}
    assert time.monotonic() - began < 1
    assert await _gone(int(child), 1) and not alive(proc.pid)
    with pytest.raises(InvalidRequest):
        await proc.signal("NOSUCH")


async def test_a_flood_nobody_reads_stalls_the_process_and_a_signal_still_ends_it(agent: RunningAgent) -> None:
    streams = await _holding(agent)
    proc = await open_exec(streams, CALLER, TAG, ["yes"])
    await asyncio.sleep(0.5)  # the agent's output buffer and the pipe fill; nobody reads
    await proc.signal("TERM")
    out, _, exit_ = await _collect(proc)
    assert exit_ == {"exit_code": 143, "signal": 15}
    assert 0 < len(out) < 16 << 20  # bounded by the buffers, not by the half second


async def test_all_output_arrives_before_the_exit_however_slowly_it_is_read(agent: RunningAgent) -> None:
    streams = await _holding(agent)
    proc = await open_exec(streams, CALLER, TAG, ["sh", "-c", "head -c 5000000 /dev/zero; echo done >&2"])
    await asyncio.sleep(0.5)  # the process has exited with most of its output unread
    out, err, exit_ = await _collect(proc)
    assert len(out) == 5000000 and err == b"done\n" and exit_ == {"exit_code": 0, "signal": None}


async def test_a_closed_connection_hangs_its_process_up(agent: RunningAgent) -> None:
    streams = await _holding(agent)
    proc = await open_exec(streams, CALLER, TAG, ["sh", "-c", "trap '' HUP; sleep 60"])
    # Marks the hang-up in a file (its stdout has no reader by then) and never writes to stdout again.
    marks = ("import os, signal, time\n"
             "def hung_up(*_):\n    open('hung-up', 'w').write('HUP')\n    os._exit(129)\n"
             "signal.signal(signal.SIGHUP, hung_up)\nprint('trapped', flush=True)\ntime.sleep(60)")
    quick = await open_exec(streams, CALLER, TAG, [PY, "-S", "-c", marks])
    assert await anext(quick.events()) == ("stdout", b"trapped\n")  # a hang-up before the handler would just kill it
    await proc.close()
    await quick.close()
    assert await _gone(quick.pid, 10)
    assert (agent.workspace / "hung-up").read_text() == "HUP"  # SIGHUP, not the SIGKILL after the grace
    assert await _gone(proc.pid, 10)  # SIGKILL after the grace, HUP ignored


async def test_another_callers_tag_is_not_found_and_a_pod_without_a_session_conflicts(agent: RunningAgent) -> None:
    streams = _streams(agent)
    with pytest.raises(Conflict):
        await open_exec(streams, CALLER, TAG, ["true"])
    await agent.client.launch(launch("hold", "sleep", "60", session="s1"))
    with pytest.raises(NotFound):
        await open_exec(streams, "mallory", TAG, ["true"])
    with pytest.raises(Conflict):
        await open_exec(streams, CALLER, TAG, ["true"], session="s2")
    with pytest.raises(InvalidRequest):
        await open_exec(streams, CALLER, TAG, ["no-such-program-here"])
    with pytest.raises(InvalidRequest):
        await open_exec(streams, CALLER, TAG, ["true"], cwd="no/such/dir")
    assert await run_collected(streams, CALLER, TAG, ["true"], session="s1") == (0, b"", b"")


async def test_a_reset_kills_the_exec_processes(agent: RunningAgent) -> None:
    streams = await _holding(agent)
    proc = await open_exec(streams, CALLER, TAG, ["bash", "-c", "sleep 60 & echo $!; wait"])
    events = proc.events()
    _, child = await anext(events)
    await agent.client.reset(ResetRequest())
    async with asyncio.timeout(10):
        async for kind, data in events:
            if kind == "exit":
                assert data["signal"] is not None
    assert await _gone(proc.pid, 2) and await _gone(int(child), 2)


async def test_exec_start_to_first_byte_is_fast(agent: RunningAgent) -> None:
    streams = await _holding(agent)
    samples = []
    for _ in range(20):
        began = time.perf_counter()
        proc = await open_exec(streams, CALLER, TAG, ["echo", "hi"])
        async for kind, data in proc.events():
            assert (kind, data) == ("stdout", b"hi\n")
            break
        samples.append(time.perf_counter() - began)
        await proc.close()
    samples.sort()
    print(f"exec start -> first byte of `echo hi`: p50 {samples[10] * 1000:.1f} ms, p90 {samples[18] * 1000:.1f} ms")
    assert samples[10] < 0.5
