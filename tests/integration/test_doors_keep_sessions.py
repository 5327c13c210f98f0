"""Nothing lost below the ceiling, through every front door (docs/security.md): one caller's sessions of the REST
API, the SDK, an MCP conversation (`firepool mcp` over stdio, the official client) and a Jupyter kernel (the
provisioner under jupyter_client) take turns on one pool below its ceiling; each door writes a file in its
session, the other three run a turn each in theirs, and the door finds its file again on its own warm pod.
Before the rule, each turn of another session recycled (and emptied) the idle pod of the door that waited.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client as McpClient
from mcp import StdioServerParameters

from broker.client import Client
from tests.integration.conftest import BrokerProcess
from tests.integration.test_jupyter import run, start

pytestmark = pytest.mark.integration

# One `cpu` pool (host network, so a kernel binds 127.0.0.1 itself) whose ceiling bob's five sessions stay below.
POOLS = """pools:
  - {name: cpu, max_count: 6, template: {network: host}}
"""
DOORS = ("rest", "sdk", "mcp", "jupyter")
KERNEL = "fp-door"


@pytest.fixture(scope="module")
def fp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("doors")
    broker = BrokerProcess(root / "broker", pools=POOLS, callers=("alice", "bob"))
    data = root / "jupyter-data"
    r = subprocess.run([sys.executable, "-m", "broker.cli", "kernelspec", "install", "--pool", "cpu", "--name", KERNEL,
                        "--tag", "door-jupyter", "--user"], env=broker.env("bob") | {"JUPYTER_DATA_DIR": str(data)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    broker.jupyter_data = data  # type: ignore[attr-defined]
    yield broker
    broker.stop()


@pytest.fixture
def as_bob(fp: BrokerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BrokerProcess:
    """Bob's credentials in this process's environment (the kernel provisioner reads them there)."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(fp.jupyter_data))  # type: ignore[attr-defined]
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    monkeypatch.setenv("FIREPOOL_URL", fp.url)
    monkeypatch.setenv("FIREPOOL_TOKEN", fp.tokens["bob"])
    return fp


def rest(fp: BrokerProcess, command: str) -> tuple[str, str]:
    """A plain REST job of session door-rest: (its output, its acquisition path)."""
    http = fp.client("bob")
    body = {"pool": "cpu", "lease_tag": "door-rest", "command": ["sh", "-c", command]}
    job = http.post("/v1/jobs", params={"wait_s": 60}, json=body).json()
    assert job["state"] == "SUCCEEDED", job
    return http.get(f"/v1/jobs/{job['id']}/logs", params={"stream": "stdout"}).text, job["acquisition"][0]["path"]


def sdk(fp: BrokerProcess, command: str) -> tuple[str, str]:
    with Client(fp.url, fp.tokens["bob"]) as c:
        job = c.run(["sh", "-c", command], "cpu", lease_tag="door-sdk")
        assert job.state == "SUCCEEDED", job.raw
        return c.logs(job.id, "stdout"), job.path


@contextlib.asynccontextmanager
async def conversation(fp: BrokerProcess) -> AsyncIterator[McpClient]:
    # The venv's `firepool`, as test_mcp.py finds it: CI runs the venv's pytest without the venv on PATH.
    env = {**fp.env("bob"), "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    async with McpClient(StdioServerParameters(command="firepool", args=["mcp", "--pool", "cpu"], env=env)) as c:
        yield c


async def mcp(c: McpClient, command: str) -> tuple[str, str]:
    res = await c.call_tool("run_in_sandbox", {"command": command, "session": "door-mcp"})
    assert not res.is_error and res.structured_content is not None, res.content
    out: dict[str, Any] = res.structured_content
    return str(out["stdout_tail"]), str(out["acquisition"])


async def cell(kc: Any, command: str) -> str:
    reply, text, _ = await run(kc, f"import subprocess; print(subprocess.run({command!r}, shell=True, "
                                   "capture_output=True, text=True).stdout, end='')")
    assert reply["status"] == "ok", reply
    return text


async def turn(fp: BrokerProcess, door: str) -> None:
    """One call of `door`'s session that leaves a file of its own."""
    command = f"echo turn > turn-{door}.txt"
    if door == "rest":
        rest(fp, command)
    elif door == "sdk":
        sdk(fp, command)
    elif door == "mcp":
        async with conversation(fp) as c:
            await mcp(c, command)
    else:
        km, kc = await start(KERNEL)
        try:
            await cell(kc, command)
        finally:
            kc.stop_channels()
            await km.shutdown_kernel()


async def others(fp: BrokerProcess, door: str) -> None:
    for other in DOORS:
        if other != door:
            await turn(fp, other)


def _mark() -> str:
    return secrets.token_hex(4)


async def test_a_rest_session_finds_its_files_after_the_other_doors_took_turns(as_bob: BrokerProcess) -> None:
    mark = _mark()
    rest(as_bob, f"echo {mark} > kept.txt")
    await others(as_bob, "rest")
    out, path = rest(as_bob, "cat kept.txt || echo GONE")
    assert (out, path) == (f"{mark}\n", "warm")


async def test_an_sdk_session_finds_its_files_after_the_other_doors_took_turns(as_bob: BrokerProcess) -> None:
    mark = _mark()
    sdk(as_bob, f"echo {mark} > kept.txt")
    await others(as_bob, "sdk")
    out, path = sdk(as_bob, "cat kept.txt || echo GONE")
    assert (out, path) == (f"{mark}\n", "warm")


async def test_an_open_mcp_conversation_finds_its_files_after_the_other_doors_took_turns(
        as_bob: BrokerProcess) -> None:
    mark = _mark()
    async with conversation(as_bob) as c:
        await mcp(c, f"echo {mark} > kept.txt")
        # The acceptance check's step: a REST job of another session of the same caller, waited for.
        with Client(as_bob.url, as_bob.tokens["bob"]) as bob:
            assert bob.run(["true"], "cpu", lease_tag="other-work").state == "SUCCEEDED"
        await others(as_bob, "mcp")
        assert await mcp(c, "cat kept.txt || echo GONE") == (f"{mark}\n", "warm")


async def test_a_notebooks_kernel_session_finds_its_files_after_the_other_doors_took_turns(
        as_bob: BrokerProcess) -> None:
    # The kernel is shut down between (its pod idle, held for the session): a live kernel's pod is busy, and a busy
    # pod was never taken; an idle one was, by the next session's job.
    mark = _mark()
    km, kc = await start(KERNEL)
    try:
        await cell(kc, f"echo {mark} > kept.txt")
    finally:
        kc.stop_channels()
        await km.shutdown_kernel()
    await others(as_bob, "jupyter")
    km, kc = await start(KERNEL)
    try:
        assert await cell(kc, "cat kept.txt || echo GONE") == f"{mark}\n"
    finally:
        kc.stop_channels()
        await km.shutdown_kernel()
