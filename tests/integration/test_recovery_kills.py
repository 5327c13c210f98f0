"""The short form of B13: three broker SIGKILLs under W-Agent load on MariaDB, and the agents' ledgers
that let it prove that no attempt ran twice."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bench.recovery import MARIADB, run_repeat
from firepool_agent.ledger import read_ledger
from tests.integration.conftest import BrokerProcess, run_job

pytestmark = pytest.mark.integration


def test_three_kills_under_load_lose_no_job_run_none_twice_and_keep_every_hold() -> None:
    out = run_repeat(0, "agent", 3, (1.0, 2.5), MARIADB, random.Random(3), settle_s=1.0, drain_s=60.0)
    assert out["kills"] == 3
    assert out["jobs"] > 0 and out["attempts_started"] > 0, out  # the load really ran
    assert out["lost"] == [], out["lost"]
    assert out["started_twice"] == [] and out["jobs_run_twice"] == [], out
    assert set(out["states"]) == {"SUCCEEDED"}, out["states"]
    held, busy = out["pods"]["held"], out["pods"]["busy"]
    assert held[0] == held[1] and busy[0] == busy[1], out["pods"]  # running sandboxes survived the kills
    assert held[1] + busy[1] > 0, out["pods"]  # some pod was held or busy at a kill
    # Every restart logged when it began dispatching; recovery itself (control-plane start to dispatching)
    # is short even on this shared machine. The 0.1 s figure from process start is the benchmark's.
    assert len(out["dispatch_after_control_s"]) == 3, out
    assert max(out["dispatch_after_control_s"]) < 1.0, out["dispatch_after_control_s"]
    assert len(out["first_claim_s"]) >= 1, out


def test_the_agent_records_each_started_attempt_where_no_job_can_write(broker: BrokerProcess) -> None:
    c = broker.client()
    probe = ("import os\n"
             "for fd in os.listdir('/proc/self/fd'):\n"
             "    try:\n        print('fd', fd, os.readlink('/proc/self/fd/' + fd))\n"
             "    except OSError:\n        pass  # the directory listing's own fd\n"
             "try:\n    print('agent fds', os.listdir('/proc/1/fd'))\n"
             "except OSError as e:\n    print('agent fds refused', e.errno)\n")
    job = run_job(c, {"pool": "cpu", "command": ["python3", "-c", probe], "lease_tag": "l"})
    assert job["state"] == "SUCCEEDED", job
    out = c.get(f"/v1/jobs/{job['id']}/logs").text
    assert "agent fds refused" in out and "ledger" not in out and ".jsonl" not in out, out
    again = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "l"})
    records = list(read_ledger((broker.state_dir / "ledger").glob("*.jsonl")))
    assert [r["attempt"] for r in records] == [job["attempts"][0]["id"], again["attempts"][0]["id"]]
    pod = job["acquisition"][0]["pod"]
    assert {r["pod"] for r in records} == {pod}
    assert json.loads(Path(broker.state_dir / "ledger" / f"{pod}.jsonl").read_text().splitlines()[0])["at"] > 0
