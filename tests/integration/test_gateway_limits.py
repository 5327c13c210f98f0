"""The gateway's per-caller kernel limit, session sharing, its own idle culling and adoption after a broker
restart, with a real broker (`--gateway-max-kernels 2 --gateway-cull-idle 2`): the broker shuts down a
kernel nobody is connected to even when no Jupyter server is left to ask it to."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from tests.integration.conftest import BrokerProcess
from tests.integration.gateway_client import Channels

pytestmark = pytest.mark.integration
POOLS = """
pools:
  - {name: cpu, max_count: 6}
  - {name: tiny, max_count: 1, max_idle_count: 1}
"""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("gateway-limits") / "state", pools=POOLS,
                      extra=("--gateway-max-kernels", "2", "--gateway-cull-idle", "2",
                             "--gateway-allowed-envs", "MY_SETTING"))
    try:
        yield b
    finally:
        b.stop()


def running_jobs(b: BrokerProcess, caller: str = "alice") -> list[dict]:
    return list(b.client(caller).get("/v1/jobs", params={"state": ["QUEUED", "RUNNING"]}).json()["jobs"])


def test_a_kernel_nobody_is_connected_to_is_culled_by_the_broker_and_its_job_ends(broker: BrokerProcess) -> None:
    c = broker.client()
    kid = c.post("/api/kernels", json={"name": "firepool-cpu"}).json()["id"]
    ch = Channels(broker.url, kid, broker.tokens["alice"])
    ch.execute("print(1)")
    time.sleep(3)  # connected: idle, but not culled
    assert [k["id"] for k in c.get("/api/kernels").json()] == [kid]
    ch.close()  # the client (a Jupyter server that went away) is gone
    deadline = time.monotonic() + 30
    while c.get("/api/kernels").json() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert c.get("/api/kernels").json() == []
    while running_jobs(broker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running_jobs(broker) == []


def test_a_caller_over_the_kernel_limit_gets_429_and_no_job(broker: BrokerProcess) -> None:
    c = broker.client()
    env = {"KERNEL_FIREPOOL_SESSION": "shared-files", "MY_SETTING": "on", "OTHER": "dropped",
           "KERNEL_WORKING_DIR": "/nonexistent/on/the/sandbox"}
    first = c.post("/api/kernels", json={"name": "firepool-cpu", "env": env}).json()["id"]
    ch = Channels(broker.url, first, broker.tokens["alice"])
    try:
        out, _ = ch.execute("import os; print(os.environ.get('MY_SETTING'), os.environ.get('OTHER'), "
                            "os.environ.get('KERNEL_FIREPOOL_SESSION'), os.getcwd())")
        assert out.split() == ["on", "None", "shared-files", "/workspace"]
        ch.execute("open('from-first.txt', 'w').write('shared')")
        r = c.post("/api/kernels", json={"name": "firepool-cpu", "env": {"KERNEL_FIREPOOL_SESSION": "shared-files"}})
        assert r.status_code == 409 and r.json()["error"]["class"] == "SessionBusy"
        second = c.post("/api/kernels", json={"name": "firepool-cpu"}).json()["id"]
        r = c.post("/api/kernels", json={"name": "firepool-cpu"})
        assert r.status_code == 429 and r.json()["error"]["class"] == "TooManyKernels"
        assert len(running_jobs(broker)) == 2
        assert broker.client("bob").post("/api/kernels", json={"name": "firepool-cpu"}).status_code == 201
        c.delete(f"/api/kernels/{second}")
    finally:
        ch.close()
        c.delete(f"/api/kernels/{first}")
    # The session's files are there for the next kernel of that session.
    third = c.post("/api/kernels", json={"name": "firepool-cpu", "env": {"KERNEL_FIREPOOL_SESSION": "shared-files",
                                                                         "KERNEL_WORKING_DIR": "/workspace"}}).json()["id"]
    ch = Channels(broker.url, third, broker.tokens["alice"])
    try:
        assert ch.execute("print(open('from-first.txt').read())")[0] == "shared\n"
    finally:
        ch.close()
        c.delete(f"/api/kernels/{third}")


def test_a_restarted_broker_adopts_the_kernels_that_kept_running(broker: BrokerProcess) -> None:
    c = broker.client()
    kid = c.post("/api/kernels", json={"name": "firepool-cpu"}).json()["id"]
    ch = Channels(broker.url, kid, broker.tokens["alice"])
    ch.execute("remembered = 'yes'")
    ch.close()
    broker.kill(signal.SIGTERM)  # a graceful stop: the kernel's job runs on, as every job does
    broker.start()
    c = broker.client()
    assert [k["id"] for k in c.get("/api/kernels").json()] == [kid]
    ch = Channels(broker.url, kid, broker.tokens["alice"])
    try:
        assert ch.execute("print(remembered)")[0] == "yes\n"
    finally:
        ch.close()
        c.delete(f"/api/kernels/{kid}")


def test_a_start_that_cannot_come_up_within_the_clients_launch_timeout_is_refused_and_leaves_no_job(
        broker: BrokerProcess) -> None:
    c = broker.client()
    busy = c.post("/v1/jobs", json={"pool": "tiny", "command": ["sleep", "60"]}).json()
    try:
        deadline = time.monotonic() + 60
        while c.get(f"/v1/jobs/{busy['id']}").json()["state"] != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.1)  # the pool's one pod is taken
        t0 = time.monotonic()
        r = c.post("/api/kernels", json={"name": "firepool-tiny", "env": {"KERNEL_LAUNCH_TIMEOUT": "2"}})
        assert r.status_code == 409 and r.json()["error"]["class"] == "KernelNotReady", r.text
        assert time.monotonic() - t0 < 15
        assert c.get("/api/kernels").json() == []
        deadline = time.monotonic() + 10
        while len(running_jobs(broker)) > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [(j["id"], j["state"]) for j in running_jobs(broker)] == [(busy["id"], "RUNNING")]
    finally:
        c.post(f"/v1/jobs/{busy['id']}/cancel")
