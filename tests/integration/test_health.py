"""Fleet health on the local backend with real sandboxes: a virtual GPU whose jobs keep failing with a
hardware Xid is quarantined, taken out of placement, and let back by an operator; agents report their
incarnation, which the backend recorded when it started them."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.integration.conftest import BrokerProcess, run_job

pytestmark = pytest.mark.integration

FAULT_ON_0 = ('echo "$CUDA_VISIBLE_DEVICES"; if [ "$CUDA_VISIBLE_DEVICES" = 0 ]; then '
              'echo "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus." >&2; exit 1; fi')


POOLS = ("pools:\n"
         "  - {name: gpu, gpus: 1, accelerator: virtual, max_count: 4, max_idle_count: 4, step: 1,"
         " idle_timeout: 300, caller_hold_seconds: 300}\n"
         "  - {name: cpu, max_count: 2, step: 1}\n"
         "quarantine: {threshold: 3}\n")
"""Pods are made one per waiting job, each on the first free card: a replaced pod lands on index 0 again."""


def _wait_state(c, job_id: str, state: str, wait: float = 60) -> dict:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        job = c.get(f"/v1/jobs/{job_id}").json()
        if job["state"] == state:
            return job
        time.sleep(0.1)
    raise AssertionError(f"{job_id} not {state} in {wait} s: {job}")


def test_a_virtual_gpu_failing_three_times_leaves_placement_until_an_operator_releases_it(tmp_path) -> None:
    b = BrokerProcess(tmp_path / "broker", pools=POOLS, extra=("--virtual-gpus", "4"))
    try:
        alice, ops = b.client("alice"), b.client("ops")
        faults = 0
        for caller in ("alice", "bob", "carol"):
            # Another caller's job gets a new pod, on the first free card: index 0. Its Xid there re-queues
            # it without spending a retry, and the next attempt runs elsewhere (the failed pod is retired).
            c = b.client(caller)
            job = run_job(c, {"pool": "gpu", "command": ["sh", "-c", FAULT_ON_0], "max_retries": 0}, wait=120)
            assert job["state"] == "SUCCEEDED" and job["retries"] == 0, job
            errors = [a.get("error_class") for a in job["attempts"]]
            assert set(errors[:-1]) <= {"HardwareFault"} and errors[-1] is None, errors
            assert c.get(f"/v1/jobs/{job['id']}/logs").text.strip() != "0"
            faults += len(errors) - 1
        assert faults == 3

        listed = ops.get("/v1/admin/quarantine").json()["quarantine"]
        assert [(r["key"], r["quarantined"], r["failures"]) for r in listed] == [("virtual-gpu-0", True, 3)]
        assert alice.get("/v1/admin/quarantine").status_code == 403

        # Three long jobs take the three cards left; a fourth waits, although index 0 is free.
        long = [b.client(c).post("/v1/jobs", json={"pool": "gpu", "command": ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES; sleep 60"]}).json()
                for c in ("alice", "bob", "carol")]
        for j, c in zip(long, ("alice", "bob", "carol"), strict=True):
            _wait_state(b.client(c), j["id"], "RUNNING")
        waiting = ops.post("/v1/jobs", json={"pool": "gpu", "command": ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES"]}).json()
        time.sleep(4.0)
        assert ops.get(f"/v1/jobs/{waiting['id']}").json()["state"] == "QUEUED"
        pods = ops.get("/v1/pods").json()["pods"]
        assert sorted(g for p in pods for g in p["gpus"]) == ["virtual-gpu-1", "virtual-gpu-2", "virtual-gpu-3"]

        out = subprocess.run([sys.executable, "-m", "broker.cli", "quarantine", "list"], env=b.env("ops"),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "virtual-gpu-0" in out.stdout and "QUARANTINED" in out.stdout, out
        out = subprocess.run([sys.executable, "-m", "broker.cli", "quarantine", "release", "virtual-gpu-0"],
                             env=b.env("ops"), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "released by ops" in out.stdout, out
        done = _wait_state(ops, waiting["id"], "SUCCEEDED", wait=60)
        assert ops.get(f"/v1/jobs/{done['id']}/logs").text.strip() == "0"  # back in placement
        for j, c in zip(long, ("alice", "bob", "carol"), strict=True):
            b.client(c).post(f"/v1/jobs/{j['id']}/cancel")
    finally:
        b.stop()


def test_a_restarted_broker_keeps_quarantines_and_trusts_agents_of_the_recorded_incarnation(tmp_path) -> None:
    pools = POOLS.replace("threshold: 3", "threshold: 1")
    b = BrokerProcess(tmp_path / "broker", pools=pools, extra=("--virtual-gpus", "4"))
    try:
        alice, ops = b.client("alice"), b.client("ops")
        run_job(alice, {"pool": "gpu", "command": ["sh", "-c", FAULT_ON_0], "max_retries": 0}, wait=120)
        held = run_job(alice, {"pool": "cpu", "command": ["true"], "lease_tag": "keep"})
        (pod,) = held["attempts"][-1]["pods"]
        deadline = time.monotonic() + 60  # the hold is written after the reset: kill the broker once it is
        while time.monotonic() < deadline and not any(
                p["name"] == pod and p["state"] == "idle" for p in ops.get("/v1/pods").json()["pods"]):
            time.sleep(0.05)
        b.kill()
        b.start()
        assert [r["key"] for r in ops.get("/v1/admin/quarantine").json()["quarantine"] if r["quarantined"]] == \
            ["virtual-gpu-0"]
        assert "epoch_invalidated" not in b.log()  # the agents answered with the incarnation recorded at start
        again = run_job(alice, {"pool": "cpu", "command": ["true"], "lease_tag": "keep"})
        assert again["attempts"][-1]["pods"] == held["attempts"][-1]["pods"] and [a["path"] for a in again["acquisition"]] == ["warm"]
    finally:
        b.stop()
