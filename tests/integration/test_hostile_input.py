"""Hostile input against a real broker: every case a typed 4xx in the one error shape, nothing stored, and
the broker healthy afterwards; what the door admits at its limits launches and runs.

Package archives (zip bombs, symlinks, `..`, special files) are the same corpus as tests/unit/test_packages.py,
sent here over a real socket to a real package store.
"""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from firepool_agent import limits
from tests.integration.conftest import BrokerProcess, run_job
from tests.unit.test_packages import BAD_ARCHIVES

pytestmark = pytest.mark.integration

MAX_REQUEST = 256 << 10
"""This broker's --max-request-bytes: small, so the size cases stay cheap."""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("hostile") / "broker",
                      extra=("--max-request-bytes", str(MAX_REQUEST), "--package-max-bytes", str(64 << 10),
                             "--package-max-extracted", str(256 << 10)))
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def c(broker: BrokerProcess) -> Iterator[httpx.Client]:
    client = broker.client()
    before = stored(client)
    yield client
    assert stored(client) == before, "a refused request stored a job"
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json()["ok"], health.text


def stored(client: httpx.Client) -> list[str]:
    return [j["id"] for j in client.get("/v1/jobs", params={"limit": 1000}).json()["jobs"]]


def shaped(r: httpx.Response, status: int, cls: str) -> dict:
    assert r.status_code == status, r.text[:500]
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"class", "message", "retryable", "details"}
    assert body["error"]["class"] == cls and body["error"]["retryable"] is False, body
    return body["error"]


def post_raw(c: httpx.Client, raw: bytes, content_type: str = "application/json") -> httpx.Response:
    return c.post("/v1/jobs", content=raw, headers={"Content-Type": content_type})


JOB = {"pool": "cpu", "command": ["true"]}
BIG = "x" * (50 << 20)

# name: (raw body, expected status, expected class)
CORPUS: dict[str, tuple[bytes, int, str]] = {
    "50 MB argv": (json.dumps({**JOB, "command": ["echo", BIG]}).encode(), 413, "RequestTooLarge"),
    "50 MB env value": (json.dumps({**JOB, "env": {"A": BIG}}).encode(), 413, "RequestTooLarge"),
    "argument over execve's 128 KiB": (json.dumps({**JOB, "command": ["echo", "x" * limits.MAX_ARG_STRLEN]}).encode(),
                                       422, "InvalidRequest"),
    "env entry over execve's 128 KiB": (json.dumps({**JOB, "env": {"A": "x" * limits.MAX_ARG_STRLEN}}).encode(),
                                        422, "InvalidRequest"),
    "too many arguments": (json.dumps({**JOB, "command": ["x"] * (limits.MAX_ARGV_ITEMS + 1)}).encode(),
                           422, "InvalidRequest"),
    "huge lease_tag": (json.dumps({**JOB, "lease_tag": "t" * 100_000}).encode(), 422, "InvalidRequest"),
    "lone surrogate in command": (b'{"pool": "cpu", "command": ["echo", "\\ud800"]}', 422, "InvalidRequest"),
    "lone surrogate in env": (b'{"pool": "cpu", "command": ["true"], "env": {"A": "\\udc80"}}', 422, "InvalidRequest"),
    "NUL in an argument": (json.dumps({**JOB, "command": ["echo", "a\x00b"]}).encode(), 422, "InvalidRequest"),
    "NUL in env": (json.dumps({**JOB, "env": {"A": "a\x00b"}}).encode(), 422, "InvalidRequest"),
    "NUL in lease_tag": (json.dumps({**JOB, "lease_tag": "a\x00b"}).encode(), 422, "InvalidRequest"),
    "control character in lease_tag": (json.dumps({**JOB, "lease_tag": "a\nb"}).encode(), 422, "InvalidRequest"),
    "negative timeout": (json.dumps({**JOB, "timeout_s": -1}).encode(), 422, "InvalidRequest"),
    "huge timeout": (json.dumps({**JOB, "timeout_s": 1e300}).encode(), 422, "InvalidRequest"),
    "infinite timeout": (b'{"pool": "cpu", "command": ["true"], "timeout_s": Infinity}', 422, "InvalidRequest"),
    "pods above the ceiling": (json.dumps({**JOB, "pods": 1000}).encode(), 400, "Unschedulable"),
    "JSON nested 10,000 levels": (b"[" * 10_000 + b"]" * 10_000, 422, "InvalidRequest"),
    "JSON object nested 10,000 levels": (b'{"pool": "cpu", "command": ' + b'{"a": ' * 10_000 + b"1" + b"}" * 10_001,
                                         422, "InvalidRequest"),
    "invalid UTF-8": (b'{"pool": "cpu", "command": ["echo", "\xff\xfe\xc0"]}', 422, "InvalidRequest"),
    "not JSON at all": (b"\x00\x01\x02 binary", 422, "InvalidRequest"),
    "an empty program name": (json.dumps({**JOB, "command": [""]}).encode(), 422, "InvalidRequest"),
}


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_hostile_job_request_is_a_typed_4xx_and_stores_nothing(c: httpx.Client, case: str) -> None:
    raw, status, cls = CORPUS[case]
    shaped(post_raw(c, raw), status, cls)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/zip"])
def test_a_job_body_that_is_not_json_is_a_415(c: httpx.Client, content_type: str) -> None:
    shaped(post_raw(c, json.dumps(JOB).encode(), content_type), 415, "UnsupportedMediaType")


def test_a_chunked_body_over_the_limit_is_cut_off_with_a_413(c: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"pool": "cpu", "command": ["echo", "'
        for _ in range(16):
            yield b"x" * (64 << 10)
        yield b'"]}'

    shaped(c.post("/v1/jobs", content=chunks(), headers={"Content-Type": "application/json"}),
           413, "RequestTooLarge")


def test_a_lying_content_length_is_refused_before_the_body_is_read(broker: BrokerProcess, c: httpx.Client) -> None:
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + broker.tokens["alice"].encode() + b"\r\n"
                  b"Content-Length: 10000000000\r\n\r\n{")
        chunks = []
        while chunk := s.recv(65536):  # the broker closes the connection after its answer
            chunks.append(chunk)
        reply = b"".join(chunks).decode("latin-1")
    assert reply.startswith("HTTP/1.1 413") and '"RequestTooLarge"' in reply


@pytest.mark.parametrize("url, status, cls", [
    ("/v1/jobs/j0000000000000000000/logs?offset=100000000000000000000000", 422, "InvalidRequest"),
    ("/v1/jobs?before=%00", 422, "InvalidRequest"),
    ("/v1/jobs/%00", 422, "InvalidRequest"),
    ("/v1/jobs?state=%ff", 422, "InvalidRequest"),
    ("/v2/jobs", 404, "NotFound"),
    ("/v1/packages/not-a-digest", 422, "InvalidRequest"),
])
def test_hostile_urls_are_typed_4xx(c: httpx.Client, url: str, status: int, cls: str) -> None:
    shaped(c.get(url), status, cls)


def test_trace_and_other_methods_are_405_with_allow(c: httpx.Client) -> None:
    for method, path in (("TRACE", "/v1/jobs"), ("DELETE", "/v1/jobs"), ("PATCH", "/healthz")):
        r = c.request(method, path)
        shaped(r, 405, "MethodNotAllowed")
        assert r.headers["allow"] in ("GET, POST", "GET"), r.headers


@pytest.mark.parametrize("case", sorted(set(BAD_ARCHIVES) - {"too many entries"}))  # no CLI flag for the entry cap
def test_hostile_package_is_refused_and_not_stored(c: httpx.Client, case: str) -> None:
    data, status, cls = BAD_ARCHIVES[case]
    digest = hashlib.sha256(data).hexdigest()
    r = c.put(f"/v1/packages/{digest}", content=data, headers={"Content-Type": "application/zip"})
    shaped(r, status, cls)
    assert c.head(f"/v1/packages/{digest}").status_code == 404


def test_a_package_over_its_cap_is_a_413_and_a_json_one_a_400(c: httpx.Client) -> None:
    big = b"PK" + b"\0" * (128 << 10)
    shaped(c.put(f"/v1/packages/{hashlib.sha256(big).hexdigest()}", content=big,
                 headers={"Content-Type": "application/zip"}), 413, "PayloadTooLarge")
    shaped(c.put("/v1/packages/" + "0" * 64, content=b"{}", headers={"Content-Type": "application/json"}),
           400, "PackageError")


def test_loader_and_agent_variables_are_dropped_and_never_reach_the_job(broker: BrokerProcess) -> None:
    c = broker.client()
    env = {"LD_PRELOAD": "/nonexistent/evil.so", "LD_LIBRARY_PATH": "/evil", "FIREPOOL_CALLER": "root",
           "FIREPOOL_ATTEMPT_ID": "forged", "GCONV_PATH": "/evil", "CUDA_VISIBLE_DEVICES": "0,1", "MINE": "kept"}
    job = run_job(c, {"pool": "cpu", "command": ["sh", "-c", "env"], "env": env})
    assert job["state"] == "SUCCEEDED", job
    assert {d["name"] for d in job["dropped_env"]} == set(env) - {"MINE"}
    out = c.get(f"/v1/jobs/{job['id']}/logs", params={"follow": "false"}).text
    seen = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert seen["MINE"] == "kept" and seen["FIREPOOL_CALLER"] == "alice"
    assert "LD_PRELOAD" not in seen and "GCONV_PATH" not in seen and seen["FIREPOOL_ATTEMPT_ID"] != "forged"


def test_what_the_door_admits_at_its_limits_launches(broker_factory, tmp_path: Path) -> None:
    big = broker_factory("roomy", extra=("--max-request-bytes", str(2 << 20)))
    c = big.client()
    arg = "a" * limits.MAX_ARG_BYTES
    argv = ["sh", "-c", 'echo "$#" "${#1}" "${#BIG}"', "sh", *[arg] * 6]
    env = {"BIG": "b" * (limits.MAX_ENV_ENTRY_BYTES - 4)}
    assert limits.exec_bytes(argv, env) <= limits.MAX_CALLER_EXEC_BYTES
    job = run_job(c, {"pool": "cpu", "command": argv, "env": env})
    assert job["state"] == "SUCCEEDED", job
    out = c.get(f"/v1/jobs/{job['id']}/logs", params={"follow": "false"}).text.split()
    assert out == ["6", str(limits.MAX_ARG_BYTES), str(limits.MAX_ENV_ENTRY_BYTES - 4)]
    offset = c.get(f"/v1/jobs/{job['id']}/logs", params={"follow": "false", "offset": limits.MAX_LOG_OFFSET})
    assert offset.status_code == 200 and offset.content == b""
