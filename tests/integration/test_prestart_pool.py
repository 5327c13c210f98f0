"""Kernel warmth learned per pool, in real bubblewrap pods: after one kernel job every idle pod of the pool
keeps a pre-started kernel, never-used ones included, so a new session's first kernel is bound; a pool
that never served a kernel keeps none.

Both pools are `kernels: auto` (the default). The pods' agents are asked directly what they keep.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from tests.integration.test_jupyter import job_of, run, use
from tests.integration.test_prestart import attempt_timings, kernel, pod_agent, prestarted

pytestmark = pytest.mark.integration

POOLS = """
pools:
  - name: kern
    gpus: 0
    min_count: 2
    max_count: 3
  - name: plain
    gpus: 0
    min_count: 1
    max_count: 1
"""


@pytest.fixture
def pool_broker(broker_factory, tmp_path, monkeypatch):
    broker = broker_factory(pools=POOLS)
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    use(broker, monkeypatch, "alice")
    for name in ("one", "two"):
        r = subprocess.run([sys.executable, "-m", "broker.cli", "kernelspec", "install", "--pool", "kern",
                            "--name", f"fp-{name}", "--user", "--tag", f"session-{name}"],
                           env=broker.env("alice") | {"JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data")},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    return broker


def pods(broker, pool: str) -> list[str]:
    return sorted(p["name"] for p in broker.client("ops").get("/v1/pods").json()["pods"] if p["pool"] == pool)


async def until_pods(broker, pool: str, n: int) -> list[str]:
    deadline = time.monotonic() + 60
    while len(found := pods(broker, pool)) < n or not all(
            p["state"] == "idle" for p in broker.client("ops").get("/v1/pods").json()["pods"] if p["name"] in found):
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.1)
    return found


async def kept(broker, pod: str) -> dict[str, object]:
    async with pod_agent(broker, pod) as agent:
        return dict((await agent.health()).info["kernel_prestart"])


async def test_after_one_kernel_a_never_used_pod_keeps_one_and_a_new_session_binds_it(pool_broker) -> None:
    broker = pool_broker
    never_used = await until_pods(broker, "kern", 2)
    for pod in never_used:
        state = await kept(broker, pod)
        assert state["pid"] is None and state["spawned"] == 0 and not state["told"], state  # not learned yet
    async with kernel("fp-one") as (km, kc, _):
        first_pod = job_of(broker, km)["bound_pods"][0]
        await run(kc, "x = 1")
    other = next(p for p in never_used if p != first_pod)
    ready = await prestarted(broker, other, timeout_s=20)  # the pool learned: a pod that ran nothing keeps one
    async with kernel("fp-two") as (km, kc, _):
        job = job_of(broker, km)
        assert job["bound_pods"] == [other] and job["lease_tag"] == "session-two", job
        assert attempt_timings(job)["kernel_prestarted"] == 1.0, attempt_timings(job)
        reply, out, _ = await run(kc, "import os; print(os.getpid())")
    assert reply["status"] == "ok" and int(out) == ready["pid"]


async def test_a_pool_that_never_served_a_kernel_keeps_none(pool_broker) -> None:
    broker = pool_broker
    async with kernel("fp-one"):  # the kern pool learns; plain must not
        pass
    (pod,) = await until_pods(broker, "plain", 1)
    c = broker.client()
    listing = ("import os\nfor p in filter(str.isdigit, os.listdir('/proc')):\n"
               "    print(p, open(f'/proc/{p}/cmdline', 'rb').read())")
    job = c.post("/v1/jobs", json={"command": ["python3", "-c", listing], "pool": "plain"}).json()
    job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 30}).json()
    assert job["state"] == "SUCCEEDED", job
    await asyncio.sleep(6.0)  # past the broker's fallback pass
    state = await kept(broker, pod)
    assert state["pid"] is None and state["spawned"] == 0 and not state["told"], state
    logs = c.get(f"/v1/jobs/{job['id']}/logs", params={"stream": "stdout"}).text
    assert "--prestarted" not in logs and len(logs.splitlines()) == 2, logs  # the agent and the job itself
