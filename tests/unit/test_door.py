"""The API's door: one limit per input checked at submit, and the one error shape on every refusal."""

from __future__ import annotations

import json

import httpx
import pytest

from broker.api.app import create_app
from broker.api.auth import TokenAuth
from firepool_agent import limits
from tests.unit.harness import Harness, cpu_pool

ALICE = "alice-token"
AUTH = {"Authorization": f"Bearer {ALICE}"}
JSON = {**AUTH, "Content-Type": "application/json"}


@pytest.fixture
async def api():
    h = await Harness([cpu_pool()]).start()
    app = create_app(h.cp, TokenAuth({ALICE: "alice"}), max_request_bytes=4 << 20)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://fp") as http:
        http.h = h  # type: ignore[attr-defined]
        yield http
    await h.stop()


def shaped(r: httpx.Response, status: int, cls: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"class", "message", "retryable", "details"}, body
    assert body["error"]["class"] == cls, body
    return body["error"]


async def submit_raw(api, raw: str | bytes) -> httpx.Response:
    return await api.post("/v1/jobs", content=raw if isinstance(raw, bytes) else raw.encode(), headers=JSON)


@pytest.mark.parametrize("raw, field", [
    ('{"pool": "cpu", "command": ["echo", "\\ud800"]}', "command.1"),
    ('{"pool": "cpu", "command": ["echo"], "env": {"A": "x\\udfff"}}', "env.A"),
    ('{"pool": "cpu", "command": ["echo"], "env": {"\\ud800": "x"}}', "env"),
    ('{"pool": "cpu", "command": ["echo"], "lease_tag": "t\\ud800"}', "lease_tag"),
    ('{"pool": "cpu", "command": ["echo"], "requirements": "numpy\\ud800"}', "requirements"),
])
async def test_a_lone_surrogate_anywhere_is_a_422_at_the_door_and_nothing_is_stored(api, raw, field) -> None:
    err = shaped(await submit_raw(api, raw), 422, "InvalidRequest")
    assert err["details"]["field"] == field
    assert any(why in err["message"] for why in ("surrogate", "not a variable name", "unicode"))
    assert api.h.store.list_jobs() == []


@pytest.mark.parametrize("body, field", [
    ({"command": ["echo", "a\x00b"]}, "command.1"),
    ({"command": ["echo"], "env": {"A": "a\x00b"}}, "env.A"),
    ({"command": ["echo"], "lease_tag": "tag\x00"}, "lease_tag"),
    ({"command": ["echo"], "queue": "q\x00"}, "queue"),
    ({"command": ["echo"], "idempotency_key": "k\x00"}, "idempotency_key"),
    ({"command": ["echo"], "requirements": "numpy\x00"}, "requirements"),
])
async def test_nul_is_refused_the_same_way_in_argv_env_tags_and_keys(api, body, field) -> None:
    err = shaped(await api.post("/v1/jobs", json={"pool": "cpu", **body}, headers=AUTH), 422, "InvalidRequest")
    assert err["details"]["field"] == field and "NUL" in err["message"]
    assert api.h.store.list_jobs() == []


async def test_an_empty_program_name_is_a_422_not_a_launch_failure(api) -> None:
    err = shaped(await api.post("/v1/jobs", json={"pool": "cpu", "command": ["", "x"]}, headers=AUTH),
                 422, "InvalidRequest")
    assert err["details"]["field"] == "command.0"


@pytest.mark.parametrize("tag", ["line\nbreak", "bell\x07", "del\x7f", "c1\x85", "x" * 256])
async def test_a_lease_tag_is_printable_and_at_most_255_characters(api, tag) -> None:
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["echo"], "lease_tag": tag}, headers=AUTH)
    shaped(r, 422, "InvalidRequest")
    assert api.h.store.list_jobs() == []


async def test_a_unicode_lease_tag_of_255_characters_is_accepted(api) -> None:
    tag = "notebook:/ü/" + "é" * 243
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["echo"], "lease_tag": tag}, headers=AUTH)
    assert r.status_code == 201 and r.json()["lease_tag"] == tag


async def test_an_argument_over_what_execve_takes_is_a_422_naming_the_limit(api) -> None:
    big = "x" * (limits.MAX_ARG_BYTES + 1)
    err = shaped(await api.post("/v1/jobs", json={"pool": "cpu", "command": ["echo", big]}, headers=AUTH),
                 422, "InvalidRequest")
    assert err["details"] == {"field": "command.1", "limit": limits.MAX_ARG_BYTES}
    ok = "é" * (limits.MAX_ARG_BYTES // 2)  # counted in UTF-8 bytes, not characters
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["echo", ok]}, headers=AUTH)
    assert r.status_code == 201, r.text


async def test_an_env_entry_over_what_execve_takes_is_a_422(api) -> None:
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["echo"],
                                         "env": {"BIG": "x" * limits.MAX_ENV_ENTRY_BYTES}}, headers=AUTH)
    err = shaped(r, 422, "InvalidRequest")
    assert err["details"] == {"field": "env.BIG", "limit": limits.MAX_ENV_ENTRY_BYTES}


async def test_argv_and_env_together_over_the_callers_budget_are_a_422(api) -> None:
    chunk = "x" * 100_000
    body = {"pool": "cpu", "command": ["echo", *[chunk] * 6], "env": {f"V{i}": chunk for i in range(5)}}
    err = shaped(await api.post("/v1/jobs", json=body, headers=AUTH), 422, "InvalidRequest")
    assert err["details"]["limit"] == limits.MAX_CALLER_EXEC_BYTES and "execve" in err["message"]
    assert api.h.store.list_jobs() == []


async def test_too_many_arguments_or_env_entries_are_a_422(api) -> None:
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["x"] * (limits.MAX_ARGV_ITEMS + 1)},
                       headers=AUTH)
    shaped(r, 422, "InvalidRequest")
    env = {f"V{i}": "1" for i in range(limits.MAX_ENV_ENTRIES + 1)}
    shaped(await api.post("/v1/jobs", json={"pool": "cpu", "command": ["x"], "env": env}, headers=AUTH),
           422, "InvalidRequest")


@pytest.mark.parametrize("timeout", ["-1", "0", "1e300", "NaN", "Infinity", "-Infinity", "604801"])
async def test_a_negative_zero_huge_or_non_finite_timeout_is_a_422(api, timeout) -> None:
    shaped(await submit_raw(api, f'{{"pool": "cpu", "command": ["echo"], "timeout_s": {timeout}}}'),
           422, "InvalidRequest")
    assert api.h.store.list_jobs() == []


async def test_steering_variables_are_dropped_with_a_reason_not_refused(api) -> None:
    env = {"LD_PRELOAD": "/w/evil.so", "FIREPOOL_CALLER": "root", "GCONV_PATH": "/w", "KEEP": "1"}
    r = await api.post("/v1/jobs", json={"pool": "cpu", "command": ["echo"], "env": env}, headers=AUTH)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["env"] == {"KEEP": "1"}
    assert {d["name"] for d in job["dropped_env"]} == {"LD_PRELOAD", "FIREPOOL_CALLER", "GCONV_PATH"}


async def test_a_body_over_the_request_limit_is_a_413_read_no_further(api) -> None:
    raw = json.dumps({"pool": "cpu", "command": ["echo", "x" * (5 << 20)]})
    shaped(await submit_raw(api, raw), 413, "RequestTooLarge")

    async def chunks():  # no Content-Length: counted as it arrives
        yield b'{"pool": "cpu", "command": ["echo", "'
        for _ in range(5):
            yield b"x" * (1 << 20)
        yield b'"]}'

    r = await api.post("/v1/jobs", content=chunks(), headers=JSON)
    shaped(r, 413, "RequestTooLarge")
    assert api.h.store.list_jobs() == []


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "application/xml"])
async def test_a_body_that_is_not_json_is_a_415(api, content_type) -> None:
    r = await api.post("/v1/jobs", content=b'{"pool": "cpu", "command": ["echo"]}',
                       headers={**AUTH, "Content-Type": content_type})
    shaped(r, 415, "UnsupportedMediaType")
    assert api.h.store.list_jobs() == []


@pytest.mark.parametrize("raw", [b"[" * 10_000 + b"]" * 10_000,
                                 b'{"pool": "cpu", "command": ["echo", "' + b"\xff\xfe" + b'"]}',
                                 b'{"pool": "cpu", "command": ' + b'{"a": ' * 10_000 + b"1" + b"}" * 10_000 + b"}"])
async def test_deep_nesting_and_invalid_utf8_are_a_422(api, raw) -> None:
    shaped(await submit_raw(api, raw), 422, "InvalidRequest")
    assert api.h.store.list_jobs() == []


async def test_an_unknown_route_is_a_shaped_404(api) -> None:
    shaped(await api.get("/v2/nothing", headers=AUTH), 404, "NotFound")


@pytest.mark.parametrize("method, path, allowed", [
    ("TRACE", "/v1/jobs", "GET, POST"), ("PUT", "/v1/jobs", "GET, POST"), ("DELETE", "/healthz", "GET"), ("POST", "/v1/packages/" + "0" * 64, "GET, HEAD, PUT"),
])
async def test_a_wrong_method_is_a_405_with_an_allow_header_naming_every_method(api, method, path, allowed) -> None:
    r = await api.request(method, path, headers=AUTH)
    shaped(r, 405, "MethodNotAllowed")
    assert r.headers["allow"] == allowed


async def test_an_unhandled_exception_is_a_shaped_500(api) -> None:
    err = shaped(await api.get("/boom"), 500, "InternalError")
    assert "RuntimeError" in err["message"] and "a bug" not in err["message"]


@pytest.mark.parametrize("query", ["offset=100000000000000000000000000000", "offset=-1", "attempt=99999999999999"])
async def test_a_log_offset_beyond_any_file_is_a_422_not_a_500(api, query) -> None:
    job = (await api.post("/v1/jobs", json={"pool": "cpu", "command": ["echo"]}, headers=AUTH)).json()
    shaped(await api.get(f"/v1/jobs/{job['id']}/logs?{query}", headers=AUTH), 422, "InvalidRequest")


async def test_a_log_offset_past_the_end_reads_nothing(api) -> None:
    job = await api.h.run_job(command=("echo", "hi"))
    r = await api.get(f"/v1/jobs/{job.id}/logs?offset={limits.MAX_LOG_OFFSET}&follow=false", headers=AUTH)
    assert r.status_code == 200 and r.content == b""


@pytest.mark.parametrize("url", ["/v1/jobs/j%00x", "/v1/jobs?before=a%00", "/v1/jobs?before=%ff%fe"])
async def test_nul_or_invalid_utf8_in_the_url_is_a_422(api, url) -> None:
    shaped(await api.get(url, headers=AUTH), 422, "InvalidRequest")


async def test_the_openapi_document_says_what_is_served() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        spec = create_app(h.cp, TokenAuth({ALICE: "alice"})).openapi()
    finally:
        await h.stop()
    paths = spec["paths"]
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert set(paths["/v1/jobs/{job_id}/logs"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    digest = next(p for p in paths["/v1/packages/{digest}"]["put"]["parameters"] if p["name"] == "digest")
    assert digest["schema"]["pattern"] == "^[0-9a-f]{64}$"
    signal = spec["components"]["schemas"]["SignalRequest"]["properties"]["signal"]
    assert {"INT", "TERM", "KILL", "SIGINT"} <= set(signal["enum"])
    for path, ops in paths.items():
        for method, op in ops.items():
            assert "default" in op["responses"], (method, path)
