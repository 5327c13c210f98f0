"""Session continuity through every front door (issue 9), on a real broker and the local backend.

Each pool holds one pod (`max_count: 1`), so a caller's second session must start on the first one's pod:
the `recycled` path (or, for MCP conversations, a takeover at the ceiling). The new session starts on an
emptied workspace, never sees the old session's files, and keeps its own files across >= 3 jobs; a
different caller never gets the pod.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from broker.client import Client
from mcp_server.identity import StdioBroker
from mcp_server.server import build_server
from tests.integration.conftest import BrokerProcess
from tests.integration.test_jupyter import run, start, use
from tests.integration.test_mcp import call

pytestmark = pytest.mark.integration

POOLS = """pools:
  - {name: solo, gpus: 0, min_count: 1, max_idle_count: 1, max_count: 1}
  - {name: gpu, gpus: 1, max_count: 1, max_idle_count: 1}
"""
CHECK = "cat ws.txt 2>/dev/null || echo MISSING; test ! -e old.txt || echo OLDLEAK"


@pytest.fixture
def solo(broker_factory) -> BrokerProcess:
    broker: BrokerProcess = broker_factory(pools=POOLS)
    return broker


def _fp(broker: BrokerProcess, *args: str, caller: str = "alice") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker.cli", *args], env=broker.env(caller), capture_output=True,
                          text=True, timeout=120)


def _bob_never_gets_the_pod(broker: BrokerProcess, pod: str) -> None:
    """Bob's job of the same session name waits (the pool is at its ceiling with alice's held pod), or gets a
    new pod once alice's hold is broken, never alice's pod."""
    with Client(broker.url, broker.tokens["bob"]) as bob:
        job = bob.submit(["true"], "solo", lease_tag="new-session")
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not (seen := bob.get(job.id, wait_s=0.5)).terminal:
            pass
        assert pod not in (seen.raw.get("bound_pods") or []), seen.raw
        if not seen.terminal:
            bob.cancel(job.id)
    assert all(p["caller"] in (None, "alice") for p in broker.client("ops").get("/v1/pods").json()["pods"]
               if p["name"] == pod)


def test_a_cli_session_that_starts_on_a_recycled_pod_keeps_its_files(solo: BrokerProcess) -> None:
    old = _fp(solo, "submit", "--pool", "solo", "--tag", "old-session", "--wait", "--", "sh", "-c",
              "echo old > old.txt")
    assert old.returncode == 0, old.stderr
    first = _fp(solo, "submit", "--pool", "solo", "--tag", "new-session", "--wait", "--", "sh", "-c",
                "ls -A; echo kept > ws.txt")
    assert first.returncode == 0 and first.stdout == "", first  # an emptied workspace at the boundary
    for _ in range(3):
        again = _fp(solo, "submit", "--pool", "solo", "--tag", "new-session", "--wait", "--", "sh", "-c", CHECK)
        assert again.returncode == 0 and again.stdout == "kept\n", again
    jobs = sorted(solo.client().get("/v1/jobs").json()["jobs"], key=lambda j: j["timings"]["submitted_at"])
    assert [j["acquisition"][0]["path"] for j in jobs[1:]] == ["recycled", "warm", "warm", "warm"]
    assert len({j["bound_pods"][0] for j in jobs}) == 1
    _bob_never_gets_the_pod(solo, jobs[0]["bound_pods"][0])


def test_an_sdk_session_that_starts_on_a_recycled_pod_keeps_its_files(solo: BrokerProcess) -> None:
    with Client(solo.url, solo.tokens["alice"]) as c:
        old = c.run(["sh", "-c", "echo old > old.txt"], "solo", lease_tag="old-session")
        first = c.run(["sh", "-c", "ls -A; echo kept > ws.txt"], "solo", lease_tag="new-session")
        assert first.path == "recycled" and c.logs(first.id) == ""
        assert first.acquisition[0]["pod"] == old.acquisition[0]["pod"]
        for _ in range(3):
            job = c.run(["sh", "-c", CHECK], "solo", lease_tag="new-session")
            assert job.state == "SUCCEEDED" and job.path == "warm" and c.logs(job.id) == "kept\n"
            assert job.acquisition[0]["pod"] == old.acquisition[0]["pod"]
        # The old session comes back to an emptied pod (its files went with the boundary), never to new-session's.
        back = c.run(["sh", "-c", "ls -A"], "solo", lease_tag="old-session")
        assert back.path == "recycled" and c.logs(back.id) == ""
    _bob_never_gets_the_pod(solo, old.acquisition[0]["pod"])


async def _restart(km: Any, kc: Any) -> Any:
    kc.stop_channels()
    await km.restart_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)
    return kc


async def _kernel_session(broker: BrokerProcess, name: str, restarts: int, write: bool = True) -> tuple[str, list[str]]:
    """Start a kernel, (optionally) write keep.txt, restart `restarts` times checking it each time; shut down.
    Returns (the pod, each kernel job's acquisition path)."""
    km, kc = await start(name)
    jobs: list[str] = []
    try:
        jobs.append(str(km.provisioner.job_id))  # type: ignore[union-attr]
        code = ("import os; print(os.path.exists('keep.txt'))\nopen('keep.txt', 'w').write('kept')" if write
                else "print(open('keep.txt').read())")
        reply, out, _ = await run(kc, code)
        assert reply["status"] == "ok" and out == ("False\n" if write else "kept\n"), (reply, out)
        for _ in range(restarts):
            kc = await _restart(km, kc)
            jobs.append(str(km.provisioner.job_id))  # type: ignore[union-attr]
            reply, out, _ = await run(kc, "print(open('keep.txt').read())")
            assert reply["status"] == "ok" and out == "kept\n", (reply, out)
    finally:
        kc.stop_channels()
        await km.shutdown_kernel()
    views = [broker.client().get(f"/v1/jobs/{j}").json() for j in jobs]
    assert len({v["bound_pods"][0] for v in views}) == 1
    return views[0]["bound_pods"][0], [v["acquisition"][0]["path"] for v in views]


def _install_kernelspec(broker: BrokerProcess, tmp_path: Path, name: str, *tag: str) -> None:
    r = subprocess.run([sys.executable, "-m", "broker.cli", "kernelspec", "install", "--pool", "gpu", "--name", name,
                        "--user", *tag], env=broker.env("alice") | {"JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data")},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


async def test_a_kernel_restart_keeps_the_workspace_on_a_never_used_a_recycled_and_a_held_pod(
        solo: BrokerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    use(solo, monkeypatch, "alice")
    _install_kernelspec(solo, tmp_path, "fp-kernel")
    _install_kernelspec(solo, tmp_path, "fp-named", "--tag", "analysis")

    pod, first = await _kernel_session(solo, "fp-kernel", restarts=1)  # a never-used pod
    assert first[0] in ("new", "warm") and first[1:] == ["warm"]
    # A second kernel of alice's: its tag is a new session, so it starts on the first kernel's pod, emptied.
    again, second = await _kernel_session(solo, "fp-kernel", restarts=3)
    assert again == pod and second == ["recycled", "warm", "warm", "warm"]
    # A named session's kernel, shut down and started again: the second start lands on its held pod.
    await _kernel_session(solo, "fp-named", restarts=0)
    held, third = await _kernel_session(solo, "fp-named", restarts=2, write=False)
    assert held == pod and third == ["warm", "warm", "warm"]


async def test_an_mcp_conversation_that_takes_over_a_pod_at_the_ceiling_keeps_its_files(solo: BrokerProcess) -> None:
    from mcp import Client as McpClient

    broker = StdioBroker(solo.url, solo.tokens["alice"])
    try:
        async with McpClient(build_server(broker, pool="solo")) as c:
            old = await call(c, "run_in_sandbox", command="echo old > old.txt", session="conv-old")
            first = await call(c, "run_in_sandbox", command="ls; echo kept > ws.txt", session="conv-new")
            # An emptied workspace but for what the MCP server itself keeps there (outputs/).
            assert first["acquisition"] == "recycled" and first["stdout_tail"] == "outputs\n", first
            for _ in range(3):
                res = await call(c, "run_in_sandbox", command=CHECK, session="conv-new")
                assert res["acquisition"] == "warm" and res["stdout_tail"] == "kept\n", res
    finally:
        await broker.close()
    pods = {solo.client().get(f"/v1/jobs/{r['job_id']}").json()["bound_pods"][0] for r in (old, first, res)}
    assert len(pods) == 1
    _bob_never_gets_the_pod(solo, pods.pop())
