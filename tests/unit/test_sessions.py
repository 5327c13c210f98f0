"""Sessions that live side by side (MCP conversations): `recycle: false` never takes another session's
pod, and ending a session (DELETE /v1/sessions/{tag}) retires the caller's sandbox of that tag now, nobody else's."""

from __future__ import annotations

import httpx
import pytest

from broker.api.app import create_app
from broker.api.auth import TokenAuth
from broker.errors import InvalidRequest
from broker.jobs import JobState
from broker.pods import PodState
from tests.unit.harness import Harness, cpu_pool

ALICE, BOB = "alice-token", "bob-token"


@pytest.fixture
async def h():
    harness = await Harness([cpu_pool()]).start()
    yield harness
    await harness.stop()


@pytest.fixture
async def api(h: Harness):
    app = create_app(h.cp, TokenAuth({ALICE: "alice", BOB: "bob"}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
        yield http


def _state(h: Harness, name: str) -> PodState | None:
    pod = h.cp.tracker.pods.get(name)
    return pod.state if pod is not None else None


async def test_ending_a_session_retires_its_idle_pod_and_the_next_job_gets_a_new_one(h: Harness, api) -> None:
    first = await h.run_job(lease_tag="conv-1")
    r = await api.delete("/v1/sessions/conv-1", headers={"Authorization": f"Bearer {ALICE}"})
    assert r.status_code == 200, r.text
    assert r.json()["retired_pods"] == list(first.pods)
    await h.until(lambda: _state(h, first.pods[0]) is None)
    again = await h.run_job(lease_tag="conv-1")
    assert again.pods != first.pods


async def test_another_callers_session_of_the_same_name_is_untouched(h: Harness, api) -> None:
    alices = await h.run_job("alice", lease_tag="conv-1")
    r = await api.delete("/v1/sessions/conv-1", headers={"Authorization": f"Bearer {BOB}"})
    assert r.status_code == 200 and r.json()["retired_pods"] == []
    assert _state(h, alices.pods[0]) is PodState.IDLE
    second = await h.run_job("alice", lease_tag="conv-1")
    assert h.paths(second) == ["warm"] and second.pods == alices.pods


async def test_ending_a_session_cancels_its_running_job_and_retires_the_pod_at_release(h: Harness) -> None:
    job = await h.submit(lease_tag="conv-2", command=("sleep", "30"))
    await h.until(lambda: (h.store.get(job.id) or job).state is JobState.RUNNING)
    pod = h.store.get(job.id).pods[0]  # type: ignore[union-attr]
    ended = await h.cp.end_session("alice", "conv-2")
    assert ended["cancelled_jobs"] == [job.id] and pod in ended["retiring_at_release"]
    final = await h.finish(job)
    assert final.state is JobState.CANCELLED
    await h.until(lambda: _state(h, pod) is None)


async def test_the_untagged_session_cannot_be_ended(h: Harness) -> None:
    with pytest.raises(InvalidRequest, match="tag is required"):
        await h.cp.end_session("alice", "")


async def test_a_job_that_may_not_recycle_leaves_the_other_sessions_pod_alone(h: Harness) -> None:
    a1 = await h.run_job(lease_tag="conv-A", recycle=False)
    b1 = await h.run_job(lease_tag="conv-B", recycle=False)
    a2 = await h.run_job(lease_tag="conv-A", recycle=False)
    assert b1.pods != a1.pods and h.paths(b1) == ["new"]
    assert a2.pods == a1.pods and h.paths(a2) == ["warm"]


async def test_recycle_is_part_of_the_rest_request(api) -> None:
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["true"], "recycle": False},
                       headers={"Authorization": f"Bearer {ALICE}"})
    assert r.status_code == 201 and r.json()["recycle"] is False
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["true"], "recycle": "no"},
                       headers={"Authorization": f"Bearer {ALICE}"})
    assert r.status_code == 422


async def test_at_the_ceiling_a_job_that_may_not_recycle_takes_over_the_least_recently_used_session() -> None:
    h = await Harness([cpu_pool(max_count=2)]).start()
    try:
        a = await h.run_job(lease_tag="conv-A", recycle=False)
        b = await h.run_job(lease_tag="conv-B", recycle=False)
        assert a.pods != b.pods
        c = await h.run_job(lease_tag="conv-C", recycle=False)
        assert h.paths(c) == ["recycled"] and c.pods == a.pods
        c2 = await h.run_job(lease_tag="conv-C", recycle=False)
        assert h.paths(c2) == ["warm"] and c2.pods == a.pods  # taken over for good, not retired
        b2 = await h.run_job(lease_tag="conv-B", recycle=False)
        assert h.paths(b2) == ["warm"] and b2.pods == b.pods
    finally:
        await h.stop()
