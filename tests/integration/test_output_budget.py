"""The output budget against a real broker: a job printing 300 MB neither grows the broker's memory by more
than a bounded window nor stores more than the pool's cap (docs/security.md, "Output budget")."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.output_flood import Sampler, tree_rss
from tests.integration.conftest import BrokerProcess, both_backends, run_job

pytestmark = pytest.mark.integration

MiB = 1 << 20
POOLS = """pools:
  - name: cpu
    max_count: 4
    template: {memory: 512Mi, pids: 256, workspace_size: 256Mi, tmp_size: 64Mi, shm_size: 64Mi}
"""
FLOOD = ["sh", "-c", "head -c 300000000 /dev/zero | tr '\\0' x; echo"]
CAP = 64 * MiB
"""The pool's default max_output_bytes."""
MARKER_START = b"\n[firepool: output truncated at "


@both_backends
def test_a_job_printing_300_mb_leaves_the_brokers_memory_and_stored_log_within_budget(
        broker_factory: Callable[..., BrokerProcess], backend_kind: str) -> None:
    # The kubernetes backend's templates are pod specs (its limits are the cluster's), the same copy path otherwise.
    b = broker_factory(pools=POOLS if backend_kind == "local" else "pools:\n  - {name: cpu, max_count: 4}\n")
    try:
        assert b.proc is not None
        c = b.client()
        warm = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "flood"})  # the pod starts outside the window
        assert warm["state"] == "SUCCEEDED", warm
        time.sleep(0.5)
        before, _ = tree_rss(b.proc.pid)  # the broker and its pods (its children), sampled every 50 ms
        sampler = Sampler(b.proc.pid)
        sampler.start()
        try:
            job = run_job(c, {"pool": "cpu", "command": FLOOD, "lease_tag": "flood", "timeout_s": 120}, wait=180)
            logs = c.get(f"/v1/jobs/{job['id']}/logs", params={"follow": "false"})
        finally:
            sampler.halt.set()
            sampler.join()
        assert job["state"] == "SUCCEEDED", job
        growth = sampler.peak - before
        assert sampler.samples > 10
        assert growth < 150 * MiB, f"the broker's tree grew {growth / MiB:.0f} MiB (from {before / MiB:.0f} MiB)"
        assert logs.status_code == 200
        assert len(logs.content) == CAP
        assert logs.content.startswith(b"x" * 1000) and MARKER_START in logs.content[-200:]
        stored = [p for p in (b.state_dir / "logs").rglob("*") if p.is_file() and job["id"] in str(p)]
        assert {p.name for p in stored} == {"0.combined.log", "0.stdout.log"}  # nothing on stderr
        assert all(p.stat().st_size == CAP for p in stored)
    finally:
        b.stop()


def test_logs_past_a_callers_byte_budget_are_swept_and_reading_one_answers_410_logs_swept(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "r", extra=("--log-max-bytes-per-caller", "100", "--log-sweep-interval", "0.2"))
    try:
        c = b.client()
        body = {"pool": "cpu", "command": ["sh", "-c", "echo " + "a" * 40]}
        first = run_job(c, body)
        time.sleep(0.05)  # the second job's logs (combined and stdout, 82 bytes) are newer and fit the 100 bytes
        second = run_job(c, {**body, "command": ["sh", "-c", "echo " + "b" * 40]})
        other = run_job(b.client("bob"), {**body, "command": ["sh", "-c", "echo " + "c" * 40]})
        deadline = time.monotonic() + 30
        while (r := c.get(f"/v1/jobs/{first['id']}/logs", params={"follow": "false"})).status_code == 200:
            assert time.monotonic() < deadline, "the first job's logs were never swept"
            time.sleep(0.1)
        assert r.status_code == 410, r.text
        error = r.json()["error"]
        assert error["class"] == "LogsSwept" and error["details"]["reason"] == "bytes" and not error["retryable"]
        assert c.get(f"/v1/jobs/{second['id']}/logs", params={"follow": "false"}).text == "b" * 40 + "\n"
        assert b.client("bob").get(f"/v1/jobs/{other['id']}/logs", params={"follow": "false"}).text == "c" * 40 + "\n"
    finally:
        b.stop()
