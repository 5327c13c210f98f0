"""`firepool signal` and `firepool session end` against a real broker: the job gets the signal, the session's
jobs are cancelled and its sandboxes retired, and mistakes are one-line messages."""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import BrokerProcess
from tests.integration.test_cli_messages import assert_one_line, firepool

pytestmark = pytest.mark.integration

TRAP = "trap 'echo got-usr1; exit 7' USR1; echo ready; while true; do sleep 0.1; done"


def _started(broker: BrokerProcess, tag: str, command: list[str]) -> str:
    api = broker.client("alice")
    job = api.post("/v1/jobs", json={"pool": "cpu", "lease_tag": tag, "command": command, "timeout_s": 120}).json()
    deadline = time.monotonic() + 60
    while "ready" not in api.get(f"/v1/jobs/{job['id']}/logs", params={"follow": "false"}).text:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.1)
    return str(job["id"])


def test_firepool_signal_reaches_the_running_job(broker: BrokerProcess) -> None:
    env = broker.env()
    job_id = _started(broker, "sig", ["sh", "-c", TRAP])
    r = firepool("signal", job_id, "sigusr1", env=env)
    assert r.returncode == 0 and f"{job_id}: SIGUSR1 sent" in r.stdout, r.stderr
    done = broker.client("alice").get(f"/v1/jobs/{job_id}", params={"wait_s": 30}).json()
    assert done["exit_code"] == 7
    assert "got-usr1" in broker.client("alice").get(f"/v1/jobs/{job_id}/logs", params={"follow": "false"}).text


def test_firepool_session_end_cancels_the_sessions_jobs_and_retires_its_sandbox(broker: BrokerProcess) -> None:
    env = broker.env()
    job_id = _started(broker, "ending", ["sh", "-c", "echo ready; sleep 120"])
    r = firepool("session", "end", "ending", env=env)
    assert r.returncode == 0 and "session 'ending' ended: 1 job(s) cancelled, 1 sandbox(es) retired" in r.stdout, r
    api = broker.client("alice")
    assert api.get(f"/v1/jobs/{job_id}", params={"wait_s": 30}).json()["state"] == "CANCELLED"
    deadline = time.monotonic() + 30
    while any(p["lease_tag"] == "ending" for p in api.get("/v1/pods").json()["pods"]):
        assert time.monotonic() < deadline, "the session's sandbox was not retired"
        time.sleep(0.1)


def test_signal_mistakes_are_one_line_messages(broker: BrokerProcess) -> None:
    env = broker.env()
    r = firepool("signal", "j0000000000000000000", "WINCH", env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "'WINCH' is not one of INT, TERM" in r.stderr
    assert_one_line(firepool("signal", "j0000000000000000000", "TERM", env=env), "j0000000000000000000")
