"""B12 and B17 "one door": kernels, ports and terminals of a sandbox reached through the broker's own HTTP endpoint.

A broker on the local backend, its pool `kern` with `kernels: prestart` (as a pool that serves kernels is
configured), and `web` (`network: host`, so a sandbox's server is also reachable directly for the
baseline). Same run, interleaved round by round:

- kernel start -> kernel_info answered: through the broker's Jupyter gateway with the SDK's kernel client
  (`broker.kernel_client`: `POST /api/kernels`, the websocket, kernel_info), through the Jupyter provisioner
  (jupyter_client's AsyncKernelManager with the Firepool kernelspec, ZeroMQ to the sandbox), and a local
  ipykernel (the stock `python3` kernelspec). Each Firepool path has its own session, so its own warm pod;
  every start waits first until the pool's pods have their pre-started kernel ready.
- execute round trip `x + 1` through the gateway (execute_request -> reply and idle), and a local ipykernel's
  over ZeroMQ.
- through a real `jupyter_server --gateway-url=<broker>` and a local `jupyter_server`: POST /api/kernels,
  restart and DELETE (shutdown_kernel) wall times, and the execute round trip through the gateway-mode
  server's websocket (the issue's 48 ms was a Nagle stall per message on that path).
- a 10 MB download through the port proxy vs directly, and a PTY echo round trip (bench/one_door_streams.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import one_door_streams as streams
from bench.broker_proc import BenchBroker
from bench.common import Row, at_least, at_most, environment, median, percentile, report

TAG = "bench-one-door"
POOLS = """
pools:
  - name: kern
    gpus: 0
    max_count: 4
    kernels: prestart
  - name: web
    gpus: 0
    max_count: 1
    template: {network: host}
  - name: cpu
    gpus: 0
    max_count: 2
"""
SPEC = "firepool-kern"


class JupyterServer:
    """`python -m jupyter_server` on a free port with a token, its own dirs, and `options`."""

    def __init__(self, home: Path, env: dict[str, str], *options: str) -> None:
        self.port = streams._free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_hex(16)
        root = home / f"jupyter-{self.port}"
        root.mkdir(parents=True)
        cmd = [sys.executable, "-m", "jupyter_server", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}", "--ServerApp.open_browser=False",
               "--ServerApp.allow_root=True", "--ServerApp.terminals_enabled=False", f"--ServerApp.root_dir={root}",
               "--ServerApp.log_level=WARN", *options]
        self.log = open(root / "server.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"token {self.token}"}, timeout=120)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter_server exited: {(root / 'server.log').read_text()[-2000:]}")
            try:
                if self.http.get("/api/status", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("jupyter_server never answered")
            time.sleep(0.1)

    def timed(self, method: str, path: str, **kw: Any) -> tuple[float, httpx.Response]:
        began = time.perf_counter()
        response = self.http.request(method, path, **kw)
        took = time.perf_counter() - began
        response.raise_for_status()
        return took, response

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


async def _pods_ready(state_dir: Path, client: httpx.Client, timeout_s: float = 30.0) -> None:
    """Every pod of `kern` not running a kernel is idle with its pre-started kernel imported (as an idle pool
    has it): a pod still starting or resetting is waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        pods = [p for p in client.get("/v1/pods", params={"pool": "kern"}).json()["pods"]
                if p["state"] not in ("running", "assigned", "retiring", "gone")]
        if all(p["state"] == "idle" for p in pods) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    for pod in pods:
        if pod["state"] == "idle":
            await _prestart_ready(state_dir, pod["name"])


async def _prestart_ready(state_dir: Path, pod: str, timeout_s: float = 30.0) -> None:
    """Until the idle pod's pre-started kernel process has finished importing (its agent's /healthz)."""
    from broker.backends.sandboxing import PodDirs
    from broker.running.agent_http import HttpAgentClient

    dirs = PodDirs(state_dir / "pods" / pod)
    secret = json.loads(dirs.record.read_text())["secret"]
    fd = os.open(dirs.run, os.O_PATH | os.O_DIRECTORY)
    agent = HttpAgentClient(f"unix:{dirs.socket}", secret, uds_path=f"/proc/self/fd/{fd}/agent.sock")
    deadline = time.monotonic() + timeout_s
    try:
        while not (await agent.health()).info.get("kernel_prestart", {}).get("ready"):
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.02)
    finally:
        await agent.close()
        os.close(fd)


async def _zmq_rtts(kc: Any, n: int) -> list[float]:
    await _zmq_execute(kc, "x = 1")
    return [await _zmq_execute(kc, "x + 1") for _ in range(n)]


async def _zmq_execute(kc: Any, code: str) -> float:
    began = time.perf_counter()
    msg_id = kc.execute(code, store_history=False)
    while (await kc._async_get_shell_msg(timeout=30))["parent_header"].get("msg_id") != msg_id:
        pass
    return time.perf_counter() - began


async def _sdk_rtts(k: Any, n: int) -> list[float]:
    await k.execute("x = 1")
    out = []
    for _ in range(n):
        began = time.perf_counter()
        ex = await k.execute("x + 1", store_history=False)
        out.append(time.perf_counter() - began)
        assert ex.status == "ok", ex.error
    return out


async def _starts(found: dict[str, Any], rounds: int, executes: int, broker: BenchBroker, client: httpx.Client,
                  state_dir: Path) -> None:
    from bench.jupyter import _start, _stop
    from broker.client import AsyncClient
    from broker.kernel_client import AsyncKernel
    from jupyter_ext import kernelspec

    kernelspec.install(kernelspec.kernel_json("kern", url=broker.url, lease_tag=TAG + "-prov"), "fp-one-door",
                       user=True)
    env = {"KERNEL_FIREPOOL_SESSION": TAG + "-gw"}
    async with AsyncClient(broker.url, broker.tokens["bench"]) as fp:
        await (await AsyncKernel.start(fp, SPEC, env=env)).shutdown()  # makes the pods
        await _stop(*(await _start("fp-one-door"))[:2])
        await _stop(*(await _start("python3"))[:2])
        for i in range(rounds):
            await _pods_ready(state_dir, client)
            began = time.perf_counter()
            k = await AsyncKernel.start(fp, SPEC, env=env)
            found["gateway_start"].append(time.perf_counter() - began)
            if i == rounds - 1:
                found["gateway_rtt"] = await _sdk_rtts(k, executes)
            began = time.perf_counter()
            await k.shutdown()
            found["sdk_shutdown"].append(time.perf_counter() - began)
            await _pods_ready(state_dir, client)
            km, kc, took = await _start("fp-one-door")
            found["provisioner_start"].append(took)
            await _stop(km, kc)
            km, kc, took = await _start("python3")
            found["local_start"].append(took)
            if i == rounds - 1:
                found["local_rtt"] = await _zmq_rtts(kc, executes)
            await _stop(km, kc)


async def _through_servers(found: dict[str, Any], rounds: int, executes: int, gw: JupyterServer,
                           local: JupyterServer, state_dir: Path, client: httpx.Client) -> None:
    from broker.client import AsyncClient
    from broker.kernel_client import AsyncKernel

    for i in range(rounds):
        for label, server, name in (("gw", gw, SPEC), ("local", local, "python3")):
            if label == "gw":
                await _pods_ready(state_dir, client)
            took, response = await asyncio.to_thread(server.timed, "POST", "/api/kernels", json={"name": name})
            found[f"js_{label}_start"].append(took)
            kid = response.json()["id"]
            async with AsyncClient(server.url, server.token) as via:
                k = await AsyncKernel.attach(via, kid)
                await k.connect()
                await k.kernel_info(timeout=120)
                if label == "gw" and i == rounds - 1:
                    found["js_gw_rtt"] = await _sdk_rtts(k, executes)
                if label == "gw":
                    await _pods_ready(state_dir, client)
                took, _ = await asyncio.to_thread(server.timed, "POST", f"/api/kernels/{kid}/restart")
                found[f"js_{label}_restart"].append(took)
                await k.kernel_info(timeout=120)
                await k.close()
            took, _ = await asyncio.to_thread(server.timed, "DELETE", f"/api/kernels/{kid}")
            found[f"js_{label}_shutdown"].append(took)


def _measure(rounds: int, executes: int, transfers: int, broker: BenchBroker, home: Path) -> dict[str, Any]:
    found: dict[str, Any] = {k: [] for k in (
        "gateway_start", "provisioner_start", "local_start", "sdk_shutdown", "gateway_rtt", "local_rtt",
        "js_gw_start", "js_gw_restart", "js_gw_shutdown", "js_local_start", "js_local_restart",
        "js_local_shutdown", "js_gw_rtt")}
    state_dir = broker.dir / "state"
    with broker.client() as client:
        asyncio.run(_starts(found, rounds, executes, broker, client, state_dir))
        env = {**os.environ, "KERNEL_FIREPOOL_SESSION": TAG + "-js"}
        gw = JupyterServer(home, env, f"--gateway-url={broker.url}",
                           f"--GatewayClient.auth_token={broker.tokens['bench']}")
        local = JupyterServer(home, dict(os.environ))
        try:
            asyncio.run(_through_servers(found, rounds, executes, gw, local, state_dir, client))
        finally:
            gw.stop()
            local.stop()
        figures = streams.StreamFigures()
        owners = streams.helper("bench.port_proxy") is not None
        # The sandbox's server job keeps the session live for the terminal; it is the proxy's baseline unless
        # the port proxy's own helper is here to measure.
        job = streams.ports(client, "web", TAG + "-web", 0 if owners else transfers, figures)
        try:
            if owners and not figures.ports_missing:
                try:
                    streams.owners_ports(broker, transfers, figures)
                except Exception as exc:  # noqa: BLE001 - one part failing costs its rows, not the run
                    figures.ports_missing = f"failed: {exc!r}"[:200]
            try:
                streams.terminal(broker.url, broker.tokens["bench"], TAG + "-web", executes, figures)
            except Exception as exc:  # noqa: BLE001 - as above
                figures.terminal_missing = f"failed: {exc!r}"[:200]
        finally:
            client.post(f"/v1/jobs/{job}/cancel")
        found["streams"] = figures.__dict__
    return found


def _rows(found: dict[str, Any]) -> list[Row]:
    ms = 1000.0
    gw, prov, local = (median(found[k]) for k in ("gateway_start", "provisioner_start", "local_start"))
    rtt = percentile(found["gateway_rtt"], 50) * ms
    js = {k: median(found[f"js_{k}"]) * ms for k in (
        "gw_start", "gw_restart", "gw_shutdown", "local_start", "local_restart", "local_shutdown")}
    js_rtt = percentile(found["js_gw_rtt"], 50) * ms
    rows = [
        Row("B12", f"kernel start -> kernel_info through the gateway (SDK), median of {len(found['gateway_start'])}",
            gw, "s", "-", "<= 0.25 s", at_most(gw, 0.25)),
        Row("B12", "gateway / provisioner path (same run)", gw / prov, "x", "-", "<= 1.5x", at_most(gw / prov, 1.5)),
        Row("B12", "provisioner path (AsyncKernelManager, ZeroMQ to the sandbox), median", prov, "s", "-"),
        Row("B12", "local ipykernel, median (same run)", local, "s", "-"),
        Row("B12", f"execute round trip `x + 1` through the gateway p50 ({len(found['gateway_rtt'])} calls)", rtt,
            "ms", "-", "<= 10 ms", at_most(rtt, 10)),
        Row("B12", "execute round trip through the gateway p90", percentile(found["gateway_rtt"], 90) * ms, "ms", "-"),
        Row("B12", "local ipykernel execute round trip p50 (ZeroMQ, same run)",
            percentile(found["local_rtt"], 50) * ms, "ms", "-"),
        Row("B12", "SDK shutdown (DELETE /api/kernels/{id}), median", median(found["sdk_shutdown"]) * ms, "ms", "-"),
        Row("B12", "jupyter_server --gateway-url: POST /api/kernels, median", js["gw_start"], "ms",
            "172 ms (EG 321, local 382)"),
        Row("B12", "jupyter_server local kernel: POST /api/kernels, median", js["local_start"], "ms", "382 ms"),
        Row("B12", "jupyter_server --gateway-url: restart, median", js["gw_restart"], "ms", "401 ms (local 109-127)",
            "<= local or 130", at_most(js["gw_restart"], max(130.0, js["local_restart"]))),
        Row("B12", "jupyter_server local kernel: restart, median", js["local_restart"], "ms", "109-127 ms"),
        Row("B12", "jupyter_server --gateway-url: shutdown_kernel (DELETE), median", js["gw_shutdown"], "ms",
            "319 ms (local 112)", "<= local or 112", at_most(js["gw_shutdown"], max(112.0, js["local_shutdown"]))),
        Row("B12", "jupyter_server local kernel: shutdown_kernel (DELETE), median", js["local_shutdown"], "ms",
            "112 ms"),
        Row("B12", "execute round trip through jupyter_server --gateway-url p50", js_rtt, "ms",
            "48 ms (4.7 with QUICKACK)", "<= 10 ms", at_most(js_rtt, 10)),
    ]
    return rows + _stream_rows(found["streams"])


def _stream_rows(s: dict[str, Any]) -> list[Row]:
    rows = []
    if s["ports_missing"]:
        rows.append(Row("B17", f"10 MB through the port proxy: not available ({s['ports_missing'][:120]})", None,
                        "", "-"))
    else:
        mb = streams.BLOB_BYTES / 1e6
        proxy, direct = mb / median(s["proxy_s"]), mb / median(s["direct_s"])
        rows += [Row("B17", f"10 MB through the port proxy / {s['direct_what']} (median of "
                     f"{len(s['proxy_s'])})", proxy / direct, "x", "-", ">= 0.5x", at_least(proxy / direct, 0.5)),
                 Row("B17", "10 MB through the port proxy", proxy, "MB/s", "-"),
                 Row("B17", f"10 MB {s['direct_what']}", direct, "MB/s", "-")]
    if s["terminal_missing"]:
        rows.append(Row("B17", f"PTY echo round trip: not available ({s['terminal_missing'][:120]})", None, "",
                        "-"))
    else:
        pty = s["pty_ms"]
        rows += [Row("B17", f"PTY echo round trip p50 ({pty['n']:.0f} keys)", pty["p50_ms"], "ms", "-", "<= 10 ms",
                     at_most(pty["p50_ms"], 10)),
                 Row("B17", "PTY echo round trip p90", pty["p90_ms"], "ms", "-")]
    return rows


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench one-door", description=__doc__)
    parser.add_argument("--rounds", type=int, default=10, help="kernel starts per path (interleaved)")
    parser.add_argument("--executes", type=int, default=200, help="execute round trips and PTY echoes")
    parser.add_argument("--transfers", type=int, default=5, help="10 MB downloads per path")
    args = parser.parse_args(argv)
    with BenchBroker(pools=POOLS) as broker, tempfile.TemporaryDirectory() as home, \
            environment({"FIREPOOL_URL": broker.url, "FIREPOOL_TOKEN": broker.tokens["bench"],
                         "JUPYTER_DATA_DIR": os.path.join(home, "data"),
                         "JUPYTER_CONFIG_DIR": os.path.join(home, "config"),
                         "JUPYTER_RUNTIME_DIR": os.path.join(home, "runtime")}):
        found = _measure(args.rounds, args.executes, args.transfers, broker, Path(home))
    return report("one_door", _rows(found), json_out=json_out, extra={"raw": found})
