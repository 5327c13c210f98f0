"""A kernel's keys reach its owner alone: an admin sweeps every job route of REST and every dashboard page
(its live streams included) on another caller's live kernel job and finds no key; no job log carries one.

The attack this pins: the launcher printed its connection file (HMAC key, CurveZMQ secret key, ports) as a
`FIREPOOL-KERNEL` line into the job's log, the dashboard let an admin read any job's log, and with that
line jupyter_client ran code in alice's kernel. Real broker, bubblewrap sandboxes, jupyter_client.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import start_new_kernel

from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration

KERNEL = ["python3", "-m", "firepool_agent.kernel", "--ip", "127.0.0.1"]
POOLS = """pools:
  - {name: cpu, max_count: 3, template: {network: host}}
"""
LEAK = re.compile(r'"(key|curve_secretkey)"\s*:')
SSE_READ_S = 3.0
"""How long each live stream (SSE) of the dashboard is read."""
UI_PAGES = ("/ui/", "/ui/jobs", "/ui/jobs?caller=alice", "/ui/jobs?state=RUNNING", "/ui/jobs/{id}",
            "/ui/sessions", "/ui/pods", "/ui/latency", "/ui/timeline.json")
UI_STREAMS = ("/ui/jobs/{id}/log", "/ui/events?topics=pools,pods,jobs")


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory(pools=POOLS)


def secrets_of(info: dict) -> list[str]:
    found = [info["key"]] + ([info["curve_secretkey"]] if info.get("curve_secretkey") else [])
    assert all(len(s) >= 32 for s in found), "a secret too short to search for"
    return found


def run_in_kernel(info: dict, code: str) -> str:
    """Execute `code` over the served connection info; the stream text it printed."""
    kc = BlockingKernelClient()
    kc.load_connection_info({**info, "key": info["key"].encode()})
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        out: list[str] = []
        kc.execute_interactive(code, timeout=60, output_hook=lambda m: out.append(m["content"].get("text", "")))
        return "".join(out)
    finally:
        kc.stop_channels()


def read_stream(http: httpx.Client, path: str) -> str:
    """An SSE response read for SSE_READ_S seconds (it never ends by itself while the job runs)."""
    body = b""
    deadline = time.monotonic() + SSE_READ_S
    with http.stream("GET", path, timeout=httpx.Timeout(30, read=SSE_READ_S)) as response:
        body += f"{response.status_code}\n".encode()
        try:
            for chunk in response.iter_bytes():
                body += chunk
                if time.monotonic() > deadline:
                    break
        except httpx.ReadTimeout:
            pass  # a quiet stream: nothing more came within the read
    return body.decode(errors="replace")


def job_get_routes(http: httpx.Client) -> list[str]:
    """Every REST GET under /v1 that takes a job id, from the broker's own OpenAPI document."""
    spec = http.get("/openapi.json").json()
    routes = [p for p, ops in spec["paths"].items() if p.startswith("/v1/") and "{job_id}" in p and "get" in ops]
    assert {"/v1/jobs/{job_id}", "/v1/jobs/{job_id}/logs", "/v1/jobs/{job_id}/kernel"} <= set(routes), routes
    return routes


def test_an_admin_finds_no_key_on_any_route_of_another_callers_live_kernel(broker: BrokerProcess) -> None:
    alice, ops = broker.client("alice"), broker.client("ops")
    r = alice.post("/v1/jobs", json={"pool": "cpu", "command": KERNEL, "kernel": True})
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    served = alice.get(f"/v1/jobs/{job}/kernel", params={"wait_s": 60})
    assert served.status_code == 200, served.text
    info = served.json()["connection"]
    hidden = secrets_of(info)
    assert run_in_kernel(info, "print(6*7)").strip() == "42"  # the owner's channel works

    bodies: dict[str, str] = {}
    for route in job_get_routes(ops):
        path = route.replace("{job_id}", job)
        bodies[path] = ops.get(path, params={"follow": "false"} if path.endswith("/logs") else None).text
    for path in ("/v1/jobs", "/v1/jobs?caller=alice", "/v1/events", "/v1/pods", "/v1/pools", "/metrics"):
        bodies[path] = ops.get(path).text
    dashboard = httpx.Client(base_url=broker.url, timeout=30)
    try:
        assert dashboard.post("/ui/login", data={"token": broker.tokens["ops"], "next": "/ui/"}).status_code == 303
        for page in UI_PAGES:
            bodies[page] = dashboard.get(page.replace("{id}", job)).text
        for stream in UI_STREAMS:
            bodies[stream] = read_stream(dashboard, stream.replace("{id}", job))
    finally:
        dashboard.close()
    assert job in bodies["/ui/jobs/{id}"] and job in bodies["/v1/jobs?caller=alice"]  # the metadata is there
    assert bodies["/ui/jobs/{id}/log"].startswith("404")
    leaks = {path: [s[:6] for s in hidden if s in body] for path, body in bodies.items()}
    assert not any(leaks.values()), {p: found for p, found in leaks.items() if found}

    for stream in ("combined", "stdout", "stderr"):  # not even the owner's log carries them
        text = alice.get(f"/v1/jobs/{job}/logs", params={"stream": stream, "follow": "false"}).text
        assert "FIREPOOL-KERNEL" not in text and not LEAK.search(text) and not any(s in text for s in hidden)
    alice.post(f"/v1/jobs/{job}/cancel")


def test_a_notebook_kernel_leaves_no_key_in_any_of_its_owners_job_logs(broker: BrokerProcess, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The acceptance check: kernelspec install, start_new_kernel, print(6*7), shutdown; then every job of
    alice's, and every stream of its log, is free of the connection line and of any key."""
    data = tmp_path / "jupyter-data"
    for name, value in (("JUPYTER_DATA_DIR", str(data)), ("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime")),
                        ("FIREPOOL_URL", broker.url), ("FIREPOOL_TOKEN", broker.tokens["alice"])):
        monkeypatch.setenv(name, value)
    r = subprocess.run([sys.executable, "-m", "broker.cli", "kernelspec", "install", "--pool", "cpu", "--name",
                        "fp-trust", "--user"], env=broker.env("alice") | {"JUPYTER_DATA_DIR": str(data)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    km, kc = start_new_kernel(kernel_name="fp-trust", startup_timeout=120)
    try:
        out: list[str] = []
        kc.execute_interactive("print(6*7)", timeout=60,
                               output_hook=lambda m: out.append(m["content"].get("text", "")))
        assert "".join(out).strip() == "42"
        key = km.session.key.decode()
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    alice = broker.client("alice")
    jobs = alice.get("/v1/jobs").json()["jobs"]
    assert jobs and all(j["caller"] == "alice" for j in jobs)
    for j in jobs:
        for stream in ("combined", "stdout", "stderr"):
            text = alice.get(f"/v1/jobs/{j['id']}/logs", params={"stream": stream, "follow": "false"}).text
            assert "FIREPOOL-KERNEL" not in text and not LEAK.search(text) and key not in text, (j["id"], stream)
