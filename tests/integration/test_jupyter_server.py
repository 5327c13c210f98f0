"""The Firepool kernel under a real Jupyter server (`python -m jupyter_server`), as JupyterLab, Notebook 7 and
VS Code reach it: REST to start, interrupt, restart and delete kernels, the websocket (`/api/kernels/{id}/channels`,
the JSON protocol) to run code, the server's KernelRestarter when the kernel job dies, and its idle culler.

The kernelspec is installed the way docs/jupyter.md tells users (`firepool kernelspec install --user` with
JUPYTER_DATA_DIR set); the broker is a real `firepool serve` on the local backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from tests.integration.conftest import free_port

pytestmark = pytest.mark.integration

TIMEOUT = 60.0
POOLS = """pools:
  - {name: gpu, gpus: 1, max_count: 2, max_idle_count: 2}
"""
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


class JupyterServer:
    """`python -m jupyter_server` on a free port with a token and its own Jupyter dirs."""

    def __init__(self, root: Path, env: dict[str, str], *options: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_hex(16)
        self.log_path = root / "jupyter-server.log"
        (root / "notebooks").mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "jupyter_server", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
               "--ServerApp.open_browser=False", "--ServerApp.allow_root=True",  # CI runs as root
               "--ServerApp.terminals_enabled=False", f"--ServerApp.root_dir={root / 'notebooks'}", *options]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"token {self.token}"}, timeout=TIMEOUT)
        deadline = time.monotonic() + TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter server exited: {self.log()[-3000:]}")
            try:
                if self.http.get("/api/status", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter server never answered: {self.log()[-3000:]}")
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def channels(self, kernel_id: str) -> Channels:
        url = f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}"
        ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {self.token}"},
                                                 connect_timeout=TIMEOUT))
        return Channels(ws)

    def stop(self) -> int:
        """SIGTERM, as a person's Ctrl-C or a service manager does: the server shuts its kernels down."""
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


class Channels:
    """One websocket to a kernel: send requests on shell/control, read every channel's messages."""

    def __init__(self, ws: WebSocketClientConnection) -> None:
        self.ws = ws
        self.session = uuid.uuid4().hex

    def send(self, channel: str, msg_type: str, content: dict[str, Any]) -> str:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": msg_type, "session": self.session, "username": "test",
                  "version": "5.3", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.ws.write_message(json.dumps({"header": header, "parent_header": {}, "metadata": {},
                                          "content": content, "channel": channel, "buffers": []}))
        return msg_id

    async def recv(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.ws.read_message(), timeout)
        if raw is None:
            raise ConnectionError(f"the server closed the websocket ({self.ws.close_code} {self.ws.close_reason})")
        assert isinstance(raw, str), "the JSON protocol sends text frames"
        msg: dict[str, Any] = json.loads(raw)
        return msg

    async def until(self, match: Any, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The first message `match(msg)` accepts; the ones before it are dropped."""
        deadline = time.monotonic() + timeout
        while True:
            msg = await self.recv(max(0.01, deadline - time.monotonic()))
            if match(msg):
                return msg

    async def ready(self) -> None:
        """kernel_info until it answers (the server may relay the socket before the kernel listens)."""
        msg_id = self.send("shell", "kernel_info_request", {})
        reply = await self.until(lambda m: m["parent_header"].get("msg_id") == msg_id and m["channel"] == "shell")
        assert reply["content"]["status"] == "ok"

    async def execute(self, code: str, timeout: float = TIMEOUT) -> tuple[dict[str, Any], str, dict[str, Any]]:
        """Run `code`; the execute_reply content, the stream text, the execute_result data."""
        msg_id = self.send("shell", "execute_request", {"code": code, "silent": False, "store_history": True,
                                                        "user_expressions": {}, "allow_stdin": False})
        streams: list[str] = []
        result: dict[str, Any] = {}
        reply: dict[str, Any] | None = None
        idle = False
        deadline = time.monotonic() + timeout
        while reply is None or not idle:
            msg = await self.recv(max(0.01, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if msg["channel"] == "shell" and kind == "execute_reply":
                reply = msg["content"]
            elif kind == "stream":
                streams.append(msg["content"]["text"])
            elif kind == "execute_result":
                result.update(msg["content"]["data"])
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
        return reply, "".join(streams), result

    async def close(self) -> None:
        """Close the websocket and wait for the server's close frame (an unawaited close leaks the socket)."""
        self.ws.close()
        with contextlib.suppress(TimeoutError):
            while await asyncio.wait_for(self.ws.read_message(), 10) is not None:
                pass


@pytest.fixture
def broker(broker_factory):
    return broker_factory(pools=POOLS)


@pytest.fixture
def server_env(broker, tmp_path) -> dict[str, str]:
    """alice's broker credentials and Jupyter dirs of its own, with the kernelspecs `fp-test` (a session per
    kernel) and `fp-nb` (a session per notebook) installed in them."""
    env = broker.env("alice") | {
        "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data"), "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime")}
    installs = [subprocess.Popen([sys.executable, "-m", "broker.cli", "kernelspec", "install", "--pool", "gpu",
                                  "--name", name, "--tag", tag, "--user"], env=env, stderr=subprocess.PIPE, text=True)
                for name, tag in (("fp-test", "kernel"), ("fp-nb", "notebook"))]
    for install in installs:
        _, err = install.communicate(timeout=60)
        assert install.returncode == 0, err
    return env


@pytest.fixture
def jupyter(server_env, tmp_path):
    made: list[JupyterServer] = []

    def start(*options: str) -> JupyterServer:
        server = JupyterServer(tmp_path, server_env, *options)
        made.append(server)
        return server

    yield start
    for server in made:
        server.stop()


def jobs(broker, state: str | None = None) -> list[dict[str, Any]]:
    params = {"state": state} if state else None
    listed: list[dict[str, Any]] = broker.client().get("/v1/jobs", params=params).json()["jobs"]
    return listed


def running_kernel_jobs(broker) -> list[dict[str, Any]]:
    return [j for j in jobs(broker, "RUNNING") if j.get("kernel")]


def wait_job(broker, job_id: str, timeout: float = 20.0) -> dict[str, Any]:
    job: dict[str, Any] = broker.client().get(f"/v1/jobs/{job_id}", params={"wait_s": timeout}).json()
    return job


async def sleeping_cell(ch: Channels) -> str:
    """Start a 60 s cell; returns once it runs. (It says when it runs: an interrupt that lands in ipykernel's
    own code just after execute_input is swallowed there, with no reply at all. stop_on_error=False: else
    ipykernel aborts a next request that comes within its abort window after the KeyboardInterrupt.)"""
    msg_id = ch.send("shell", "execute_request", {"code": "import time; print('sleeping', flush=True); "
                                                           "time.sleep(60)", "silent": False, "stop_on_error": False})
    await ch.until(lambda m: m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream")
    return msg_id


async def interrupt(server: JupyterServer, ch: Channels, kernel_id: str, msg_id: str) -> float:
    """POST .../interrupt; the cell ends with KeyboardInterrupt. Returns the seconds it took."""
    began = time.monotonic()
    assert server.http.post(f"/api/kernels/{kernel_id}/interrupt").status_code == 204
    reply = await ch.until(lambda m: m["parent_header"].get("msg_id") == msg_id and m["channel"] == "shell")
    assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
    return time.monotonic() - began


async def server_follows_the_kernel(server: JupyterServer, ch: Channels, kernel_id: str) -> None:
    """The server's own view of the kernel, which its culler goes by, follows the running kernel: busy while
    a cell runs, its last_activity moving on."""
    before = server.http.get(f"/api/kernels/{kernel_id}").json()
    msg_id = await sleeping_cell(ch)
    deadline = time.monotonic() + 20
    while (model := server.http.get(f"/api/kernels/{kernel_id}").json())["execution_state"] != "busy":
        assert time.monotonic() < deadline, f"the server never saw the kernel busy: {before} -> {model}"
        await asyncio.sleep(0.1)
    assert model["last_activity"] > before["last_activity"]
    await interrupt(server, ch, kernel_id, msg_id)


async def job_id_of(ch: Channels) -> str:
    reply, out, _ = await ch.execute("import os; print(os.environ['FIREPOOL_JOB_ID'])")
    assert reply["status"] == "ok", reply
    return out.strip()


async def test_a_kernel_of_a_jupyter_server_runs_interrupts_restarts_and_shuts_down_over_rest_and_websocket(
        broker, jupyter) -> None:
    server = jupyter()
    r = server.http.post("/api/kernels", json={"name": "fp-test"})
    assert r.status_code == 201, r.text
    kernel_id = r.json()["id"]
    ch = await server.channels(kernel_id)
    try:
        await ch.ready()
        reply, out, result = await ch.execute(
            "import os\nopen('from-server.txt', 'w').write('kept')\nx = 6 * 7\nprint(os.getcwd())\nx")
        assert reply["status"] == "ok" and out == "/workspace\n" and result["text/plain"] == "42"
        # The server hands its whole environment to the kernel manager: its broker token stays on this side.
        _, out, _ = await ch.execute("print(sorted(k for k in os.environ if k.startswith('FIREPOOL_')))\n"
                                     "print(os.environ.get('JUPYTER_DATA_DIR'))")
        assert "FIREPOOL_TOKEN" not in out and "FIREPOOL_CALLER" in out and out.endswith("None\n")
        assert broker.tokens["alice"] not in out
        first = wait_job(broker, await job_id_of(ch), 0)
        assert first["state"] == "RUNNING" and first["kernel"] and first["lease_tag"] == f"kernel:{kernel_id}"

        # Interrupt over REST: a sleeping cell stops with KeyboardInterrupt, the kernel and its state survive.
        assert await interrupt(server, ch, kernel_id, await sleeping_cell(ch)) < 5.0
        reply, out, _ = await ch.execute("print(x)")
        assert reply["status"] == "ok" and out == "42\n", (reply, out)

        # Restart over REST: a new kernel job of the same session on the same warm sandbox. The front end
        # reconnects its websocket (as JupyterLab does: the kernel's ports and key changed).
        r = server.http.post(f"/api/kernels/{kernel_id}/restart")
        assert r.status_code == 200, r.text
        await ch.close()
        ch = await server.channels(kernel_id)
        await ch.ready()
        second = wait_job(broker, await job_id_of(ch), 0)
        assert second["id"] != first["id"] and second["lease_tag"] == first["lease_tag"]
        assert second["bound_pods"] == first["bound_pods"] and second["acquisition"][0]["path"] == "warm"
        assert wait_job(broker, first["id"])["state"] in TERMINAL
        reply, out, _ = await ch.execute("print(open('from-server.txt').read())\nx")
        assert out == "kept\n" and reply["status"] == "error" and reply["ename"] == "NameError"
        assert [j["id"] for j in running_kernel_jobs(broker)] == [second["id"]]
        await server_follows_the_kernel(server, ch, kernel_id)
    finally:
        await ch.close()

    # DELETE: the kernel job ends and nothing of it is left running in the broker.
    assert server.http.delete(f"/api/kernels/{kernel_id}").status_code == 204
    assert wait_job(broker, second["id"])["state"] == "SUCCEEDED"
    assert running_kernel_jobs(broker) == []
    assert server.http.get("/api/kernels").json() == []


async def test_a_kernel_job_cancelled_in_the_broker_is_restarted_by_the_servers_restarter(broker, jupyter) -> None:
    server = jupyter()
    kernel_id = server.http.post("/api/kernels", json={"name": "fp-test"}).json()["id"]
    ch = await server.channels(kernel_id)
    try:
        await ch.ready()
        await ch.execute("open('before-cancel.txt', 'w').write('kept'); y = 1")
        first = await job_id_of(ch)
        assert broker.client().post(f"/v1/jobs/{first}/cancel").status_code == 200
        assert wait_job(broker, first)["state"] in TERMINAL

        # The server notices (KernelRestarter polls the provisioner), tells the websocket `restarting`, and
        # starts a new kernel job; the front end reconnects, as JupyterLab does on `restarting`.
        status = await ch.until(lambda m: m["msg_type"] == "status"
                                and m["content"]["execution_state"] in ("restarting", "dead"))
        assert status["content"]["execution_state"] == "restarting"
        await ch.close()
        ch = await server.channels(kernel_id)
        await ch.ready()
        second = await job_id_of(ch)
        assert second != first
        reply, out, _ = await ch.execute("print(open('before-cancel.txt').read())\ny")
        assert out == "kept\n" and reply["ename"] == "NameError"
        assert [j["id"] for j in running_kernel_jobs(broker)] == [second]
        await server_follows_the_kernel(server, ch, kernel_id)
    finally:
        await ch.close()
    assert server.http.delete(f"/api/kernels/{kernel_id}").status_code == 204
    assert wait_job(broker, second)["state"] == "SUCCEEDED"


async def test_the_servers_culler_and_its_shutdown_end_their_kernel_jobs(broker, jupyter) -> None:
    server = jupyter("--MappingKernelManager.cull_idle_timeout=4", "--MappingKernelManager.cull_interval=1")
    kept = server.http.post("/api/kernels", json={"name": "fp-test"}).json()["id"]
    ch = await server.channels(kept)  # a connected kernel is not culled (cull_connected=False)
    try:
        await ch.ready()
        culled = server.http.post("/api/kernels", json={"name": "fp-test"}).json()["id"]
        deadline = time.monotonic() + TIMEOUT
        while culled in [k["id"] for k in server.http.get("/api/kernels").json()]:
            assert time.monotonic() < deadline, "the idle kernel was never culled"
            await asyncio.sleep(0.2)
        running = running_kernel_jobs(broker)
        assert [j["lease_tag"] for j in running] == [f"kernel:{kept}"], running
    finally:
        await ch.close()

    # Stopping the server (SIGTERM) shuts its kernels down: each kernel job ends as the kernel exits.
    assert server.stop() == 0
    ended = {j["lease_tag"]: wait_job(broker, j["id"])["state"] for j in jobs(broker) if j.get("kernel")}
    assert ended == {f"kernel:{culled}": "SUCCEEDED", f"kernel:{kept}": "SUCCEEDED"}


async def test_reopening_a_notebook_through_the_sessions_api_lands_on_its_warm_sandbox(broker, jupyter,
                                                                                      tmp_path) -> None:
    server = jupyter()
    (tmp_path / "notebooks" / "work").mkdir()
    model = {"path": "work/a.ipynb", "name": "a.ipynb", "type": "notebook", "kernel": {"name": "fp-nb"}}
    found: list[dict[str, Any]] = []
    for _ in range(2):  # open the notebook, write a file, close it (its kernel shuts down), open it again
        r = server.http.post("/api/sessions", json=model)
        assert r.status_code == 201, r.text
        session = r.json()
        ch = await server.channels(session["kernel"]["id"])
        try:
            await ch.ready()
            reply, out, _ = await ch.execute("import os; print(os.path.exists('notes.txt'))\n"
                                             "open('notes.txt', 'w').write('kept')")
            assert reply["status"] == "ok"
            found.append({"exists": out.strip(), **wait_job(broker, await job_id_of(ch), 0)})
        finally:
            await ch.close()
        assert server.http.delete(f"/api/sessions/{session['id']}").status_code == 204
        assert wait_job(broker, found[-1]["id"])["state"] == "SUCCEEDED"
    first, second = found
    assert first["lease_tag"] == second["lease_tag"] == f"notebook:{tmp_path / 'notebooks' / 'work' / 'a.ipynb'}"
    assert first["exists"] == "False" and second["exists"] == "True"
    assert second["bound_pods"] == first["bound_pods"] and second["acquisition"][0]["path"] == "warm"
    assert running_kernel_jobs(broker) == []
