"""The REST contract: strict schemas, one error shape, auth, caller scoping, views (in process, no sockets)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from broker.api.app import create_app
from broker.api.auth import TokenAuth
from tests.unit.harness import Harness, cpu_pool

ALICE, BOB, OPS = "alice-token", "bob-token", "ops-token"


@pytest.fixture
async def api():
    h = await Harness([cpu_pool()]).start()
    app = create_app(h.cp, TokenAuth({ALICE: "alice", BOB: "bob", OPS: {"caller": "ops", "admin": True}}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
        http.h = h  # type: ignore[attr-defined]
        yield http
    await h.stop()


def auth(token: str = ALICE) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_error(r: httpx.Response, status: int, cls: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"class", "message", "retryable", "details"}
    assert body["error"]["class"] == cls
    return body["error"]


async def test_unknown_top_level_field_is_rejected_and_nothing_is_stored(api) -> None:
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["true"], "bogus": 1}, headers=auth())
    err = assert_error(r, 422, "UnknownField")
    assert err["details"]["field"] == "bogus" and "bogus" in err["message"]
    assert api.h.store.list_jobs() == []


async def test_unknown_nested_field_is_rejected(api) -> None:
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["true"], "extra": {"nested": 1}}, headers=auth())
    assert_error(r, 422, "UnknownField")
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["true"], "env": {"A": 1}}, headers=auth())
    assert_error(r, 422, "InvalidRequest")
    assert api.h.store.list_jobs() == []


@pytest.mark.parametrize("body", [
    {"pool": "cpu", "command": "echo hi"},
    {"pool": "cpu", "command": ["echo"], "pods": "2"},
    {"pool": "cpu", "command": ["echo"], "timeout_s": "soon"},
    {"pool": "cpu", "command": []},
    {"pool": "cpu", "command": ["echo"], "pods": 0},
    {"pool": "cpu", "command": ["echo"], "single_use": "yes"},
])
async def test_wrong_types_are_422_and_store_nothing(api, body) -> None:
    r = await api.post("/v1/jobs", json=body, headers=auth())
    assert_error(r, 422, "InvalidRequest")
    assert api.h.store.list_jobs() == []


async def test_malformed_json_is_a_typed_422_that_blames_the_body(api) -> None:
    r = await api.post("/v1/jobs", content=b"{not json", headers={**auth(), "content-type": "application/json"})
    err = assert_error(r, 422, "InvalidRequest")
    assert err["details"] == {"field": "body", "offset": 1}
    assert err["message"].startswith("the request body is not valid JSON at character 1")
    assert api.h.store.list_jobs() == []


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
async def test_a_non_finite_number_is_refused_as_not_finite(api, number: str) -> None:
    body = '{"pool": "cpu", "command": ["true"], "timeout_s": ' + number + '}'
    r = await api.post("/v1/jobs", content=body.encode(), headers={**auth(), "content-type": "application/json"})
    err = assert_error(r, 422, "InvalidRequest")
    assert err["details"]["field"] == "timeout_s" and "finite" in err["message"]
    assert api.h.store.list_jobs() == []


async def test_unknown_pool_is_a_typed_400(api) -> None:
    r = await api.post("/v1/jobs", json={"pool": "tpu", "command": ["true"]}, headers=auth())
    err = assert_error(r, 400, "UnknownPool")
    assert err["details"]["known"] == ["cpu"]


async def test_a_gang_larger_than_the_ceiling_is_unschedulable(api) -> None:
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["true"], "pods": 5}, headers=auth())
    assert_error(r, 400, "Unschedulable")


async def test_no_or_bad_token_is_401(api) -> None:
    assert_error(await api.post("/v1/jobs", json={"pool": "cpu", "command": ["true"]}), 401, "Unauthorized")
    assert_error(await api.get("/v1/jobs", headers=auth("nope")), 401, "Unauthorized")
    assert_error(await api.get("/v1/pools", headers={"Authorization": "Basic abc"}), 401, "Unauthorized")


async def test_another_callers_job_is_404(api) -> None:
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["sleep", "1"]}, headers=auth())
    job_id = r.json()["id"]
    assert_error(await api.get(f"/v1/jobs/{job_id}", headers=auth(BOB)), 404, "NotFound")
    assert_error(await api.post(f"/v1/jobs/{job_id}/cancel", headers=auth(BOB)), 404, "NotFound")
    assert_error(await api.get(f"/v1/jobs/{job_id}/logs", headers=auth(BOB)), 404, "NotFound")
    assert (await api.get("/v1/jobs", headers=auth(BOB))).json()["jobs"] == []


async def test_submitted_job_view_has_the_contract_fields(api) -> None:
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["sleep", "1"], "lease_tag": "s",
                                         "env": {"A": "1", "LD_PRELOAD": "/evil.so", "FIREPOOL_CALLER": "root"}},
                       headers=auth())
    assert r.status_code == 201
    job = r.json()
    assert job["state"] == "QUEUED" and job["caller"] == "alice" and job["lease_tag"] == "s"
    assert "exit_code" not in job  # absent, not 0, while no process has exited
    assert job["env"] == {"A": "1"}
    assert {d["name"] for d in job["dropped_env"]} == {"LD_PRELOAD", "FIREPOOL_CALLER"}
    assert all(d["reason"] for d in job["dropped_env"])
    assert job["timings"]["submitted_at"] <= job["timings"]["queued_at"]
    done = await api.h.finish(api.h.store.get(job["id"]))
    view = (await api.get(f"/v1/jobs/{done.id}", headers=auth())).json()
    assert view["state"] == "SUCCEEDED" and view["exit_code"] == 0 and view["retries"] == 0
    assert view["acquisition"] == [{"pod": done.pods[0], "path": "new", "reason": view["acquisition"][0]["reason"]}]
    assert view["attempts"][0]["id"] == f"{done.id}:0"
    assert set(view["timings"]) >= {"submitted_at", "queued_at", "claimed_at", "committed_at", "handed_off_at",
                                    "first_instruction_at", "finished_at"}
    launched = api.h.backend.agents[done.pods[0]].launches[-1]
    assert launched.env["FIREPOOL_CALLER"] == "alice" and "LD_PRELOAD" not in launched.env


async def test_submit_with_wait_s_answers_once_the_job_finished(api) -> None:
    request = asyncio.create_task(api.post("/v1/jobs", json={"pool": "cpu", "command": ["sleep", "1"]},
                                           params={"wait_s": 30}, headers=auth()))
    await api.h.until(request.done, timeout=10)
    r = request.result()
    assert r.status_code == 201
    assert r.json()["state"] == "SUCCEEDED" and r.json()["exit_code"] == 0


async def test_submit_with_wait_s_answers_as_the_job_stands_when_the_wait_ends(api) -> None:
    request = asyncio.create_task(api.post("/v1/jobs", json={"pool": "cpu", "command": ["hang"]},
                                           params={"wait_s": 2}, headers=auth()))
    await api.h.until(request.done, timeout=10)
    assert api.h.clock.now() >= 2
    r = request.result()
    assert r.status_code == 201 and r.json()["state"] == "RUNNING"


@pytest.mark.parametrize("wait_s", ["-1", "301", "soon"])
async def test_submit_with_a_bad_wait_s_is_422_and_stores_nothing(api, wait_s) -> None:
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["true"]}, params={"wait_s": wait_s},
                       headers=auth())
    err = assert_error(r, 422, "InvalidRequest")
    assert err["details"]["field"] == "query.wait_s"
    assert api.h.store.list_jobs() == []


async def test_idempotent_submit_returns_200_with_the_same_job(api) -> None:
    body = {"pool": "cpu", "command": ["true"], "idempotency_key": "once"}
    first = await api.post("/v1/jobs", json=body, headers=auth())
    again = await api.post("/v1/jobs", json=body, headers=auth())
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]


async def test_pools_pods_healthz_and_metrics(api) -> None:
    await api.post("/v1/jobs", json={"pool": "cpu", "command": ["sleep", "1"]}, headers=auth())
    await api.h.run_for(2.0)
    pools = (await api.get("/v1/pools", headers=auth())).json()["pools"]
    assert pools[0]["name"] == "cpu"
    for key in ("min_count", "max_idle_count", "max_count", "idle_timeout", "physical", "idle", "held",
                "starting", "busy", "standby", "stale", "queued_demand", "last_plan"):
        assert key in pools[0]
    assert pools[0]["held"] == 1 and pools[0]["held_by"] == {"alice": 1}
    pods = (await api.get("/v1/pods", headers=auth())).json()["pods"]
    assert pods[0]["caller"] == "alice" and pods[0]["held"] is True
    assert (await api.get("/healthz")).json()["ok"] is True
    metrics = (await api.get("/metrics", headers=auth(OPS))).text
    assert 'firepool_acquisitions_total{path="new",pool="cpu"} 1.0' in metrics
    assert "firepool_start_latency_seconds_bucket" in metrics
    assert 'firepool_pods{pool="cpu",state="held"} 1.0' in metrics


async def test_cancel_via_api(api) -> None:
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["hang"]}, headers=auth())
    job_id = r.json()["id"]
    await api.h.until(lambda: job_id in api.h.cp.executor.launched)
    r = await api.post(f"/v1/jobs/{job_id}/cancel", headers=auth())
    assert r.status_code == 200
    done = await api.h.finish(api.h.store.get(job_id))
    assert done.state == "CANCELLED"


async def test_openapi_is_served(api) -> None:
    spec = (await api.get("/openapi.json")).json()
    assert "/v1/jobs" in spec["paths"] and "/v1/jobs/{job_id}/logs" in spec["paths"]
    submit_params = {p["name"]: p for p in spec["paths"]["/v1/jobs"]["post"]["parameters"]}
    assert submit_params["wait_s"]["in"] == "query" and submit_params["wait_s"]["schema"]["maximum"] == 300
