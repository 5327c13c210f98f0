"""POST /v1/jobs/{id}/signal and kernel mode: owner-scoped, typed errors, and the agent gets the signal."""

from __future__ import annotations

from tests.unit.test_api import ALICE, BOB, api, assert_error, auth  # noqa: F401 - the fixture

HANG = {"pool": "cpu", "command": ["hang"]}


async def _running(api) -> str:  # noqa: F811
    job_id = (await api.post("/v1/jobs", json=HANG, headers=auth())).json()["id"]
    await api.h.until(lambda: job_id in api.h.cp.executor.launched)
    return job_id


async def test_signal_reaches_the_agent_of_the_running_attempt(api) -> None:  # noqa: F811
    job_id = await _running(api)
    r = await api.post(f"/v1/jobs/{job_id}/signal", json={"signal": "SIGTERM"}, headers=auth())
    assert r.status_code == 200 and r.json()["id"] == job_id
    done = await api.h.finish(api.h.store.get(job_id))
    assert done.state == "FAILED" and done.exit_code == 143


async def test_signal_of_another_callers_job_is_not_found(api) -> None:  # noqa: F811
    job_id = await _running(api)
    assert_error(await api.post(f"/v1/jobs/{job_id}/signal", json={"signal": "KILL"}, headers=auth(BOB)),
                 404, "NotFound")
    assert job_id in api.h.cp.executor.launched


async def test_unknown_signal_and_unknown_fields_are_rejected(api) -> None:  # noqa: F811
    job_id = await _running(api)
    assert_error(await api.post(f"/v1/jobs/{job_id}/signal", json={"signal": "STOP"}, headers=auth()),
                 422, "InvalidRequest")
    assert_error(await api.post(f"/v1/jobs/{job_id}/signal", json={"signal": "INT", "pid": 1}, headers=auth()),
                 422, "UnknownField")
    assert job_id in api.h.cp.executor.launched


async def test_signal_of_a_finished_job_is_a_conflict(api) -> None:  # noqa: F811
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["exit", "0"]}, headers=auth())
    job_id = r.json()["id"]
    await api.h.finish(api.h.store.get(job_id))
    assert_error(await api.post(f"/v1/jobs/{job_id}/signal", json={"signal": "INT"}, headers=auth()),
                 409, "Conflict")


async def test_kernel_mode_rides_to_the_agent_and_shows_in_the_view(api) -> None:  # noqa: F811
    r = await api.post("/v1/jobs", json={**HANG, "kernel": True}, headers=auth())
    view = r.json()
    assert view["kernel"] is True
    await api.h.until(lambda: view["id"] in api.h.cp.executor.launched)
    launches = [launch for agent in api.h.backend.agents.values() for launch in agent.launches]
    assert [dict(launch.extra) for launch in launches] == [{"kernel": True, "max_output_bytes": 64 << 20}]
    plain = (await api.post("/v1/jobs", json={"pool": "cpu", "command": ["true"]}, headers=auth())).json()
    assert "kernel" not in plain
    assert_error(await api.post("/v1/jobs", json={**HANG, "kernel": "yes"}, headers=auth()), 422, "InvalidRequest")
