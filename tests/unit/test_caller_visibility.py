"""What one caller sees of another through /v1/pods, /v1/pools, /v1/jobs and /metrics (in process)."""

from __future__ import annotations

import httpx
import pytest

from broker.api.app import create_app
from broker.api.auth import TokenAuth
from tests.unit.harness import Harness, cpu_pool

TOKENS = {"alice-token": "alice", "bob-token": "bob", "ops-token": {"caller": "ops", "admin": True}}


def auth(caller: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {caller}-token"}


@pytest.fixture
async def busy():
    """alice holds a tagged pod after a job; bob has run nothing."""
    h = await Harness([cpu_pool()]).start()
    app = create_app(h.cp, TokenAuth(TOKENS))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
        r = await http.post("/v1/jobs", json={"pool": "cpu", "command": ["sleep", "1"],
                                              "lease_tag": "notebooks/secret-project.ipynb"}, headers=auth("alice"))
        assert r.status_code == 201, r.text
        await h.run_for(2.0)
        http.h = h  # type: ignore[attr-defined]
        yield http
    await h.stop()


async def test_a_caller_sees_only_its_own_pods_and_tags(busy) -> None:
    mine = (await busy.get("/v1/pods", headers=auth("alice"))).json()["pods"]
    assert [p["lease_tag"] for p in mine] == ["notebooks/secret-project.ipynb"]
    theirs = (await busy.get("/v1/pods", headers=auth("bob"))).text
    assert "alice" not in theirs and "secret-project" not in theirs
    assert (await busy.get("/v1/pods", headers=auth("bob"))).json()["pods"] == []


async def test_an_admin_sees_every_callers_pods_jobs_and_holds(busy) -> None:
    pods = (await busy.get("/v1/pods", headers=auth("ops"))).json()["pods"]
    assert [p["caller"] for p in pods] == ["alice"]
    pools = (await busy.get("/v1/pools", headers=auth("ops"))).json()["pools"]
    assert pools[0]["held_by"] == {"alice": 1}
    jobs = (await busy.get("/v1/jobs", headers=auth("ops"))).json()["jobs"]
    assert [j["caller"] for j in jobs] == ["alice"]
    assert (await busy.get("/v1/jobs", params={"caller": "bob"}, headers=auth("ops"))).json()["jobs"] == []


async def test_pool_totals_stay_but_holds_by_owner_show_only_the_callers_own(busy) -> None:
    bob = (await busy.get("/v1/pools", headers=auth("bob"))).json()["pools"][0]
    assert bob["held"] == 1 and bob["held_by"] == {}
    alice = (await busy.get("/v1/pools", headers=auth("alice"))).json()["pools"][0]
    assert alice["held_by"] == {"alice": 1}


async def test_a_caller_lists_only_its_own_jobs_and_cannot_ask_for_anothers(busy) -> None:
    assert (await busy.get("/v1/jobs", headers=auth("bob"))).json()["jobs"] == []
    r = await busy.get("/v1/jobs", params={"caller": "alice"}, headers=auth("bob"))
    assert r.status_code == 403 and r.json()["error"]["class"] == "Forbidden"


async def test_metrics_need_an_admin_token(busy) -> None:
    r = await busy.get("/metrics")
    assert r.status_code == 401 and r.json()["error"]["class"] == "Unauthorized"
    r = await busy.get("/metrics", headers=auth("alice"))
    assert r.status_code == 403 and r.json()["error"]["class"] == "Forbidden"
    r = await busy.get("/metrics", headers=auth("ops"))
    assert r.status_code == 200 and 'firepool_pods{pool="cpu",state="held"} 1.0' in r.text


async def test_metrics_carry_no_caller_names_unless_asked(busy) -> None:
    plain = (await busy.get("/metrics", headers=auth("ops"))).text
    assert "alice" not in plain and "caller=" not in plain
    labelled = create_app(busy.h.cp, TokenAuth(TOKENS), metrics_caller_labels=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=labelled), base_url="http://fp") as http:
        text = (await http.get("/metrics", headers=auth("ops"))).text
    assert 'firepool_pool_held_by{caller="alice",pool="cpu"} 1.0' in text


async def test_a_caller_sees_the_pod_running_its_job_before_the_pod_carries_its_session() -> None:
    h = await Harness([cpu_pool()]).start()
    app = create_app(h.cp, TokenAuth(TOKENS))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
            r = await http.post("/v1/jobs", json={"pool": "cpu", "command": ["sleep", "30"], "lease_tag": "t1"},
                                headers=auth("alice"))
            assert r.status_code == 201, r.text
            await h.run_for(2.0)
            mine = (await http.get("/v1/pods", headers=auth("alice"))).json()["pods"]
            assert [(p["state"], p["caller"], p["lease_tag"]) for p in mine] == [("running", "alice", "t1")]
            assert (await http.get("/v1/pods", headers=auth("bob"))).json()["pods"] == []
    finally:
        await h.stop()
