"""python_exec over a live kernel per MCP session, against a real broker on the local backend, driven by
the official MCP client in process and over stdio."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp_types import TextContent

from mcp_server.identity import StdioBroker
from mcp_server.server import FirepoolMCP, build_server
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration

LIVE = "import threading, socket\nlk = threading.Lock(); sk = socket.socket()\nlk.acquire()\nn = 41"
USE = "print('LOCKED' if lk.locked() else 'UNLOCKED', sk.fileno() > 0)\nn + 1"


@pytest.fixture(scope="module")
def fp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("live") / "broker")
    yield broker
    broker.stop()


@contextlib.asynccontextmanager
async def in_process(fp: BrokerProcess, caller: str = "alice") -> AsyncIterator[tuple[Client, FirepoolMCP]]:
    broker = StdioBroker(fp.url, fp.tokens[caller])
    server = build_server(broker)
    try:
        async with Client(server) as client:
            yield client, server
    finally:
        await server.kernels.close(save=False)
        await broker.close()


async def call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    res = await client.call_tool(tool, args)
    assert not res.is_error, res.content
    assert res.structured_content is not None
    return dict(res.structured_content)


def has_kernel(server: FirepoolMCP, session: str) -> bool:
    return any(s == session for _, s in server.kernels.sessions())


def text_of(block: Any) -> str:
    assert isinstance(block, TextContent), block
    return block.text


async def test_an_object_that_cannot_be_pickled_lives_from_one_call_to_the_next(fp: BrokerProcess) -> None:
    async with in_process(fp) as (c, _):
        first = await call(c, "python_exec", code=LIVE, session="live")
        assert first["status"] == "ok" and first["kernel"]["restarted"] is False
        second = await call(c, "python_exec", code=USE, session="live")
        assert second["stdout_tail"] == "LOCKED True\n" and second["result"] == "42"
        assert second["kernel"] is None and second["kernel_job_id"] == first["kernel_job_id"]


async def test_images_dataframes_and_errors_come_back_as_rich_content(fp: BrokerProcess) -> None:
    async with in_process(fp) as (c, _):
        plot = await c.call_tool("python_exec", {"session": "rich", "code":
                                                 "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"})
        images = [b for b in plot.content if b.type == "image"]
        assert len(images) == 1 and images[0].mime_type == "image/png"
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG")
        frame = await c.call_tool("python_exec", {"session": "rich", "code":
                                                  "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"})
        assert frame.structured_content["outputs"] == ["text/markdown"]
        table = text_of(frame.content[1])
        assert table.splitlines()[:3] == ["|  | a | b |", "|---|---|---|", "| 0 | 1 | x |"]
        bad = await call(c, "python_exec", session="rich",
                         code="def f(v):\n    return 1 / v\ndef g():\n    return f(0)\ng()")
        assert bad["status"] == "error" and bad["error"]["ename"] == "ZeroDivisionError"
        assert "\x1b[" not in bad["error"]["traceback"] and "return 1 / v" in bad["error"]["traceback"]


async def test_a_cancelled_call_interrupts_the_kernel_and_the_next_call_keeps_earlier_variables(
        fp: BrokerProcess) -> None:
    async with in_process(fp) as (c, server):
        await call(c, "python_exec", code="kept = 'still here'", session="cancel")
        task = asyncio.ensure_future(c.call_tool("python_exec", {"code": "import time\ntime.sleep(60)",
                                                                 "session": "cancel"}))
        await asyncio.sleep(1.5)
        began = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await call(c, "python_exec", code="kept", session="cancel")
        assert after["result"] == "'still here'" and time.monotonic() - began < 15
        assert after["kernel"] is None  # the same kernel: interrupted, not restarted


async def test_a_timeout_interrupts_the_code_and_keeps_the_kernel(fp: BrokerProcess) -> None:
    async with in_process(fp) as (c, _):
        slow = await call(c, "python_exec", code="v = 7\nprint('before')\nimport time\ntime.sleep(30)",
                          session="slow", timeout_s=1.5)
        assert slow["status"] == "timed_out" and slow["stdout_tail"] == "before\n"
        assert (await call(c, "python_exec", code="v * 6", session="slow"))["result"] == "42"


async def test_run_in_sandbox_sees_what_python_exec_wrote_and_the_other_way_round(fp: BrokerProcess) -> None:
    async with in_process(fp) as (c, _):
        await call(c, "python_exec", code="open('from_py.txt', 'w').write('py')", session="files")
        ran = await call(c, "run_in_sandbox", command="cat from_py.txt; echo sh > from_sh.txt", session="files")
        assert ran["stdout_tail"] == "py" and ran["via"] == "kernel" and ran["exit_code"] == 0
        read = await call(c, "python_exec", code="open('from_sh.txt').read()", session="files")
        assert read["result"] == "'sh\\n'"
        failed = await call(c, "run_in_sandbox", command="echo out; echo err >&2; exit 3", session="files")
        assert (failed["exit_code"], failed["stdout_tail"], failed["stderr_tail"]) == (3, "out\n", "err\n")
        late = await call(c, "run_in_sandbox", command="echo started; sleep 30", session="files", timeout_s=1)
        assert late["timed_out"] is True and late["stdout_tail"] == "started\n"
        listed = await call(c, "list_files", session="files")
        assert {"from_py.txt", "from_sh.txt"} <= {e["path"] for e in listed["entries"]}


async def test_a_live_object_survives_over_stdio(fp: BrokerProcess) -> None:
    env = {**fp.env("alice"), "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    async with Client(StdioServerParameters(command="firepool", args=["mcp"], env=env)) as c:
        assert c.server_info is not None and c.server_info.version == version("firepool")
        await call(c, "python_exec", code=LIVE, session="stdio-live")
        used = await call(c, "python_exec", code=USE, session="stdio-live")
        assert used["stdout_tail"] == "LOCKED True\n"
        # notifications/cancelled over the wire interrupts the kernel; the next call still has the lock
        task = asyncio.ensure_future(c.call_tool("python_exec", {"code": "import time\ntime.sleep(60)",
                                                                 "session": "stdio-live"}))
        await asyncio.sleep(1.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        began = time.monotonic()
        after = await call(c, "python_exec", code=USE, session="stdio-live")
        assert after["stdout_tail"] == "LOCKED True\n" and time.monotonic() - began < 15


@pytest.fixture(scope="module")
def short_hold(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    pools = ("pools:\n  - name: cpu\n    gpus: 0\n    min_count: 0\n    max_idle_count: 4\n    max_count: 4\n"
             "    idle_timeout: 60\n    caller_hold_seconds: 2\n")
    broker = BrokerProcess(tmp_path_factory.mktemp("hold") / "broker", pools=pools)
    yield broker
    broker.stop()


async def test_an_idle_kernel_ends_after_the_keep_alive_and_the_next_call_restores_what_was_saved(
        short_hold: BrokerProcess) -> None:
    async with in_process(short_hold) as (c, server):
        first = await call(c, "python_exec", session="idle", code=(
            "import math, threading\nx = [1, 2, 3]\ndef double(v):\n    return 2 * v\nlk = threading.Lock()"))
        deadline = time.monotonic() + 20
        while has_kernel(server, "idle") and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
        assert not has_kernel(server, "idle"), "the idle kernel was not ended"
        http = short_hold.client()
        job = (await asyncio.to_thread(http.get, f"/v1/jobs/{first['kernel_job_id']}", params={"wait_s": 20})).json()
        assert job["state"] in ("CANCELLED", "SUCCEEDED")
        back = await call(c, "python_exec", code="double(len(x)) + math.floor(1.5)", session="idle")
        assert back["result"] == "7" and back["kernel_job_id"] != first["kernel_job_id"]
        note = back["kernel"]
        assert note["restarted"] is True and "keep-alive" in note["reason"]
        assert set(note["restored"]) == {"double", "math", "threading", "x"} and note["lost"] == ["lk"]
        text = text_of((await c.call_tool("python_exec", {"code": "1", "session": "idle"})).content[0])
        assert "restarted" not in text  # said once, by the call that restarted it


async def test_a_background_job_saves_and_ends_the_kernel_and_python_exec_comes_back_after_it(
        fp: BrokerProcess) -> None:
    async with in_process(fp) as (c, server):
        await call(c, "python_exec", code="import threading\nsaved = {'k': 1}\nlk = threading.Lock()", session="bg")
        started = await call(c, "run_in_sandbox", command="echo bg > bg.txt", session="bg", background=True)
        assert not has_kernel(server, "bg") and started["via"] == "job"
        back = await call(c, "python_exec", code="saved['k'] + len(open('bg.txt').read())", session="bg")
        assert back["result"] == "4" and back["kernel"]["restored"] == ["saved", "threading"]
        assert back["kernel"]["lost"] == ["lk"] and "background" in back["kernel"]["reason"]


async def test_a_package_installed_while_the_kernel_lives_imports_in_it(fp: BrokerProcess) -> None:
    from tests.integration.test_mcp import _wheel

    async with in_process(fp) as (c, _):
        await call(c, "python_exec", code="ready = True", session="pkg-live")
        wheel = "fplive-2.0-py3-none-any.whl"
        await call(c, "write_files", session="pkg-live",
                   files=[{"path": wheel, "base64": base64.b64encode(_wheel("fplive", "2.0")).decode()}])
        installed = await call(c, "install_packages", packages=[f"./{wheel}"], session="pkg-live")
        assert installed["installed"] == [f"./{wheel}"]
        assert (await call(c, "python_exec", code="import fplive; fplive.VERSION", session="pkg-live"))["result"] \
            == "'2.0'"


@pytest.fixture(scope="module")
def one_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    pools = ("pools:\n  - name: cpu\n    gpus: 0\n    min_count: 0\n    max_idle_count: 1\n    max_count: 1\n"
             "    idle_timeout: 300\n")
    broker = BrokerProcess(tmp_path_factory.mktemp("ceiling") / "broker", pools=pools)
    yield broker
    broker.stop()


async def test_an_idle_kernel_gives_way_when_the_pool_is_blocked_at_its_ceiling(one_pod: BrokerProcess) -> None:
    async with in_process(one_pod) as (c, server):
        server.kernels.min_idle_at_ceiling = 1.0
        first = await call(c, "python_exec", code="v = 5", session="ceil")
        bob = one_pod.client("bob")
        queued = bob.post("/v1/jobs", json={"pool": "cpu", "command": ["true"]}).json()
        deadline = time.monotonic() + 20
        while has_kernel(server, "ceil") and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
        assert not has_kernel(server, "ceil"), "the kernel kept its pod at a blocked ceiling"
        await asyncio.to_thread(bob.post, f"/v1/jobs/{queued['id']}/cancel")
        back = await call(c, "python_exec", code="v * 2", session="ceil")
        assert back["result"] == "10" and back["kernel_job_id"] != first["kernel_job_id"]
        assert "ceiling" in back["kernel"]["reason"]


async def test_a_kernel_that_died_while_idle_is_replaced_and_the_call_says_so(fp: BrokerProcess) -> None:
    async with in_process(fp) as (c, _):
        first = await call(c, "python_exec", code="gone = 1", session="dies")
        http = fp.client()
        http.post(f"/v1/jobs/{first['kernel_job_id']}/cancel")
        await asyncio.to_thread(http.get, f"/v1/jobs/{first['kernel_job_id']}", params={"wait_s": 20})
        again = await call(c, "python_exec", code="'gone' in globals()", session="dies")
        assert again["result"] == "False" and again["kernel_job_id"] != first["kernel_job_id"]
        assert again["kernel"]["restarted"] is True and "ended" in again["kernel"]["reason"]
        ran = await call(c, "run_in_sandbox", command="echo still", session="dies")
        assert ran["stdout_tail"] == "still\n" and ran["via"] == "kernel"


async def test_a_cancelled_command_beside_the_kernel_leaves_no_process_behind(fp: BrokerProcess) -> None:
    async with in_process(fp) as (c, _):
        await call(c, "python_exec", code="alive = 'yes'", session="cancel-cmd")
        task = asyncio.ensure_future(c.call_tool("run_in_sandbox", {"command": "sleep 33", "session": "cancel-cmd"}))
        await asyncio.sleep(1.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        check = await call(c, "run_in_sandbox", session="cancel-cmd",
                           command="for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
        assert [ln for ln in check["stdout_tail"].splitlines() if "sleep 33" in ln] == []
        assert (await call(c, "python_exec", code="alive", session="cancel-cmd"))["result"] == "'yes'"


async def test_a_kernel_whose_server_went_away_saves_and_ends_itself_and_a_new_server_restores_it(
        short_hold: BrokerProcess) -> None:
    async with in_process(short_hold) as (c, server):
        server.kernels.watchdog_margin = 1.0  # the kernel ends itself 3 s after its last request
        first = await call(c, "python_exec", code="import threading\nkept = [7]\nlk = threading.Lock()",
                           session="orphan")
        sweeper = server.kernels._sweeper
        assert sweeper is not None
        sweeper.cancel()  # the server stops looking after its kernels, as if it had died
        http = short_hold.client()
        job = (await asyncio.to_thread(http.get, f"/v1/jobs/{first['kernel_job_id']}", params={"wait_s": 30})).json()
        assert job["state"] == "SUCCEEDED", job["state"]
        for k in list(server.kernels._live.values()):
            await server.kernels.stop(k)  # forget it without saving: a new server would not know it either
    async with in_process(short_hold) as (c, _):
        back = await call(c, "python_exec", code="kept[0] * 6", session="orphan")
        assert back["result"] == "42" and back["kernel"]["restarted"] is True, back
        assert back["kernel"]["restored"] == ["kept", "threading"] and back["kernel"]["lost"] == ["lk"]


async def test_a_long_cell_reports_progress_with_its_last_output_line(fp: BrokerProcess) -> None:
    seen: list[str] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message or "")

    async with in_process(fp) as (c, _):
        res = await c.call_tool("python_exec", {"code": "import time\nprint('epoch 1', flush=True)\ntime.sleep(5)",
                                                "session": "prog"}, progress_callback=progress)
        assert not res.is_error
    assert any("epoch 1" in m for m in seen), seen
