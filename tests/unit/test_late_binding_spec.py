"""What a job carries for late binding: the request fields, the pool's operator env, and the launch extras."""

from __future__ import annotations

import httpx
import pytest

from broker.api.app import create_app
from broker.api.auth import TokenAuth
from broker.pools import CatalogError, parse_pool
from tests.unit.harness import Harness, cpu_pool

AUTH = {"Authorization": "Bearer alice-token"}


@pytest.fixture
async def api():
    h = await Harness([cpu_pool(env={"UV_INDEX_URL": "http://mirror.internal/simple", "SHARED": "pool"})]).start()
    app = create_app(h.cp, TokenAuth({"alice-token": "alice"}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
        http.h = h  # type: ignore[attr-defined]
        yield http
    await h.stop()


@pytest.mark.parametrize("field, value", [("package", "not-a-digest"), ("package", "A" * 64),
                                          ("requirements", "x" * 70000), ("requirements", ["a==1"])])
async def test_malformed_late_binding_fields_are_rejected(api, field: str, value: object) -> None:
    r = await api.post("/v1/jobs", json={"command": ["true"], field: value}, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"]["class"] == "InvalidRequest", r.text


async def test_requirements_and_the_pool_env_reach_the_launch_with_the_job_env_on_top(api) -> None:
    r = await api.post("/v1/jobs", json={"command": ["echo", "x"], "requirements": "alpha==1.0\n",
                                         "env": {"SHARED": "job"}}, headers=AUTH)
    assert r.status_code == 201, r.text
    assert r.json()["requirements"] == "alpha==1.0\n"
    h: Harness = api.h  # type: ignore[attr-defined]
    await h.finish(h.store.get(r.json()["id"]))  # type: ignore[arg-type]
    launch = next(req for a in h.backend.agents.values() for req in a.launches)
    assert launch.extra == {"requirements": "alpha==1.0\n", "max_output_bytes": 64 << 20}  # the pool's default cap
    assert launch.env["UV_INDEX_URL"] == "http://mirror.internal/simple" and launch.env["SHARED"] == "job"


@pytest.mark.parametrize("env", [["PIP_INDEX_URL=x"], {"BAD-NAME": "x"}, {"N": 1}])
def test_a_malformed_pool_env_fails_the_catalog(env: object) -> None:
    with pytest.raises(CatalogError):
        parse_pool({"name": "cpu", "env": env})
