"""Warmth through a real broker: budgets and borrowed capacity from a capacity file, and a template
rollout started by SIGHUP, observed through /v1/pools and /metrics."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.integration.conftest import run_job

pytestmark = pytest.mark.integration

POOLS = """
budgets: {{virtual: 1}}
pools:
  - name: gpu
    gpus: 1
    accelerator: virtual
    max_count: 2
    max_idle_count: 2
    idle_timeout: 120
    caller_hold_seconds: 120
    borrow: true
    template: {{start_delay_s: {delay}}}
"""


def _pool(c, name: str = "gpu") -> dict:
    return next(p for p in c.get("/v1/pools").json()["pools"] if p["name"] == name)


def _until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout} s")
        time.sleep(0.1)


def test_a_pod_past_the_budget_is_borrowed_and_given_back_when_the_owner_reclaims(broker_factory, tmp_path) -> None:
    capacity = tmp_path / "capacity.json"
    capacity.write_text(json.dumps({"virtual": 1}))
    b = broker_factory(pools=POOLS.format(delay=0), extra=("--capacity", str(capacity)))
    alice, bob = b.client("alice"), b.client("bob")
    first = alice.post("/v1/jobs", json={"pool": "gpu", "command": ["sleep", "2"]}).json()
    second = run_job(bob, {"pool": "gpu", "command": ["true"]})
    assert second["state"] == "SUCCEEDED"
    _until(lambda: alice.get(f"/v1/jobs/{first['id']}").json()["state"] == "SUCCEEDED", 30, "first job done")
    pool = _pool(alice)
    assert {second["acquisition"][0]["pod"], alice.get(f"/v1/jobs/{first['id']}").json()["acquisition"][0]["pod"]} \
        == {p["name"] for p in b.client("ops").get("/v1/pods").json()["pods"]}, pool
    assert pool["physical"] == 2 and pool["borrowed"] == 1
    assert pool["budget"]["limit"] == 1.0 and pool["budget"]["used"] == 1.0
    metrics = b.client("ops").get("/metrics").text
    assert 'firepool_pool_borrowed{pool="gpu"} 1.0' in metrics
    capacity.write_text(json.dumps({"virtual": 0}))  # the owner reclaims its GPU
    _until(lambda: _pool(alice)["borrowed"] == 0 and _pool(alice)["physical"] == 1, 25, "borrowed pod released")


def test_sighup_with_a_changed_template_drains_old_pods_and_jobs_still_succeed(broker_factory) -> None:
    b = broker_factory(pools=POOLS.format(delay=0).replace("budgets: {virtual: 1}", "budgets: {virtual: 2}"))
    alice = b.client("alice")
    assert run_job(alice, {"pool": "gpu", "command": ["true"]})["state"] == "SUCCEEDED"
    ops = b.client("ops")  # the operator's view: pods of every caller and none
    old = {p["name"] for p in ops.get("/v1/pods").json()["pods"]}
    assert len(old) == 1
    pools_file = b.state_dir.parent / f"{b.state_dir.name}-pools.yaml"
    pools_file.write_text(POOLS.format(delay=0.2).replace("budgets: {virtual: 1}", "budgets: {virtual: 2}"))
    assert b.proc is not None
    b.proc.send_signal(signal.SIGHUP)
    _until(lambda: not old & {p["name"] for p in ops.get("/v1/pods").json()["pods"]}, 20, "old pod drained")
    job = run_job(alice, {"pool": "gpu", "command": ["true"]})
    assert job["state"] == "SUCCEEDED" and job["acquisition"][0]["pod"] not in old
    assert _pool(alice)["stale"] == 0 and "catalog reloaded" in b.log()


def test_http_capacity_source_reads_a_capacity_controller_and_reports_failures() -> None:
    import http.server
    import threading

    from broker.errors import Unavailable
    from broker.ports.capacity import HttpCapacitySource

    body = {"doc": json.dumps({"H200": {"unused": 3}, "A100": 1}).encode()}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body["doc"])

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        source = HttpCapacitySource(f"http://127.0.0.1:{server.server_address[1]}/capacity")
        assert source.read() == {"H200": 3.0, "A100": 1.0}
        body["doc"] = b"{not json"
        with pytest.raises(Unavailable):
            source.read()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    with pytest.raises(Unavailable):
        source.read()  # nobody listens any more
