"""Team quotas follow a catalog reload (SIGHUP) in a real broker: a guarantee raised in the file admits a job
the old tree refused, without a restart."""

from __future__ import annotations

import signal
import time

import pytest

from tests.integration.conftest import run_job

pytestmark = pytest.mark.integration

POOLS = """
pools:
  - name: gpu
    gpus: 1
    accelerator: virtual
    max_count: 2
    idle_timeout: 120
quotas:
  orgs:
    acme:
      teams:
        nlp: {{guaranteed_gpus: {guarantee}, callers: {{alice: {{}}}}}}
"""


def test_a_guarantee_raised_by_a_reload_admits_the_job_the_old_tree_refused(broker_factory) -> None:
    b = broker_factory(pools=POOLS.format(guarantee=1))
    alice = b.client("alice")
    refused = alice.post("/v1/jobs", json={"pool": "gpu", "pods": 2, "command": ["true"]})
    assert refused.status_code == 400 and "guarantee of 1" in refused.json()["error"]["message"], refused.text
    pools_file = b.state_dir.parent / f"{b.state_dir.name}-pools.yaml"
    pools_file.write_text(POOLS.format(guarantee=2))
    assert b.proc is not None
    b.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while "catalog reloaded" not in b.log():
        assert time.monotonic() < deadline, "no reload"
        time.sleep(0.1)
    job = run_job(alice, {"pool": "gpu", "pods": 2, "command": ["true"]})
    assert job["state"] == "SUCCEEDED", job
