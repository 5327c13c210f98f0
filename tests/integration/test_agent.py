"""The pod agent as a real process over its Unix socket, unisolated (a subreaper, not PID 1).

Every test starts its own agent, so no state leaks between them; the sandboxed agent is exercised
through the local backend in test_local_backend.py and test_isolation.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from broker.errors import AgentError
from broker.ports.agent import LaunchRequest, ResetRequest
from broker.running.agent_http import INLINE_LOGS, HttpAgentClient

pytestmark = pytest.mark.integration

AGENT_ROOT = Path(__file__).resolve().parents[2] / "sandbox_image"
PY = sys.executable


@dataclass
class RunningAgent:
    client: HttpAgentClient
    process: subprocess.Popen[bytes]
    secret: str
    socket: str
    root: Path

    @property
    def workspace(self) -> Path:
        return self.root / "ws"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"


def start_agent(root: Path, secret: str) -> subprocess.Popen[bytes]:
    read_end, write_end = os.pipe()
    os.write(write_end, secret.encode())
    os.close(write_end)
    argv = [PY, "-S", "-m", "firepool_agent", "--pod", "test-pod", "--listen", f"unix:{root}/run/agent.sock",
            "--secret-fd", str(read_end), "--workspace", str(root / "ws"), "--package-dir", str(root / "pkg"),
            "--run-dir", str(root / "run"), "--tmp-dir", str(root / "tmp")]
    env = {"PYTHONPATH": str(AGENT_ROOT), "PATH": os.environ["PATH"], "AGENT_ONLY_MARKER": "leak"}
    log = open(root / "agent.log", "wb")  # noqa: SIM115 - the agent holds it
    try:
        return subprocess.Popen(argv, pass_fds=(read_end,), env=env, stdout=log, stderr=log, start_new_session=True)
    finally:
        os.close(read_end)
        log.close()


async def wait_healthy(client: HttpAgentClient, process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> float:
    began = time.perf_counter()
    while True:
        try:
            await client.health()
            return time.perf_counter() - began
        except AgentError:
            if process.poll() is not None or time.perf_counter() - began > timeout_s:
                raise
            await asyncio.sleep(0.002)


@asynccontextmanager
async def running_agent(ignoring: tuple[signal.Signals, ...] = ()) -> AsyncIterator[RunningAgent]:
    """An agent of its own, started by a process that ignores the signals `ignoring` (as `nohup` ignores SIGHUP)."""
    root = Path(tempfile.mkdtemp(prefix="fp-agent-"))  # short: a Unix socket path holds ~107 bytes
    secret = secrets.token_urlsafe(32)
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in ignoring}
    try:
        process = start_agent(root, secret)  # inherits the ignored dispositions, as an exec does
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    client = HttpAgentClient(f"unix:{root}/run/agent.sock", secret, pod="test-pod")
    try:
        await wait_healthy(client, process)
        yield RunningAgent(client, process, secret, f"{root}/run/agent.sock", root)
    finally:
        await client.close()
        process.terminate()
        process.wait(10)
        subprocess.run(["rm", "-rf", str(root)], check=False)


@pytest.fixture
async def agent() -> AsyncIterator[RunningAgent]:
    async with running_agent() as running:
        yield running


def launch(attempt_id: str, *argv: str, session: str = "s1", timeout_s: float | None = None,
           env: dict[str, str] | None = None, cwd: str | None = None) -> LaunchRequest:
    return LaunchRequest(attempt_id=attempt_id, argv=argv, env=env or {}, session=session, timeout_s=timeout_s,
                         cwd=cwd)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, its stat was read
        return False


async def test_launch_waits_and_serves_each_stream(agent: RunningAgent) -> None:
    # Two pipes carry no common order; pauses make the interleaving in `combined` deterministic.
    script = ("import sys, time; print('out-1', flush=True); time.sleep(0.05); "
              "print('err-1', file=sys.stderr, flush=True); time.sleep(0.05); print('out-2')")
    started = await agent.client.launch(launch("job-1:0", PY, "-S", "-c", script))
    assert started.running and started.pid
    done = await agent.client.wait("job-1:0", 10)
    assert not done.running and done.exit_code == 0 and done.signal is None
    assert done.started_at <= done.first_instruction_at <= done.finished_at

    combined = await agent.client.read_log("job-1:0")
    assert combined.data == b"out-1\nerr-1\nout-2\n" and combined.complete and combined.next_offset == 18
    assert (await agent.client.read_log("job-1:0", "stdout")).data == b"out-1\nout-2\n"
    assert (await agent.client.read_log("job-1:0", "stderr")).data == b"err-1\n"

    first = await agent.client.read_log("job-1:0", offset=0, max_bytes=4)
    assert (first.data, first.next_offset, first.complete) == (b"out-", 4, False)
    rest = await agent.client.read_log("job-1:0", offset=first.next_offset)
    assert rest.data == b"1\nerr-1\nout-2\n" and rest.complete
    # The finished status carried the whole logs, so the broker needs no read per stream.
    assert done.logs == {"combined": b"out-1\nerr-1\nout-2\n", "stdout": b"out-1\nout-2\n", "stderr": b"err-1\n"}
    assert (await agent.client.status("job-1:0")) == dataclasses.replace(done, logs=None)


async def test_logs_too_big_to_inline_are_left_to_the_log_reads(agent: RunningAgent) -> None:
    big = INLINE_LOGS // 2 + 1  # each byte lands in stdout and in combined
    await agent.client.launch(launch("job-big:0", PY, "-S", "-c", f"import sys; sys.stdout.write('x' * {big})"))
    done = await agent.client.wait("job-big:0", 10)
    assert done.exit_code == 0 and done.logs is None
    assert len((await agent.client.read_log("job-big:0", "stdout")).data) == big


async def test_first_instruction_lies_between_start_and_the_jobs_own_clock(agent: RunningAgent) -> None:
    status = await agent.client.launch(launch("job-t:0", PY, "-S", "-c", "import time; print(repr(time.time()))"))
    await agent.client.wait("job-t:0", 10)
    printed = float((await agent.client.read_log("job-t:0")).data)
    assert status.started_at is not None and status.first_instruction_at is not None
    assert status.started_at <= status.first_instruction_at <= printed


async def test_log_follow_blocks_until_new_bytes_arrive(agent: RunningAgent) -> None:
    script = "import time; print('a', flush=True); time.sleep(0.5); print('b', flush=True)"
    await agent.client.launch(launch("job-f:0", PY, "-S", "-c", script))
    first = await agent.client.read_log("job-f:0", wait_s=5)
    assert first.data == b"a\n" and not first.complete
    began = time.monotonic()
    second = await agent.client.read_log("job-f:0", offset=first.next_offset, wait_s=5)
    assert second.data == b"b\n"
    assert time.monotonic() - began < 3
    last = await agent.client.read_log("job-f:0", offset=second.next_offset, wait_s=5)
    assert last.data == b"" and last.complete


async def test_every_request_needs_the_secret(agent: RunningAgent) -> None:
    transport = httpx.AsyncHTTPTransport(uds=agent.socket)
    async with httpx.AsyncClient(base_url="http://agent", transport=transport) as raw:
        assert (await raw.get("/v1/health")).status_code == 401
        wrong = {"Authorization": "Bearer " + agent.secret[:-1] + "x"}
        assert (await raw.get("/v1/health", headers=wrong)).status_code == 401
        assert (await raw.post("/v1/reset", json={}, headers=wrong)).status_code == 401
    impostor = HttpAgentClient(f"unix:{agent.socket}", "not-the-secret", pod="test-pod")
    try:
        with pytest.raises(AgentError) as refused:
            await impostor.health()
        assert refused.value.details["status"] == 401
    finally:
        await impostor.close()


def raw_exchange(agent: RunningAgent, *requests: bytes) -> bytes:
    """Send `requests` on one connection and read until the agent closes it."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(agent.socket)
        s.sendall(b"".join(requests))
        received = b""
        while chunk := s.recv(65536):
            received += chunk
        return received


async def test_request_heads_are_parsed_strictly_and_keep_the_connection(agent: RunningAgent) -> None:
    auth = f"Authorization: Bearer {agent.secret}\r\n".encode()
    get = b"GET /v1/health HTTP/1.1\r\nHost: a\r\n" + auth
    answer = raw_exchange(agent, get + b"\r\n", get + b"Connection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 OK") == 2, answer  # kept open after the first, closed after the second
    assert raw_exchange(agent, get + b"X-Folded: a\r\n b\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw_exchange(agent, get + b"no colon here\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw_exchange(agent, get + b"X: y\r\n" * 101 + b"\r\n").startswith(b"HTTP/1.1 431 ")
    assert raw_exchange(agent, b"GET /v1/health HTTP/2.0\r\n\r\n").startswith(b"HTTP/1.1 505 ")
    assert raw_exchange(agent, b"GET /v1/health HTTP/1.0\r\n" + auth + b"\r\n").count(b" 200 OK") == 1


async def test_unknown_fields_are_rejected(agent: RunningAgent) -> None:
    transport = httpx.AsyncHTTPTransport(uds=agent.socket)
    headers = {"Authorization": f"Bearer {agent.secret}"}
    async with httpx.AsyncClient(base_url="http://agent", transport=transport, headers=headers) as raw:
        body = {"attempt_id": "x:0", "argv": ["true"], "session": "s", "surprise": 1}
        response = await raw.post("/v1/attempts", json=body)
        assert response.status_code == 400 and "surprise" in response.json()["error"]["message"]
        assert (await raw.post("/v1/reset", json={"wipe_everything": True})).status_code == 400


async def test_a_second_launch_while_one_runs_is_a_conflict(agent: RunningAgent) -> None:
    await agent.client.launch(launch("job-a:0", "sleep", "30"))
    with pytest.raises(AgentError) as conflict:
        await agent.client.launch(launch("job-b:0", "true"))
    assert conflict.value.details["status"] == 409
    assert (await agent.client.health()).attempt == "job-a:0"
    await agent.client.signal("job-a:0", "KILL")
    assert (await agent.client.wait("job-a:0", 10)).exit_code == 137


async def test_an_attempt_id_runs_at_most_once(agent: RunningAgent) -> None:
    await agent.client.launch(launch("job-once:0", "true"))
    await agent.client.wait("job-once:0", 10)
    with pytest.raises(AgentError) as conflict:
        await agent.client.launch(launch("job-once:0", "true"))
    assert conflict.value.details["status"] == 409


async def test_unknown_attempt_is_not_found(agent: RunningAgent) -> None:
    assert await agent.client.status("never:0") is None
    with pytest.raises(AgentError) as missing:
        await agent.client.wait("never:0", 0.1)
    assert missing.value.details["status"] == 404


async def test_missing_command_finishes_as_launch_error(agent: RunningAgent) -> None:
    status = await agent.client.launch(launch("job-m:0", "no-such-command-anywhere"))
    assert not status.running and status.exit_code is None and status.error_class == "LaunchError"
    assert "no-such-command-anywhere" in (status.message or "")
    assert (await agent.client.health()).attempt is None
    assert (await agent.client.launch(launch("job-m:1", "true"))).running is not None


async def test_job_env_is_fresh_and_cuda_devices_are_the_agents(agent: RunningAgent) -> None:
    env = {"MINE": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    await agent.client.launch(launch("job-e:0", "env", env=env))
    await agent.client.wait("job-e:0", 10)
    lines = dict(line.split("=", 1) for line in (await agent.client.read_log("job-e:0")).data.decode().splitlines())
    assert lines["MINE"] == "1" and lines["CUDA_VISIBLE_DEVICES"] == ""
    assert lines["HOME"] == lines["FIREPOOL_WORKSPACE"] == str(agent.workspace)
    assert lines["TMPDIR"] == str(agent.tmp) and lines["LANG"] == "C.UTF-8"
    assert "AGENT_ONLY_MARKER" not in lines and "PYTHONPATH" not in lines


async def test_timeout_kills_the_whole_tree_including_daemons(agent: RunningAgent) -> None:
    pid_file = agent.workspace / "daemon.pid"
    # The daemon forks twice and calls setsid: it leaves rank 0's session and process group.
    daemon = ("import os, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    if os.fork() == 0:\n"
              f"        open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
              "        time.sleep(60)\n"
              "    os._exit(0)\n"
              "os.wait()\n"
              "time.sleep(60)\n")
    began = time.monotonic()
    await agent.client.launch(launch("job-to:0", PY, "-S", "-c", daemon, timeout_s=1.0))
    status = await agent.client.wait("job-to:0", 15)
    assert not status.running and status.timed_out and status.signal == 9 and status.exit_code == 137
    assert time.monotonic() - began < 5
    daemon_pid = int(pid_file.read_text())
    for _ in range(200):
        if not alive(daemon_pid):
            break
        await asyncio.sleep(0.01)
    assert not alive(daemon_pid)


async def test_cancel_terms_then_kills_after_grace(agent: RunningAgent) -> None:
    await agent.client.launch(launch("job-c:0", "sleep", "60"))
    await agent.client.cancel("job-c:0", grace_s=5)
    status = await agent.client.wait("job-c:0", 10)
    assert status.cancelled and status.signal == 15 and status.exit_code == 143

    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    await agent.client.launch(launch("job-c:1", PY, "-S", "-c", stubborn))
    await agent.client.read_log("job-c:1", wait_s=5)  # TERM is ignored only once the handler is set
    began = time.monotonic()
    await agent.client.cancel("job-c:1", grace_s=0.3)
    status = await agent.client.wait("job-c:1", 10)
    assert status.cancelled and status.signal == 9 and 0.3 <= time.monotonic() - began < 5


async def test_signal_reaches_rank_zero(agent: RunningAgent) -> None:
    await agent.client.launch(launch("job-s:0", "sleep", "60"))
    await agent.client.signal("job-s:0", "TERM")
    status = await agent.client.wait("job-s:0", 10)
    assert status.signal == 15 and not status.cancelled
    await agent.client.signal("job-s:0", "TERM")  # a finished attempt: nothing to do, no error


async def test_a_new_session_sees_an_empty_workspace(agent: RunningAgent) -> None:
    await agent.client.launch(launch("job-w:0", "sh", "-c", "echo kept > note; echo t > $TMPDIR/scratch", session="A"))
    await agent.client.wait("job-w:0", 10)
    await agent.client.launch(launch("job-w:1", "cat", "note", session="A"))
    same = await agent.client.wait("job-w:1", 10)
    assert same.exit_code == 0 and (await agent.client.read_log("job-w:1")).data == b"kept\n"

    await agent.client.launch(launch("job-w:2", "sh", "-c", "ls -A . $TMPDIR", session="B"))
    other = await agent.client.wait("job-w:2", 10)
    listing = (await agent.client.read_log("job-w:2")).data.decode()
    assert other.exit_code == 0 and "note" not in listing and "scratch" not in listing
    assert "session_wipe_s" in other.timings


async def test_clean_reset_is_fast_and_empties_the_package_dir(agent: RunningAgent) -> None:
    (agent.root / "pkg" / "module.py").write_text("x = 1\n")
    await agent.client.launch(launch("job-r:0", "echo", "hi"))
    await agent.client.wait("job-r:0", 10)
    result = await agent.client.reset(ResetRequest())
    assert result.clean and result.killed == 0 and not result.problems
    # Unisolated, the proof scans the host's whole /proc; inside a sandbox it takes ~0.1 ms.
    assert result.duration_s < 0.25
    assert not list((agent.root / "pkg").iterdir())
    assert not (agent.root / "run" / "attempts").exists() or not list((agent.root / "run" / "attempts").iterdir())
    assert (agent.root / "run" / "agent.sock").exists()
    with pytest.raises(AgentError) as wiped:
        await agent.client.read_log("job-r:0")
    assert wiped.value.details["status"] == 410


async def test_a_launch_that_ends_in_its_wait_resets_the_pod_and_keeps_its_logs(agent: RunningAgent) -> None:
    (agent.root / "pkg" / "module.py").write_text("x = 1\n")
    script = "sleep 300 & echo $! > last.pid; echo out; echo err >&2"
    request = dataclasses.replace(launch("job-f:0", "sh", "-c", script), wait_s=5.0, reset_after=ResetRequest())
    done = await agent.client.launch(request)
    assert not done.running and done.exit_code == 0 and done.reset is not None
    assert done.reset.clean and done.reset.killed >= 1, done.reset.problems
    assert done.logs == {"combined": b"out\nerr\n", "stdout": b"out\n", "stderr": b"err\n"}
    assert not list((agent.root / "pkg").iterdir())
    assert (agent.root / "run" / "agent.sock").exists()
    # Nothing changed the pod since that reset: a broker taking over may reuse it without another.
    assert (await agent.client.health()).info["clean_for"] == {"wipe_workspace": False, "wipe_paths": [],
                                                               "keep_paths": []}
    # The files are gone, the logs are not: a broker that takes over before storing them still reads them.
    assert (await agent.client.wait("job-f:0", 0)).logs == done.logs
    assert (await agent.client.read_log("job-f:0", "stderr")).data == b"err\n"
    # Another attempt's kept logs take their place (the broker stored these before launching it).
    again = await agent.client.launch(dataclasses.replace(request, attempt_id="job-g:0", argv=("true",)))
    assert again.reset is not None and again.reset.clean
    with pytest.raises(AgentError) as wiped:
        await agent.client.read_log("job-f:0")
    assert wiped.value.details["status"] == 410


async def test_a_launch_that_outlives_its_wait_or_inlines_no_logs_is_not_reset(agent: RunningAgent) -> None:
    slow = dataclasses.replace(launch("job-s:0", "sleep", "0.5"), wait_s=0.05, reset_after=ResetRequest())
    status = await agent.client.launch(slow)
    assert status.running and status.reset is None
    assert (await agent.client.wait("job-s:0", 10)).exit_code == 0
    big = INLINE_LOGS // 2 + 1
    loud = dataclasses.replace(launch("job-b:0", PY, "-S", "-c", f"import sys; sys.stdout.write('x' * {big})"),
                               wait_s=5.0, reset_after=ResetRequest())
    status = await agent.client.launch(loud)
    assert not status.running and status.logs is None and status.reset is None  # the broker reads them first
    assert len((await agent.client.read_log("job-b:0", "stdout")).data) == big


async def test_reset_of_ten_thousand_files(agent: RunningAgent) -> None:
    make = "import os\nos.makedirs('d/e', exist_ok=True)\nfor i in range(10000): open(f'd/e/f{i}' if i % 2 else f'f{i}', 'w').close()"
    await agent.client.launch(launch("job-10k:0", PY, "-S", "-c", make))
    assert (await agent.client.wait("job-10k:0", 30)).exit_code == 0
    result = await agent.client.reset(ResetRequest(wipe_workspace=True))
    assert result.clean, result.problems
    assert not list(agent.workspace.iterdir())
    assert result.duration_s < 1.0  # target 0.15 s; loose here so a loaded CI box does not flake
    print(f"reset of 10,000 files: {result.duration_s * 1000:.1f} ms")


async def test_reset_kills_leftover_processes(agent: RunningAgent) -> None:
    await agent.client.launch(launch("job-l:0", "sh", "-c", "sleep 300 & sleep 300 & echo $! > last.pid"))
    assert (await agent.client.wait("job-l:0", 10)).exit_code == 0
    leftover = int((agent.workspace / "last.pid").read_text())
    assert alive(leftover)
    result = await agent.client.reset(ResetRequest(wipe_workspace=True))
    assert result.clean and result.killed >= 2
    assert not alive(leftover)


async def test_reset_that_cannot_wipe_reports_unclean(agent: RunningAgent) -> None:
    # Unisolated, a pool path outside the pod's own directories is the host's: it must not be wiped.
    outside = Path(tempfile.mkdtemp(prefix="fp-host-", dir="/var/tmp"))
    (outside / "precious").write_text("host data")
    try:
        result = await agent.client.reset(ResetRequest(wipe_paths=(str(outside),)))
        assert not result.clean and any(str(outside) in p for p in result.problems)
        assert (outside / "precious").exists()
    finally:
        subprocess.run(["rm", "-rf", str(outside)], check=False)


async def test_wipe_keeps_keep_paths_and_opens_read_only_dirs(agent: RunningAgent) -> None:
    script = ("mkdir -p cache/models locked/inner && echo w > cache/models/m && echo x > cache/other && "
              "echo y > locked/inner/f && chmod 500 locked/inner && chmod 000 locked")
    await agent.client.launch(launch("job-k:0", "sh", "-c", script))
    assert (await agent.client.wait("job-k:0", 10)).exit_code == 0
    keep = str(agent.workspace / "cache" / "models")
    result = await agent.client.reset(ResetRequest(wipe_workspace=True, keep_paths=(keep,)))
    assert result.clean, result.problems
    assert sorted(p.name for p in agent.workspace.rglob("*")) == ["cache", "m", "models"]


async def test_launch_latency_over_the_socket(agent: RunningAgent) -> None:
    samples = []
    for i in range(20):
        began = time.time()
        status = await agent.client.launch(launch(f"job-lat:{i}", "true"))
        samples.append((status.first_instruction_at or 0) - began)
        await agent.client.wait(f"job-lat:{i}", 10)
    samples.sort()
    print(f"launch -> first instruction over UDS: median {samples[10] * 1000:.2f} ms, max {samples[-1] * 1000:.2f} ms")
    assert samples[10] < 0.05
