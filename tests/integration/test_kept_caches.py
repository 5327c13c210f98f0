"""Kept paths are per caller: what one caller's job leaves in a kept path reaches that caller's later pods and
never another caller's (real broker, bubblewrap sandboxes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import run_job

pytestmark = pytest.mark.integration

POOLS = ("pools:\n  - name: cpu\n    max_count: 4\n    max_idle_count: 4\n    caller_hold_seconds: 60\n"
         "    keep_paths: [/cache/kept]\n")


def output(c, job: dict) -> str:
    assert job["state"] == "SUCCEEDED", (job, c.get(f"/v1/jobs/{job['id']}/logs").text)
    return c.get(f"/v1/jobs/{job['id']}/logs").text


def test_a_kept_path_reaches_the_callers_later_pods_and_never_another_caller(broker_factory) -> None:
    b = broker_factory(pools=POOLS)
    alice, bob = b.client("alice"), b.client("bob")
    planted = run_job(alice, {"pool": "cpu", "lease_tag": "a",
                              "command": ["sh", "-c", "mkdir -p /cache/kept/uv && echo alice > /cache/kept/uv/entry"]})
    assert planted["state"] == "SUCCEEDED", planted
    first_pod = planted["bound_pods"][0]

    # bob, on the same pool, finds an empty kept path (his own), and leaves something there too.
    looked = run_job(bob, {"pool": "cpu", "command": ["sh", "-c", "ls -A /cache/kept; echo bob > /cache/kept/bobs"]})
    assert output(bob, looked) == ""
    assert looked["bound_pods"][0] != first_pod

    # alice's next job on another pod (single use: a new one) sees her entry and nothing of bob's.
    later = run_job(alice, {"pool": "cpu", "single_use": True, "command": ["sh", "-c", "ls -A /cache/kept; "
                                                                           "cat /cache/kept/uv/entry"]})
    assert later["bound_pods"][0] != first_pod
    assert output(alice, later) == "uv\nalice\n"

    # bob's later pod has his own file back, still nothing of alice's.
    again = run_job(bob, {"pool": "cpu", "single_use": True, "command": ["ls", "-A", "/cache/kept"]})
    assert output(bob, again) == "bobs\n"

    # On the host: one store per caller, none bound into any sandbox of the other.
    stores = sorted(p.name for p in (b.state_dir / "caches" / "cpu" / "callers").iterdir())
    assert len(stores) == 2


def test_a_shared_cache_is_filled_by_the_operator_and_read_only_to_every_job(broker_factory) -> None:
    b = broker_factory(pools=POOLS + "    shared_paths: [/cache/shared]\n")
    made = subprocess.run([sys.executable, "-m", "broker.cli", "cache", "dir", "cpu", "/cache/shared",
                           "--state-dir", str(b.state_dir)], capture_output=True, text=True, check=True)
    host = Path(made.stdout.strip())
    (host / "model.bin").write_text("weights")  # the operator's warm step, on the host
    (host / "model.bin").chmod(0o644)
    for caller in ("alice", "bob"):
        c = b.client(caller)
        job = run_job(c, {"pool": "cpu", "command": ["sh", "-c", "cat /cache/shared/model.bin; "
                                                     "touch /cache/shared/planted 2>/dev/null || echo ' refused'"]})
        assert output(c, job) == "weights refused\n"
    assert sorted(p.name for p in host.iterdir()) == ["model.bin"]
