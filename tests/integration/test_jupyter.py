"""The Firepool kernel through jupyter_client's AsyncKernelManager and nbclient, against a real broker.

The kernelspec is installed the way a user installs it (`firepool kernelspec install --user` with
JUPYTER_DATA_DIR set); the kernel is an ipykernel in a bubblewrap sandbox of the local backend.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60
# gpu: the default isolated network (the kernel's ports are forwarded from the host's 127.0.0.1);
# cpu: the host's network, where the kernel binds 127.0.0.1 itself (docs/jupyter.md). Both paths are run.
SLEEPING_CELL = "import time; print('sleeping', flush=True); time.sleep(60)"
"""A cell that says when it runs: an interrupt sent on its execute_input may land in ipykernel's own code
before the cell starts, which swallows the KeyboardInterrupt and sends no reply at all. It is sent with
stop_on_error=False: else ipykernel aborts a next request that comes within its abort window."""
POOLS = """pools:
  - {name: cpu, max_count: 4, template: {network: host}}
  - {name: gpu, gpus: 1, max_count: 2, max_idle_count: 2}
"""


@pytest.fixture
def broker(broker_factory):
    return broker_factory(pools=POOLS)


@pytest.fixture
def jupyter_env(broker, tmp_path, monkeypatch):
    """The broker, alice's credentials in the environment, and kernelspecs `fp-test` for the gpu pool
    (isolated network) and `fp-host` for the cpu pool (host network)."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    use(broker, monkeypatch, "alice")
    for pool, name in (("gpu", "fp-test"), ("cpu", "fp-host")):
        r = subprocess.run([sys.executable, "-m", "broker.cli", "kernelspec", "install", "--pool", pool,
                            "--name", name, "--user"], env=broker.env("alice") | {
                                "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data")},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    return broker


def use(broker, monkeypatch, caller: str) -> None:
    monkeypatch.setenv("FIREPOOL_URL", broker.url)
    monkeypatch.setenv("FIREPOOL_TOKEN", broker.tokens[caller])


async def start(name: str = "fp-test") -> tuple[AsyncKernelManager, Any]:
    km = AsyncKernelManager(kernel_name=name)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=TIMEOUT)
    return km, kc


async def run(kc: Any, code: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """Execute `code`; returns the reply content, the stream text and the execute_result data."""
    streams: list[str] = []
    result: dict[str, Any] = {}

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            streams.append(msg["content"]["text"])
        elif msg["msg_type"] == "execute_result":
            result.update(msg["content"]["data"])

    reply = await kc.execute_interactive(code, output_hook=hook, timeout=TIMEOUT)
    return reply["content"], "".join(streams), result


def job_of(broker, km: AsyncKernelManager, caller: str = "alice") -> dict[str, Any]:
    job_id = km.provisioner.job_id  # type: ignore[union-attr]
    assert job_id
    return broker.client(caller).get(f"/v1/jobs/{job_id}").json()


async def test_kernel_starts_executes_interrupts_restarts_warm_and_shuts_down_to_a_held_pod(jupyter_env) -> None:
    broker = jupyter_env
    km, kc = await start()
    try:
        first = job_of(broker, km)
        assert first["state"] == "RUNNING" and first["kernel"] is True and first["pool"] == "gpu"
        pod = first["bound_pods"][0]

        reply, out, result = await run(kc, "import os\nx = 6 * 7\nprint('hello', x)\nx")
        assert reply["status"] == "ok" and out == "hello 42\n" and result["text/plain"] == "42"

        # What the kernel sees: its GPU, the session workspace, the verified caller; never the token.
        reply, out, _ = await run(kc, "import json; print(json.dumps({'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'),"
                                      " 'cwd': os.getcwd(), 'caller': os.environ.get('FIREPOOL_CALLER'),"
                                      " 'env': dict(os.environ)}))")
        seen = __import__("json").loads(out)
        assert seen["cuda"] in ("0", "1") and seen["cwd"] == "/workspace" and seen["caller"] == "alice"
        assert broker.tokens["alice"] not in out and "FIREPOOL_TOKEN" not in seen["env"]

        # Interrupt a long cell: KeyboardInterrupt within 2 s, the kernel (and its state) survive.
        msg_id = kc.execute(SLEEPING_CELL, stop_on_error=False)
        while True:  # wait until the cell runs
            msg = await kc.get_iopub_msg(timeout=TIMEOUT)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                break
        began = time.monotonic()
        await km.interrupt_kernel()
        reply = await kc._async_get_shell_msg(timeout=10)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = await kc._async_get_shell_msg(timeout=10)
        interrupted_in = time.monotonic() - began
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert interrupted_in < 2.0, interrupted_in
        _, out, _ = await run(kc, "print(x)")
        assert out == "42\n"

        # Restart: a new kernel job with the same tag on the same (warm) sandbox; the state is gone.
        kc.stop_channels()
        await km.restart_kernel()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=TIMEOUT)
        second = job_of(broker, km)
        assert second["id"] != first["id"] and second["lease_tag"] == first["lease_tag"]
        assert second["bound_pods"] == [pod] and second["acquisition"][0]["path"] == "warm"
        assert broker.client().get(f"/v1/jobs/{first['id']}").json()["state"] in ("SUCCEEDED", "FAILED")
        reply, _, _ = await run(kc, "x")
        assert reply["status"] == "error" and reply["ename"] == "NameError"
    finally:
        kc.stop_channels()
        job_id = km.provisioner.job_id if km.provisioner else None
        await km.shutdown_kernel()

    # Shutdown: the kernel job ends, the pod goes back held for its owner.
    final = broker.client().get(f"/v1/jobs/{job_id}", params={"wait_s": 10}).json()
    assert final["state"] == "SUCCEEDED", final
    deadline = time.monotonic() + 10
    while True:
        view = next(p for p in broker.client().get("/v1/pods").json()["pods"] if p["name"] == pod)
        if view["state"] == "idle" or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert view["state"] == "idle" and view["caller"] == "alice" and view["held"], view


async def test_a_second_callers_kernel_never_lands_on_the_first_callers_sandbox(jupyter_env, monkeypatch) -> None:
    broker = jupyter_env
    km, kc = await start()
    alice_pod = job_of(broker, km)["bound_pods"][0]
    kc.stop_channels()
    await km.shutdown_kernel()

    use(broker, monkeypatch, "bob")
    km, kc = await start()
    try:
        bob_job = job_of(broker, km, "bob")
        assert bob_job["caller"] == "bob" and bob_job["bound_pods"][0] != alice_pod
        assert bob_job["acquisition"][0]["path"] != "warm"
        _, out, _ = await run(kc, "import os; print(os.environ['FIREPOOL_CALLER'])")
        assert out == "bob\n"
    finally:
        kc.stop_channels()
        await km.shutdown_kernel()


async def test_a_kernel_of_an_unknown_pool_fails_to_start_with_the_brokers_error(jupyter_env, tmp_path) -> None:
    from broker.errors import UnknownPool
    from jupyter_ext import kernelspec

    kernelspec.install(kernelspec.kernel_json("nope", url=jupyter_env.url), "fp-nope", user=True)
    km = AsyncKernelManager(kernel_name="fp-nope")
    with pytest.raises(UnknownPool):
        await km.start_kernel()


@pytest.mark.parametrize(("kernel", "pool"), [("fp-test", "gpu"), ("fp-host", "cpu")], ids=["isolated", "host"])
def test_nbclient_runs_the_example_notebook_end_to_end(jupyter_env, kernel: str, pool: str) -> None:
    nb = nbformat.read(ROOT / "examples" / "notebook.ipynb", as_version=4)
    NotebookClient(nb, kernel_name=kernel, timeout=120).execute()
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                   for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs)
    assert f"pool: {pool}" in text and "caller: alice" in text and "acquisition:" in text
    errors = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == "error"]
    assert errors == []


async def test_a_restarted_server_reattaches_to_the_running_kernel_job_from_provisioner_info(jupyter_env) -> None:
    import json

    from jupyter_client.provisioning import KernelProvisionerFactory

    broker = jupyter_env
    km, kc = await start()
    await run(kc, "x = 'kept'")
    saved = json.loads(json.dumps(await km.provisioner.get_provisioner_info()))  # type: ignore[union-attr]
    job_id = saved["job_id"]
    kc.stop_channels()
    await km.provisioner._close()  # type: ignore[union-attr] - the old server is gone
    km.context.destroy(linger=100)

    again = AsyncKernelManager(kernel_name="fp-test")
    again.kernel_id = saved["kernel_id"]
    again.provisioner = KernelProvisionerFactory.instance().create_provisioner_instance(
        saved["kernel_id"], again.kernel_spec, parent=again)
    await again.provisioner.load_provisioner_info(saved)
    again.load_connection_info(again.provisioner.connection_info)
    assert again.provisioner.job_id == job_id and await again.is_alive()
    kc = again.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=TIMEOUT)
        _, out, _ = await run(kc, "print(x)")
        assert out == "kept\n"
    finally:
        kc.stop_channels()
        await again.shutdown_kernel()
    assert broker.client().get(f"/v1/jobs/{job_id}", params={"wait_s": 10}).json()["state"] == "SUCCEEDED"


async def test_a_listener_without_the_kernels_keys_cannot_read_its_output(jupyter_env) -> None:
    import zmq
    import zmq.asyncio

    km, kc = await start()
    info = km.get_connection_info()
    assert info.get("curve_publickey") and info.get("curve_secretkey")
    ctx = zmq.asyncio.Context()
    url = f"tcp://{info['ip']}:{info['iopub_port']}"
    stranger = ctx.socket(zmq.SUB)  # e.g. a host process, or a job on a host-network pod: it reaches the port
    stranger.setsockopt(zmq.SUBSCRIBE, b"")
    stranger.connect(url)
    keyed = ctx.socket(zmq.SUB)  # the same listener with the kernel's keys: it does hear
    keyed.curve_secretkey = info["curve_secretkey"].encode()
    keyed.curve_publickey = info["curve_publickey"].encode()
    keyed.curve_serverkey = info["curve_publickey"].encode()
    keyed.setsockopt(zmq.SUBSCRIBE, b"")
    keyed.connect(url)
    try:
        await asyncio.sleep(0.5)  # let both subscriptions reach the kernel
        for _ in range(3):
            await run(kc, "print('secret output')")
        heard = b"".join([b"".join(await keyed.recv_multipart()) for _ in range(3)])
        assert b"status" in heard or b"secret output" in heard
        assert await stranger.poll(500) == 0
    finally:
        stranger.close(0)
        keyed.close(0)
        ctx.term()
        kc.stop_channels()
        await km.shutdown_kernel()


async def test_sigint_through_the_broker_interrupts_a_cell_and_kill_ends_the_kernel_job(jupyter_env) -> None:
    import signal

    broker = jupyter_env
    km, kc = await start()
    try:
        msg_id = kc.execute(SLEEPING_CELL, stop_on_error=False)
        while True:
            msg = await kc.get_iopub_msg(timeout=TIMEOUT)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                break
        began = time.monotonic()
        await km.signal_kernel(signal.SIGINT)  # what a front end in signal interrupt mode does
        reply = await kc._async_get_shell_msg(timeout=10)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = await kc._async_get_shell_msg(timeout=10)
        # Prompt, not the 60 s cell's end: 5 s leaves room for 2 busy cores (parallel workers).
        assert reply["content"]["ename"] == "KeyboardInterrupt" and time.monotonic() - began < 5.0
        job_id = km.provisioner.job_id  # type: ignore[union-attr]
        await km.provisioner.kill()  # type: ignore[union-attr]
        job = broker.client().get(f"/v1/jobs/{job_id}", params={"wait_s": 10}).json()
        assert job["state"] == "FAILED" and job["exit_code"] == 137, job
        assert await km.provisioner.wait() == 137  # type: ignore[union-attr]
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
