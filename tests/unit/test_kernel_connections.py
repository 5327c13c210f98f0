"""A kernel's connection info reaches its owner alone (`GET /v1/jobs/{id}/kernel`), and one policy decides
what of a job REST and the dashboard show an admin: metadata, never output (in process, virtual time)."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from broker.api.access import Part, may_read
from broker.api.auth import Identity
from broker.jobs import JobState
from broker.ports.agent import FakeAgent
from tests.unit.harness import Harness
from tests.unit.test_api import ALICE, BOB, OPS, api  # noqa: F401 - the fixture

KEY = "f" * 64
CURVE_SECRET = "S" * 40
INFO = {"ip": "127.0.0.1", "transport": "tcp", "shell_port": 41001, "iopub_port": 41002, "stdin_port": 41003,
        "control_port": 41004, "hb_port": 41005, "signature_scheme": "hmac-sha256", "key": KEY,
        "curve_publickey": "P" * 40, "curve_secretkey": CURVE_SECRET}




def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def submit(api: httpx.AsyncClient, command: list[str], kernel: bool = True) -> str:  # noqa: F811
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": command, "kernel": kernel}, headers=auth(ALICE))
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def running_agent(api: httpx.AsyncClient, job_id: str) -> tuple[FakeAgent, str]:  # noqa: F811
    """The fake agent running the job's rank 0, and the attempt id, once it launched."""
    h: Harness = api.h  # type: ignore[attr-defined]
    await h.until(lambda: job_id in h.cp.executor.launched)
    pod = h.cp.tracker.pods_of(job_id)[0].name
    agent = h.backend.agents[pod]
    assert isinstance(agent, FakeAgent)
    return agent, h.cp.executor.launched[job_id]


def error_class(r: httpx.Response) -> str:
    return str(r.json()["error"]["class"])


async def test_the_owner_reads_its_kernels_connection_and_nobody_else_does_admins_included(api) -> None:  # noqa: F811
    job = await submit(api, ["hang"])
    agent, attempt = await running_agent(api, job)
    agent.kernel_info[attempt] = INFO
    mine = await api.get(f"/v1/jobs/{job}/kernel", headers=auth(ALICE))
    assert mine.status_code == 200 and mine.json() == {"job": job, "connection": INFO}
    assert mine.headers["cache-control"] == "no-store"
    for token in (BOB, OPS):
        r = await api.get(f"/v1/jobs/{job}/kernel", headers=auth(token))
        assert (r.status_code, error_class(r)) == (404, "NotFound") and KEY not in r.text


async def test_a_kernel_not_up_yet_is_a_retryable_409_and_wait_s_answers_once_it_is(api) -> None:  # noqa: F811
    job = await submit(api, ["hang"])
    agent, attempt = await running_agent(api, job)
    r = await api.get(f"/v1/jobs/{job}/kernel", headers=auth(ALICE))
    assert (r.status_code, error_class(r), r.json()["error"]["retryable"]) == (409, "KernelNotReady", True)
    waiting = asyncio.create_task(api.get(f"/v1/jobs/{job}/kernel", params={"wait_s": 30}, headers=auth(ALICE)))
    await api.h.run_for(2.0)
    assert not waiting.done()
    agent.kernel_info[attempt] = INFO
    await api.h.run_for(1.0)
    r = await waiting
    assert r.status_code == 200 and r.json()["connection"]["key"] == KEY


async def test_a_queued_kernel_job_waits_and_an_ended_one_or_a_plain_job_is_a_typed_409(api) -> None:  # noqa: F811
    h: Harness = api.h
    plain = await submit(api, ["hang"], kernel=False)
    await running_agent(api, plain)
    r = await api.get(f"/v1/jobs/{plain}/kernel", headers=auth(ALICE))
    assert (r.status_code, error_class(r)) == (409, "NotAKernel")
    job = await submit(api, ["sleep", "1"])
    await h.finish(await h.cp.get("alice", job))
    r = await api.get(f"/v1/jobs/{job}/kernel", params={"wait_s": 5}, headers=auth(ALICE))
    assert (r.status_code, error_class(r), r.json()["error"]["retryable"]) == (409, "KernelEnded", False)


async def test_an_admin_reads_a_jobs_metadata_but_never_its_output_on_rest_and_dashboard_alike(api) -> None:  # noqa: F811
    h: Harness = api.h
    job = await h.run_job("alice", command=("echo", f'{{"key": "{KEY}"}}'), extra={"kernel": True})
    assert job.state is JobState.SUCCEEDED
    assert KEY in (await api.get(f"/v1/jobs/{job.id}/logs", params={"follow": "false"}, headers=auth(ALICE))).text
    listed = (await api.get("/v1/jobs", params={"caller": "alice"}, headers=auth(OPS))).json()["jobs"]
    assert [j["id"] for j in listed] == [job.id]  # metadata: yes
    r = await api.get(f"/v1/jobs/{job.id}/logs", params={"follow": "false"}, headers=auth(OPS))
    assert r.status_code == 404 and KEY not in r.text
    r = await api.post("/ui/login", data={"token": OPS, "next": "/ui/"})
    assert r.status_code == 303
    page = await api.get(f"/ui/jobs/{job.id}")
    assert page.status_code == 200 and job.id in page.text and "SUCCEEDED" in page.text  # its metadata
    assert not re.search(r"data-log=", page.text)  # no live log pane for another caller's job
    log = await api.get(f"/ui/jobs/{job.id}/log")
    assert log.status_code == 404 and KEY not in log.text
    api.cookies.clear()
    await api.post("/ui/login", data={"token": ALICE, "next": "/ui/"})
    assert "data-log=" in (await api.get(f"/ui/jobs/{job.id}")).text
    assert KEY in (await api.get(f"/ui/jobs/{job.id}/log")).text


@pytest.mark.parametrize("who, owner, part, allowed", [
    (Identity("alice"), "alice", Part.OUTPUT, True),
    (Identity("alice"), "alice", Part.METADATA, True),
    (Identity("bob"), "alice", Part.METADATA, False),
    (Identity("bob"), "alice", Part.OUTPUT, False),
    (Identity("ops", admin=True), "alice", Part.METADATA, True),
    (Identity("ops", admin=True), "alice", Part.OUTPUT, False),
    (Identity("ops", admin=True), "ops", Part.OUTPUT, True),
])
def test_the_one_policy_gives_admins_metadata_and_owners_alone_output(who: Identity, owner: str, part: Part,
                                                                      allowed: bool) -> None:
    assert may_read(who, owner, part) is allowed
