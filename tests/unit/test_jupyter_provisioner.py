"""The Jupyter pieces that need no broker: kernel.json, the connection info, tags, env and persistence."""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import httpx
import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.provisioning import KernelProvisionerFactory

from broker.client import AsyncClient
from broker.errors import InvalidRequest
from broker.retrying import NO_RETRY
from firepool_agent import kernel as launcher
from firepool_agent import kernel_report
from jupyter_ext import kernelspec
from jupyter_ext.provisioner import (
    FirepoolProvisioner,
    KernelStartError,
    parse_connection,
    session_tag,
)


def find_connection(line: bytes) -> Any:
    """The launcher's report as the agent parses it, then as the provisioner loads what the broker served."""
    raw = kernel_report.parse(line)
    return None if raw is None else parse_connection(raw)

INFO = {"ip": "127.0.0.1", "transport": "tcp", "shell_port": 1, "iopub_port": 2, "stdin_port": 3,
        "control_port": 4, "hb_port": 5, "signature_scheme": "hmac-sha256", "key": "k" * 64, "pid": 7}


def test_kernel_json_names_the_firepool_provisioner_with_pool_and_url_and_message_interrupts() -> None:
    spec = kernelspec.kernel_json("h200", url="http://broker:8321", display_name="Firepool GPU (H200)")
    assert spec["interrupt_mode"] == "message" and spec["display_name"] == "Firepool GPU (H200)"
    prov = spec["metadata"]["kernel_provisioner"]
    assert prov["provisioner_name"] == "firepool"
    assert prov["config"] == {"pool": "h200", "url": "http://broker:8321", "lease_tag": "kernel", "ip": "127.0.0.1"}
    assert "token" not in json.dumps(spec).lower()


def test_installed_kernelspec_resolves_to_the_firepool_provisioner(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path))
    kernelspec.install(kernelspec.kernel_json("gpu", url="http://x"), "fp-gpu", user=True)
    spec = KernelSpecManager().get_kernel_spec("fp-gpu")
    assert spec.display_name == "Firepool GPU (gpu)" and spec.interrupt_mode == "message"
    prov = KernelProvisionerFactory.instance().create_provisioner_instance("kid", spec, parent=None)
    assert isinstance(prov, FirepoolProvisioner) and prov.pool == "gpu" and prov.url == "http://x"


def test_bad_kernel_names_and_missing_pool_are_typed_errors(tmp_path) -> None:
    with pytest.raises(InvalidRequest):
        kernelspec.install(kernelspec.kernel_json("cpu", url="u"), "Bad Name", prefix=str(tmp_path))
    with pytest.raises(InvalidRequest):
        kernelspec.kernel_json("", url="u")


def test_connection_line_round_trips_with_the_key_as_bytes() -> None:
    line = launcher.connection_line(INFO)
    assert line.startswith(b"{") and line.endswith(b"\n")
    info = find_connection(line + b"more\n")
    assert info is not None and info["key"] == b"k" * 64 and info["shell_port"] == 1
    assert "pid" not in info


def test_curve_keys_travel_as_text_beside_the_bytes_key() -> None:
    keys = launcher.curve_keys()
    assert len(keys["curve_publickey"]) == 40 and keys["curve_publickey"] != keys["curve_secretkey"]
    info = find_connection(launcher.connection_line({**INFO, **keys}))
    assert info is not None and info["curve_secretkey"] == keys["curve_secretkey"] and info["key"] == b"k" * 64


def test_a_partial_or_garbled_report_is_not_a_connection() -> None:
    line = launcher.connection_line(INFO)
    assert find_connection(line[:-5]) is None
    assert find_connection(b"echo " + line) is None
    assert kernel_report.parse(launcher.connection_line({"ip": "1.2.3.4", "key": "k"})) is None


def test_connection_info_without_ports_fails_the_start() -> None:
    with pytest.raises(KernelStartError):
        parse_connection({"ip": "1.2.3.4", "key": "k"})


def test_session_tag_is_the_kernel_id_or_the_notebook_path() -> None:
    assert session_tag("kernel", "abc", {"JPY_SESSION_NAME": "/nb.ipynb"}) == "kernel:abc"
    assert session_tag("notebook", "abc", {"JPY_SESSION_NAME": "/nb.ipynb"}) == "notebook:/nb.ipynb"
    assert session_tag("notebook", "abc", {}) == "kernel:abc"
    assert session_tag("bench", "abc", {}) == "bench"
    long = session_tag("notebook", "abc", {"JPY_SESSION_NAME": "/x" * 300})
    assert len(long) == 255 and long != session_tag("notebook", "abc", {"JPY_SESSION_NAME": "/y" * 300})


def test_only_the_kernelspec_env_travels_never_the_servers_token() -> None:
    prov = FirepoolProvisioner()
    prov.kernel_spec = KernelSpec(argv=["x"], env={"OMP_NUM_THREADS": "4", "FIREPOOL_TOKEN": "x"})
    env = {"OMP_NUM_THREADS": "4", "FIREPOOL_TOKEN": "secret", "PATH": "/usr/bin", "HOME": "/root"}
    assert prov.kernel_env(env) == {"OMP_NUM_THREADS": "4"}


async def test_provisioner_info_carries_the_job_id_so_a_restarted_server_reattaches() -> None:
    first = FirepoolProvisioner(pool="gpu", url="http://b")
    first.kernel_id, first.job_id, first._tag = "kid", "j123", "kernel:kid"
    first.connection_info = {**{k: v for k, v in INFO.items() if k not in ("key", "pid")}, "key": b"secret"}
    saved = json.loads(json.dumps(await first.get_provisioner_info()))
    fake = FakeBroker(["RUNNING"])
    again = FirepoolProvisioner()
    again._client = AsyncClient("http://b", "t", transport=httpx.MockTransport(fake.handler))
    await again.load_provisioner_info(saved)
    assert again.job_id == "j123" and again.has_process and again.pool == "gpu" and again.url == "http://b"
    assert again.connection_info["key"] == b"secret" and again._tag == "kernel:kid"
    assert await again.poll() is None
    await again._close()


def test_kernel_mode_puts_the_launcher_on_the_jobs_python_path() -> None:
    env = {"PYTHONPATH": "/mine"}
    launcher.prepare_env(env)
    root = launcher.agent_root()
    assert env["PYTHONPATH"] == f"{root}:/mine"
    assert (__import__("pathlib").Path(root) / "firepool_agent" / "kernel.py").is_file()


def test_advertised_address_prefers_the_given_one_then_the_bind_address() -> None:
    assert launcher.advertised_ip("127.0.0.1", "") == "127.0.0.1"
    assert launcher.advertised_ip("0.0.0.0", "10.1.2.3") == "10.1.2.3"
    assert launcher.advertised_ip("0.0.0.0", "") not in ("", "0.0.0.0")


def test_a_front_end_that_ignores_provisioners_gets_an_explanation_not_a_local_kernel(capsys) -> None:
    spec = kernelspec.kernel_json("gpu", url="u")
    assert spec["argv"][1:4] == ["-m", "jupyter_ext.kernelspec", "--direct-launch"]
    assert kernelspec.main(spec["argv"][3:]) == 2
    assert "kernel provisioner" in capsys.readouterr().err


class FakeBroker:
    """The broker's REST answers the provisioner needs, scripted; records every request."""

    def __init__(self, job_states: list[str]) -> None:
        self.job_states = job_states
        self.calls: list[str] = []
        self.down = False

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(f"{request.method} {request.url.path}")
        if self.down:
            raise httpx.ConnectError("broker down")
        if request.url.path.endswith("/kernel"):
            return httpx.Response(200, json={"job": "j1", "connection": INFO})
        if request.url.path.endswith("/logs"):
            return httpx.Response(200, content=b"")
        state = self.job_states.pop(0) if len(self.job_states) > 1 else self.job_states[0]
        job = {"id": "j1", "state": state, "bound_pods": ["p1"]}
        if state == "SUCCEEDED":
            job["exit_code"] = 0
        return httpx.Response(200, json=job)


def provisioner_on(fake: FakeBroker) -> FirepoolProvisioner:
    prov = FirepoolProvisioner(pool="gpu")
    # No SDK retries here: these tests count the provisioner's own asks (the SDK's are in test_client_retries).
    prov._client = AsyncClient("http://broker", "t", transport=httpx.MockTransport(fake.handler), retry=NO_RETRY)
    prov.job_id = "j1"
    return prov


async def test_poll_never_reports_a_queued_starting_or_unreachable_kernel_dead(monkeypatch) -> None:
    monkeypatch.setattr("jupyter_ext.provisioner.POLL_CACHE_S", 0.0)
    fake = FakeBroker(["QUEUED", "RUNNING", "SUCCEEDED"])
    prov = provisioner_on(fake)
    assert await prov.poll() is None and await prov.poll() is None
    fake.down = True
    assert await prov.poll() is None
    fake.down = False
    assert await prov.poll() == 0 and await prov.poll() == 0
    assert fake.calls.count("GET /v1/jobs/j1") == 4  # asked 4 times; a finished kernel not again
    await prov._close()


async def test_poll_between_asks_answers_from_the_last_reply() -> None:
    fake = FakeBroker(["RUNNING"])
    prov = provisioner_on(fake)
    for _ in range(20):
        assert await prov.poll() is None
    assert fake.calls == ["GET /v1/jobs/j1"]
    await prov._close()


async def test_restart_cleanup_keeps_the_lease_and_asks_the_broker_nothing() -> None:
    # The broker makes the restarted kernel's job wait for its session's resetting pod.
    fake = FakeBroker(["SUCCEEDED"])
    prov = provisioner_on(fake)
    prov._exit = 0
    await prov.cleanup(restart=True)
    assert fake.calls == [] and prov.job_id is None and prov._client is not None
    await prov._close()


async def test_final_cleanup_cancels_a_kernel_job_that_is_still_running() -> None:
    fake = FakeBroker(["RUNNING"])
    prov = provisioner_on(fake)
    await prov.cleanup(restart=False)
    assert fake.calls == ["POST /v1/jobs/j1/cancel"] and prov._client is None and not prov.has_process


async def test_signals_map_to_the_brokers_names_and_an_ended_kernel_is_left_alone() -> None:
    fake = FakeBroker(["RUNNING"])
    prov = provisioner_on(fake)
    await prov.send_signal(signal.SIGINT)
    await prov.kill()
    prov._exit = 0
    await prov.terminate()
    assert fake.calls == ["POST /v1/jobs/j1/signal"] * 2
    with pytest.raises(ValueError):
        prov._exit = None
        await prov.send_signal(signal.SIGWINCH)
    await prov._close()


async def test_a_launching_kernel_has_no_process_until_its_connection_is_known() -> None:
    # A Jupyter server's websocket that reconnects during a restart waits for is_alive(), then takes the
    # manager's ports and key: before the connection line they are still the previous kernel's.
    fake = FakeBroker(["RUNNING"])
    prov = provisioner_on(fake)
    prov.job_id, prov.kernel_id = None, "kid"
    connected = asyncio.Event()

    async def read_connection(job_id: str) -> Any:
        await connected.wait()
        return parse_connection(INFO)

    prov._read_connection = read_connection  # type: ignore[method-assign]
    launch = asyncio.create_task(prov.launch_kernel(prov.command(), env={}))
    while "POST /v1/jobs" not in fake.calls:
        await asyncio.sleep(0)
    assert not prov.has_process
    connected.set()
    assert (await launch)["shell_port"] == 1 and prov.has_process and prov.job_id == "j1"
    await prov._close()


async def test_a_launch_reads_the_connection_from_the_owner_only_endpoint_not_the_log() -> None:
    fake = FakeBroker(["RUNNING"])
    prov = provisioner_on(fake)
    prov.job_id, prov.kernel_id = None, "kid"
    info = await prov.launch_kernel(prov.command(), env={})
    assert info["key"] == b"k" * 64 and info["hb_port"] == 5
    assert "GET /v1/jobs/j1/kernel" in fake.calls and not [c for c in fake.calls if c.endswith("/logs")]
    await prov._close()


async def test_a_cancelled_launch_cancels_its_kernel_job() -> None:
    fake = FakeBroker(["RUNNING"])
    prov = provisioner_on(fake)
    prov.job_id, prov.kernel_id = None, "kid"
    never = asyncio.Event()

    async def read_connection(job_id: str) -> Any:
        await never.wait()

    prov._read_connection = read_connection  # type: ignore[method-assign]
    launch = asyncio.create_task(prov.launch_kernel(prov.command(), env={}))
    while "POST /v1/jobs" not in fake.calls:
        await asyncio.sleep(0)
    launch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await launch
    assert fake.calls == ["POST /v1/jobs", "POST /v1/jobs/j1/cancel"] and not prov.has_process
