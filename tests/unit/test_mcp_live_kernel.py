"""The live-kernel layer of the MCP server without a broker: when an idle kernel ends (virtual clock),
how a kernel's outputs become MCP content, and how argument errors read."""

from __future__ import annotations

import asyncio
import math
import time
from importlib.metadata import version
from typing import Any

import pytest
from mcp import Client
from mcp_types import ImageContent, TextContent

from broker.clock import VirtualClock
from broker.kernel_client import KernelTimeout
from broker.sandbox import idle
from broker.sandbox import kernels as kernels_module
from broker.sandbox.calls import choose_pool
from broker.sandbox.kernel_io import Execution, Started
from broker.sandbox.kernels import Kernels, LiveKernel
from mcp_server import pyresult
from mcp_server.server import build_server
from tests.unit.test_mcp_server import NoBroker

POOL = {"name": "gpu", "idle_timeout": 300.0, "caller_hold_seconds": 120.0, "max_count": 4, "physical": 4,
        "queued_demand": 0}


def test_the_keep_alive_is_the_caller_hold_and_inherits_the_idle_timeout() -> None:
    assert idle.pressure_of(POOL).keep_alive == 120.0
    assert idle.pressure_of({**POOL, "caller_hold_seconds": None}).keep_alive == 300.0
    assert idle.pressure_of({**POOL, "caller_hold_seconds": None, "idle_timeout": None}).keep_alive == math.inf


def test_a_pool_is_blocked_only_with_queued_demand_at_its_ceiling() -> None:
    assert idle.pressure_of({**POOL, "queued_demand": 2}).blocked is True
    assert idle.pressure_of({**POOL, "queued_demand": 2, "physical": 3}).blocked is False
    assert idle.pressure_of({**POOL, "queued_demand": 0}).blocked is False
    assert idle.pressure_of({**POOL, "queued_demand": 2, "max_count": None}).blocked is False


def test_an_idle_kernel_ends_at_the_keep_alive_and_not_a_moment_before() -> None:
    clock = VirtualClock()
    last = clock.now()
    calm = idle.pressure_of(POOL)
    assert idle.end_reason(clock.now() + 119.9, last, False, calm) is None
    assert idle.end_reason(clock.now() + 120.0, last, False, calm) == idle.KEEP_ALIVE
    assert idle.end_reason(clock.now() + 10_000, last, True, calm) is None  # a running call keeps it
    forever = idle.pressure_of({**POOL, "caller_hold_seconds": None, "idle_timeout": None})
    assert idle.end_reason(clock.now() + 1e9, last, False, forever) is None


def test_a_blocked_ceiling_breaks_a_kernel_idle_past_its_tenure() -> None:
    last = VirtualClock().now()
    blocked = idle.pressure_of({**POOL, "queued_demand": 1})
    assert idle.end_reason(last + 59, last, False, blocked) is None
    assert idle.end_reason(last + 60, last, False, blocked) == idle.CEILING
    assert idle.end_reason(last + 5, last, False, blocked, min_idle_at_ceiling=5) == idle.CEILING
    short = idle.pressure_of({**POOL, "queued_demand": 1, "caller_hold_seconds": 10})
    assert idle.end_reason(last + 10, last, False, short) == idle.KEEP_ALIVE


def test_the_watchdog_outlasts_the_keep_alive_and_the_sweep_looks_often_enough() -> None:
    calm = idle.pressure_of(POOL)
    assert idle.watchdog_seconds(calm) == 180.0
    assert idle.watchdog_seconds(idle.pressure_of({**POOL, "caller_hold_seconds": None, "idle_timeout": None})) is None
    assert idle.tick(calm) == idle.MAX_TICK_S and idle.tick(idle.pressure_of({**POOL, "caller_hold_seconds": 1})) == 0.5
    assert idle.tick(calm, min_idle_at_ceiling=8) == 2.0


class PoolsOnly:
    def __init__(self, view: dict[str, Any]) -> None:
        self.view = view

    async def pools(self) -> list[dict[str, Any]]:
        return [self.view]


class RecordingKernels(Kernels):
    """The sweep's choices, with `end` recording instead of talking to a kernel."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(clock=clock.now)
        self.ended: list[tuple[str, str]] = []

    async def end(self, caller: str, session: str, reason: str, *, save: bool = True) -> None:
        self._live.pop((caller, session))
        self.ended.append((session, reason))


def _kernel(kernels: Kernels, session: str, client: PoolsOnly, last_used: float) -> LiveKernel:
    k = LiveKernel(caller="alice", session=session, pool="gpu", client=client, job=None, kernel=None,  # type: ignore[arg-type]
                   last_used=last_used)
    kernels._live[("alice", session)] = k
    return k


async def test_the_sweep_ends_only_the_kernels_the_pool_rules_no_longer_allow() -> None:
    clock = VirtualClock()
    kernels = RecordingKernels(clock)
    calm = PoolsOnly(POOL)
    _kernel(kernels, "old", calm, clock.now())
    _kernel(kernels, "fresh", calm, clock.now() + 100)
    busy = _kernel(kernels, "busy", calm, clock.now())
    busy.busy = 1
    clock.advance(130)
    assert await kernels.sweep() == [("alice", "old", idle.KEEP_ALIVE)]
    calm.view = {**POOL, "queued_demand": 3}
    clock.advance(35)  # "fresh" is idle 65 s: past the tenure, under the keep-alive
    assert await kernels.sweep() == [("alice", "fresh", idle.CEILING)]
    assert kernels.live("alice", "busy") is busy


def test_images_markdown_and_values_become_content_in_order() -> None:
    ex = Execution(stdout="hello\n", execution_count=3, outputs=[
        {"kind": "display_data", "data": {"image/png": "iVBORw0KGgo=\n", "text/plain": "<Figure>"}, "metadata": {}},
        {"kind": "display_data", "data": {"text/html": "<b>x</b>", "text/plain": "x"}, "metadata": {}},
        {"kind": "execute_result", "data": {"text/markdown": "| a |\n|---|", "text/plain": "   a"}, "metadata": {}},
    ])
    res = pyresult.render("s", "job-1", "warm", ex, Started(False, None, [], []))
    first, image, html, table = res.content
    assert isinstance(first, TextContent) and first.text.startswith("session s · [3] ok") and "hello" in first.text
    assert isinstance(image, ImageContent) and image.mime_type == "image/png" and image.data == "iVBORw0KGgo="
    assert isinstance(html, TextContent) and html.text == "<b>x</b>"
    assert isinstance(table, TextContent) and table.text == "| a |\n|---|"
    assert res.structured_content is not None
    assert res.structured_content["outputs"] == ["image/png", "text/html", "text/markdown"]
    assert res.structured_content["result"] == "   a" and res.structured_content["status"] == "ok"


def test_an_error_keeps_its_last_frames_without_colours() -> None:
    frames = ["\x1b[0;31m---------\x1b[0m", *[f"\x1b[1mframe {i}\x1b[0m" for i in range(10)],
              "\x1b[0;31mZeroDivisionError\x1b[0m: division by zero"]
    ex = Execution(status="error", error={"ename": "ZeroDivisionError", "evalue": "division by zero",
                                          "traceback": frames})
    res = pyresult.render("s", "job-1", "warm", ex, None)
    assert res.structured_content is not None
    err = res.structured_content["error"]
    assert res.structured_content["status"] == "error" and "\x1b" not in err["traceback"]
    assert "frame 9" in err["traceback"] and "frame 2" not in err["traceback"] and "frames omitted" in err["traceback"]


def test_a_restart_says_what_came_back_and_what_was_lost() -> None:
    res = pyresult.render("s", "job-2", "warm", Execution(), Started(True, "keep-alive", ["x"], ["lk"]))
    first = res.content[0]
    assert isinstance(first, TextContent)
    assert "kernel restarted (keep-alive); restored: x; lost: lk" in first.text


@pytest.mark.parametrize(("tool", "args", "needle"), [
    ("run_in_sandbox", {"command": "true", "timeout_s": 0}, "run_in_sandbox: invalid argument(s): timeout_s: "
                                                            "Input should be greater than 0"),
    ("run_in_sandbox", {}, "command: required"),
    ("write_files", {"files": [{"path": "a", "body": "x"}]}, "files[0].body: not an accepted field"),
    ("write_files", {"files": [{"path": "a"}]}, "files[0]: give exactly one of `text` or `base64`"),
    ("install_packages", {"packages": ["ok", "--index-url=x"]}, "packages[1]: a requirement specifier or wheel "
                                                               "path, not a pip option"),
])
async def test_argument_errors_name_the_field_and_the_problem_only(tool: str, args: dict[str, Any],
                                                                   needle: str) -> None:
    async with Client(build_server(NoBroker())) as c:
        res = await c.call_tool(tool, args)
    text = " ".join(b.text for b in res.content if isinstance(b, TextContent))
    assert res.is_error and needle in text, text
    for leak in ("pydantic", "http", "FileIn", "Arguments", "validation error"):
        assert leak not in text, text


async def test_server_info_carries_the_package_version() -> None:
    async with Client(build_server(NoBroker())) as c:
        assert c.server_info is not None and c.server_info.version == version("firepool")


def test_without_a_configured_pool_the_server_picks_cpu_else_the_only_pool_else_the_first_without_gpus() -> None:
    assert choose_pool([{"name": "gpu", "gpus": 1}, {"name": "cpu", "gpus": 0}]) == "cpu"
    assert choose_pool([{"name": "solo", "gpus": 0}]) == "solo"
    assert choose_pool([{"name": "h200", "gpus": 8}, {"name": "small", "gpus": 0}, {"name": "a", "gpus": 0}]) == "a"
    assert choose_pool([{"name": "h200", "gpus": 8}, {"name": "a100", "gpus": 8}]) == "a100"
    assert choose_pool([]) == "cpu"


class DroppingKernel:
    """A kernel that answers the interrupted request with its idle status alone, as ipykernel does when the SIGINT
    lands in its handler before the cell's code runs."""

    def __init__(self) -> None:
        self.interrupts = 0
        self.messages = [{"channel": "iopub", "msg_type": "status", "content": {"execution_state": "idle"}}]

    async def interrupt(self) -> None:
        self.interrupts += 1

    async def next_reply(self, msg_id: str, deadline: float) -> dict[str, Any]:
        if self.interrupts and self.messages:
            return self.messages.pop(0)
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        raise KernelTimeout("nothing more")


class StoppingKernels(Kernels):
    def __init__(self) -> None:
        super().__init__()
        self.stopped: list[str] = []

    async def stop(self, k: LiveKernel) -> None:
        self.stopped.append(k.session)


async def test_an_interrupted_request_dropped_without_a_reply_keeps_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels_module, "ALIVE_CHECK_S", 0.01)
    monkeypatch.setattr(kernels_module, "DRAIN_S", 2.0)
    kernels, kernel = StoppingKernels(), DroppingKernel()
    k = LiveKernel(caller="alice", session="s", pool="cpu", client=None, job=None, kernel=kernel,  # type: ignore[arg-type]
                   last_used=0.0)
    ex = Execution()
    began = time.monotonic()
    await kernels._interrupt(k, "m-1", ex)
    assert (kernel.interrupts, kernels.stopped, ex.interrupted) == (1, [], True)
    assert time.monotonic() - began < 1.0  # settled on the idle status, not at the drain's deadline
    result = pyresult.render("s", "j", None, ex, None).structured_content
    assert result is not None and result["status"] == "interrupted"
