"""Preemption on real sandboxes (local backend, 2 virtual GPUs): a job within its team's guarantee makes a
borrowed job yield. The victim sees SIGTERM first (it may checkpoint), is SIGKILLed at the grace deadline if
it ignores it, is re-queued as a new attempt with `Preempted` in its history, and finishes later."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.integration.conftest import BrokerProcess, run_job

pytestmark = pytest.mark.integration

GRACE_S = 3.0
CATALOG = f"""
pools:
  - {{name: cpu, max_count: 2}}
  - {{name: gpu, gpus: 1, max_count: 2, max_idle_count: 2}}
quotas:
  orgs:
    lab:
      teams:
        nlp: {{guaranteed_gpus: 1, callers: {{alice: {{}}}}}}
        rl: {{guaranteed_gpus: 1, callers: {{bob: {{}}}}}}
  preemption_grace_s: {GRACE_S}
  min_runtime_before_preempt: 0
"""

# First attempt: say so, then wait; TERM is trapped (cooperative) or ignored (stubborn). Later attempts finish.
COOPERATIVE = ('case "$FIREPOOL_ATTEMPT_ID" in *:0) trap \'echo got-SIGTERM-checkpointing; exit 0\' TERM; '
               'echo first-attempt; while true; do sleep 0.1; done;; *) echo second-attempt-done;; esac')
STUBBORN = ("case \"$FIREPOOL_ATTEMPT_ID\" in *:0) trap '' TERM; echo first-attempt; "
            "while true; do sleep 0.1; done;; *) echo second-attempt-done;; esac")


def _submit(c: httpx.Client, body: dict) -> dict:
    r = c.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def _wait(c: httpx.Client, job_id: str, cond, timeout: float = 60.0) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = c.get(f"/v1/jobs/{job_id}").json()
        if cond(job):
            return job
        time.sleep(0.1)
    raise AssertionError(f"{job_id} never got there: {job}")


def _running(c: httpx.Client, job_id: str, marker: str | None = None) -> dict:
    job = _wait(c, job_id, lambda j: j["state"] == "RUNNING" and j["attempts"] and j["attempts"][-1].get("launched_at"))
    if marker is not None:  # the script is past installing its trap
        _wait(c, job_id, lambda j: marker in c.get(f"/v1/jobs/{job_id}/logs", params={"follow": "false"}).text)
    return job


def _preempt_one(broker: BrokerProcess, script: str) -> tuple[dict, dict, dict]:
    """alice runs one job in quota and one on rl's unused quota (borrowed); bob's in-quota job reclaims it."""
    alice, bob = broker.client("alice"), broker.client("bob")
    in_quota = _submit(alice, {"pool": "gpu", "lease_tag": "a", "preemptible": True, "command": ["sleep", "300"]})
    _running(alice, in_quota["id"])
    borrowed = _submit(alice, {"pool": "gpu", "lease_tag": "b", "preemptible": True, "max_retries": 1,
                               "command": ["sh", "-c", script]})
    _running(alice, borrowed["id"], "first-attempt")
    owner = run_job(bob, {"pool": "gpu", "lease_tag": "g", "command": ["echo", "bob-ran"]}, wait=90)
    assert owner["state"] == "SUCCEEDED", owner
    alice.post(f"/v1/jobs/{in_quota['id']}/cancel")
    victim = _wait(alice, borrowed["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), 90)
    event = next(e for e in broker.client("ops").get("/v1/events").json()["events"]
                 if e["kind"] == "preemption" and e["subject"] == borrowed["id"])
    return victim, owner, event


def test_a_guaranteed_job_preempts_a_borrowed_one_which_checkpoints_requeues_and_finishes(
        broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(pools=CATALOG)
    alice = broker.client("alice")
    victim, owner, event = _preempt_one(broker, COOPERATIVE)
    assert victim["state"] == "SUCCEEDED", victim
    first, second = victim["attempts"]
    assert first["error_class"] == "Preempted" and "preempted for a job within its team's guarantee" in first["message"]
    assert victim["preempt_count"] == 1 and victim["effective_priority"] == 1 and victim["retries"] == 1
    first_log = alice.get(f"/v1/jobs/{victim['id']}/logs", params={"attempt": 0}).text
    assert "got-SIGTERM-checkpointing" in first_log  # it saw SIGTERM and could checkpoint
    assert "second-attempt-done" in alice.get(f"/v1/jobs/{victim['id']}/logs").text
    assert second["launched_at"] >= owner["timings"]["committed_at"]  # it ran again after the owner got its GPU
    assert event["caller"] == "alice" and event["detail"]["for_job"] == owner["id"] and event["cost_gpu_s"] > 0
    assert broker.client("bob").get("/v1/events").json()["events"] == []  # bob sees only events about his jobs
    seen = next(e for e in alice.get("/v1/events").json()["events"] if e["subject"] == victim["id"])
    assert "for_job" not in seen["detail"] and "bob" not in seen["why"]  # nor does alice learn bob's jobs
    quotas = broker.client("ops").get("/v1/pools").json()["quotas"]
    assert set(quotas) == {"in_quota", "borrowed"} and "quotas" not in alice.get("/v1/pools").json()
    shown = subprocess.run([sys.executable, "-m", "broker.cli", "events"], env=broker.env("ops"),
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "preemption" in shown.stdout and victim["id"] in shown.stdout, shown


def test_a_job_that_ignores_sigterm_dies_at_the_grace_deadline(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(pools=CATALOG)
    victim, _, event = _preempt_one(broker, STUBBORN)
    first = victim["attempts"][0]
    assert first["error_class"] == "Preempted", victim
    took = first["finished_at"] - event["at"]
    print(f"preempted attempt ended {took:.2f} s after the preemption (grace {GRACE_S} s)")
    assert GRACE_S - 0.5 <= took <= GRACE_S + 3.0, took  # SIGKILL at the deadline, not before, not much after
    assert victim["state"] == "SUCCEEDED" and len(victim["attempts"]) == 2
