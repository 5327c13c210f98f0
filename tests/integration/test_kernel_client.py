"""The SDK's kernel client (broker.kernel_client) speaks the Jupyter kernel REST + websocket API, the one the
broker's gateway serves: pinned here against a real `jupyter_server` with real ipykernels, in both websocket
forms (v1 binary and the legacy JSON one), with a bearer token and nothing else.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from broker.client import AsyncClient, Client
from broker.errors import Forbidden, NotFound, Unauthorized
from broker.kernel_blocking import Kernel, list_kernelspecs
from broker.kernel_client import AsyncKernel, KernelTimeout, kernels, kernelspecs
from broker.kernel_wire import V1_PROTOCOL
from tests.integration.test_jupyter_server import JupyterServer

pytestmark = pytest.mark.integration

LEGACY = "--ZMQChannelsWebsocketConnection.kernel_ws_protocol="


def server_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data"), "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
            "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime")}


@pytest.fixture
def jupyter(tmp_path):
    made: list[JupyterServer] = []

    def start(*options: str) -> JupyterServer:
        server = JupyterServer(tmp_path, server_env(tmp_path), *options)
        made.append(server)
        return server

    yield start
    for server in made:
        server.stop()


@pytest.mark.parametrize("protocol", ["v1", "legacy"])
async def test_a_cell_runs_and_its_stream_result_display_and_error_come_back_over_either_websocket_form(
        jupyter, protocol):
    server = jupyter(*([LEGACY] if protocol == "legacy" else []))
    async with AsyncClient(server.url, server.token) as fp:
        assert "python3" in (await kernelspecs(fp))["kernelspecs"]
        async with await AsyncKernel.start(fp, "python3") as k:
            assert k.protocol == (V1_PROTOCOL if protocol == "v1" else None)
            assert [m["id"] for m in await kernels(fp)] == [k.id]
            ex = await k.execute("import sys\nx = 41\nprint('out', x + 1)\nprint('err', file=sys.stderr)\n"
                                 "from IPython.display import display, HTML\ndisplay(HTML('<b>hi</b>'))\nx + 1")
            assert (ex.status, ex.stdout, ex.stderr) == ("ok", "out 42\n", "err\n")
            assert [o["kind"] for o in ex.outputs] == ["display_data", "execute_result"]
            assert ex.outputs[0]["data"]["text/html"] == "<b>hi</b>"
            assert ex.outputs[1]["data"]["text/plain"] == "42"
            assert ex.execution_count == 1
            bad = await k.execute("1 / 0")
            assert bad.status == "error" and bad.error is not None and bad.error["ename"] == "ZeroDivisionError"
            quiet = await k.execute("y = 1", silent=True, user_expressions={"v": "x * 2"})
            assert quiet.user_expressions["v"]["data"]["text/plain"] == "82"


async def test_interrupt_stops_a_running_cell_and_restart_keeps_the_socket_but_not_the_namespace(jupyter):
    server = jupyter()
    async with AsyncClient(server.url, server.token) as fp:
        k = await AsyncKernel.start(fp, "python3")
        await k.execute("x = 1")
        with pytest.raises(KernelTimeout):
            await k.execute("import time; time.sleep(0.5)", timeout=0.01)
        sleeping = asyncio.Event()
        cell = asyncio.create_task(k.execute("import time; print('sleeping', flush=True); time.sleep(60)",
                                             on_message=lambda m: sleeping.set() if m["msg_type"] == "stream" else None))
        await asyncio.wait_for(sleeping.wait(), 30)
        began = time.monotonic()
        await k.interrupt()
        ex = await asyncio.wait_for(cell, 30)
        assert ex.error is not None and ex.error["ename"] == "KeyboardInterrupt" and ex.stdout == "sleeping\n"
        assert time.monotonic() - began < 10
        assert (await k.execute("x + 1")).outputs[0]["data"]["text/plain"] == "2"
        await k.restart()
        after = await k.execute("x", timeout=60)
        assert after.error is not None and after.error["ename"] == "NameError"
        await k.shutdown()
        with pytest.raises(NotFound):
            await AsyncKernel.attach(fp, k.id)
        assert await kernels(fp) == []


async def test_a_wrong_token_is_a_typed_refusal_and_starts_nothing(jupyter):
    server = jupyter()
    async with AsyncClient(server.url, "not-the-token") as fp:
        with pytest.raises((Unauthorized, Forbidden)):  # jupyter_server says 403 where the broker says 401
            await AsyncKernel.start(fp, "python3")
    assert server.http.get("/api/kernels").json() == []


def test_the_synchronous_kernel_runs_cells_from_plain_code(jupyter):
    server = jupyter()
    with Client(server.url, server.token) as fp:
        assert "python3" in list_kernelspecs(fp)["kernelspecs"]
        with Kernel.start(fp, "python3") as k:
            assert k.execute("print(6 * 7)").stdout == "42\n"
            assert k.kernel_info()["language_info"]["name"] == "python"
    assert server.http.get("/api/kernels").json() == []
