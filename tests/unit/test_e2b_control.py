"""The E2B control plane's validation and bookkeeping, with the kernel start and the session end faked: what
the official SDK sends is accepted, anything else is refused in E2B's error shape, callers are kept apart."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import pytest

from broker.api.auth import TokenAuth
from broker.api.e2b.control import Control
from broker.api.e2b.http import HttpError, Request
from broker.api.e2b.sandboxes import META_ENV, Sandbox
from broker.api.e2b.service import Service
from broker.gateway.kernels import RECYCLE_ENV, SESSION_ENV, GatewayKernel, GatewaySettings
from broker.pools import default_catalog

TOKENS = {"e2b_" + "a" * 40: "alice", "e2b_" + "b" * 40: "bob"}
ALICE, BOB = list(TOKENS)


class FakeKernels:
    settings = GatewaySettings()

    def __init__(self) -> None:
        self.started: list[tuple[str, str, dict[str, str]]] = []
        self.shut: list[str] = []

    async def start(self, caller: str, spec: str, env: dict[str, str], ready: Any = None) -> GatewayKernel:
        self.started.append((caller, spec, dict(env)))
        return GatewayKernel(id=f"k{len(self.started)}", caller=caller, name=spec, pool=spec.removeprefix("firepool-"),
                             tag=env[SESSION_ENV], env=dict(env))

    async def shutdown(self, caller: str, kernel_id: str) -> None:
        self.shut.append(kernel_id)

    async def adopt(self) -> None:
        pass

    def live(self) -> list[GatewayKernel]:
        return []


class FakeSessions:
    def __init__(self) -> None:
        self.ended: list[tuple[str, str]] = []

    async def end_session(self, caller: str, tag: str, queue: str = "default") -> dict[str, Any]:
        self.ended.append((caller, tag))
        return {}


@pytest.fixture
def plane() -> tuple[Control, FakeKernels, FakeSessions, list[float]]:
    kernels, sessions, clock = FakeKernels(), FakeSessions(), [1000.0]
    service = Service(sessions, kernels, lambda: default_catalog(0).pools, now=lambda: clock[0])  # type: ignore[arg-type]
    return Control(service, TokenAuth(TOKENS)), kernels, sessions, clock


async def call(control: Control, method: str, path: str, body: Any = None, key: str | None = ALICE,
               query: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    raw = b"" if body is None else json.dumps(body).encode()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"x-api-key", key.encode())] if key else []
    scope = {"method": method, "headers": headers, "query_string": urlencode(query or {}).encode()}
    try:
        await control.handle(Request.of(scope, receive, path), send)
    except HttpError as exc:
        return exc.status, {"code": exc.status, "message": exc.message}, {}
    start, end = sent[0], sent[1]
    heads = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], json.loads(end["body"]) if end["body"] else None, heads


async def test_create_answers_201_with_what_the_sdk_requires_and_holds_the_session(plane: Any) -> None:
    control, kernels, _, _ = plane
    status, body, _ = await call(control, "POST", "/v2/sandboxes",
                                 {"templateID": "cpu", "timeout": 120, "metadata": {"a": "1"}, "envVars": {}})
    assert status == 201
    assert {"templateID", "sandboxID", "clientID", "envdVersion", "envdAccessToken", "trafficAccessToken"} <= set(body)
    caller, spec, env = kernels.started[0]
    assert (caller, spec) == ("alice", "firepool-cpu")
    assert env[SESSION_ENV] == body["sandboxID"] and env[RECYCLE_ENV] == "0"
    record = json.loads(env[META_ENV])
    assert body["envdAccessToken"] not in env[META_ENV] and record["metadata"] == {"a": "1"}


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"templateID": "gpu-xl"}, 400, "unknown template 'gpu-xl'"),
    ({}, 400, "templateID"),
    ({"templateID": "cpu", "colour": "red"}, 400, "unknown field"),
    ({"templateID": "cpu", "timeout": -1}, 400, "timeout"),
    ({"templateID": "cpu", "timeout": True}, 400, "timeout"),
    ({"templateID": "cpu", "metadata": {"a": 1}}, 400, "metadata"),
    ({"templateID": "cpu", "autoPause": True}, 501, "auto-pause is not supported by Firepool"),
    ({"templateID": "cpu", "volumeMounts": [{"name": "v", "path": "/v"}]}, 501, "volumes"),
    ({"templateID": "cpu", "allow_internet_access": False}, 501, "not supported"),
])
async def test_a_create_firepool_cannot_honour_is_refused_in_e2b_shape(plane: Any, body: Any, status: int,
                                                                      words: str) -> None:
    control, kernels, _, _ = plane
    got, answer, _ = await call(control, "POST", "/v2/sandboxes", body)
    assert got == status and answer["code"] == status and words in answer["message"]
    assert not kernels.started


async def test_a_missing_or_unknown_api_key_is_401(plane: Any) -> None:
    control = plane[0]
    assert (await call(control, "POST", "/v2/sandboxes", {"templateID": "cpu"}, key=None))[0] == 401
    assert (await call(control, "GET", "/v2/sandboxes", key="e2b_" + "c" * 40))[0] == 401


async def test_another_callers_sandbox_is_a_404_like_an_unknown_one(plane: Any) -> None:
    control, _, sessions, _ = plane
    sid = (await call(control, "POST", "/v2/sandboxes", {"templateID": "cpu"}))[1]["sandboxID"]
    for method, path, body in (("GET", f"/sandboxes/{sid}", None), ("POST", f"/v2/sandboxes/{sid}/connect", {}),
                               ("POST", f"/sandboxes/{sid}/timeout", {"timeout": 5}), ("DELETE", f"/sandboxes/{sid}", None)):
        assert (await call(control, method, path, body, key=BOB))[0] == 404
        assert (await call(control, method, path.replace(sid, "e2b-0000000000000000"), body))[0] == 404
    assert not sessions.ended
    assert (await call(control, "DELETE", f"/sandboxes/{sid}"))[0] == 204
    assert sessions.ended == [("alice", sid)]


async def test_timeouts_move_the_end_and_the_sweeper_ends_the_session(plane: Any) -> None:
    control, kernels, sessions, clock = plane
    sid = (await call(control, "POST", "/v2/sandboxes", {"templateID": "cpu", "timeout": 10}))[1]["sandboxID"]
    info = (await call(control, "GET", f"/sandboxes/{sid}"))[1]
    assert info["state"] == "running" and info["endAt"] == "1970-01-01T00:16:50Z"
    await call(control, "POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 5})  # shorter: kept
    await call(control, "POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 60})
    assert (await call(control, "GET", f"/sandboxes/{sid}"))[1]["endAt"] == "1970-01-01T00:17:40Z"
    assert (await call(control, "POST", f"/sandboxes/{sid}/timeout", {"timeout": 2}))[0] == 204
    clock[0] += 3
    assert await control.service.registry.sweep() == [sid]
    assert sessions.ended == [("alice", sid)] and kernels.shut == ["k1"]
    assert (await call(control, "GET", f"/sandboxes/{sid}"))[0] == 404


async def test_list_filters_by_metadata_and_pages_with_x_next_token(plane: Any) -> None:
    control = plane[0]
    ids = [(await call(control, "POST", "/v2/sandboxes", {"templateID": "cpu", "metadata": {"team": t}}))[1]["sandboxID"]
           for t in ("x", "y", "x")]
    await call(control, "POST", "/v2/sandboxes", {"templateID": "cpu", "metadata": {"team": "x"}}, key=BOB)
    status, rows, _ = await call(control, "GET", "/v2/sandboxes", query={"metadata": urlencode({"team": "x"})})
    assert status == 200 and sorted(r["sandboxID"] for r in rows) == sorted([ids[0], ids[2]])
    _, first, heads = await call(control, "GET", "/v2/sandboxes", query={"limit": "2"})
    assert len(first) == 2 and heads["x-next-token"]
    _, rest, heads = await call(control, "GET", "/v2/sandboxes", query={"limit": "2", "nextToken": heads["x-next-token"]})
    assert len(rest) == 1 and "x-next-token" not in heads
    assert {r["sandboxID"] for r in first + rest} == set(ids)
    assert (await call(control, "GET", "/v2/sandboxes", query={"state": "paused"}))[1] == []


@pytest.mark.parametrize("path", ["/sandboxes/e2b-1/pause", "/sandboxes/e2b-1/snapshots", "/templates",
                                  "/v3/templates", "/sandboxes/e2b-1/metrics", "/volumes"])
async def test_what_does_not_map_is_501_naming_the_feature(plane: Any, path: str) -> None:
    status, body, _ = await call(plane[0], "POST", path, {})
    assert status == 501 and body["message"].endswith("is not supported by Firepool")


def test_a_sandbox_accepts_its_own_tokens_only_and_its_record_carries_digests() -> None:
    sbx = Sandbox(id="e2b-1", caller="alice", template="cpu", metadata={}, envs={}, started_at=0, end_at=1)
    sbx.mint_tokens()
    assert sbx.token and sbx.accepts(sbx.token) and not sbx.accepts(sbx.token + "x") and not sbx.accepts(None)
    assert sbx.traffic_token and sbx.accepts(sbx.traffic_token, traffic=True) and not sbx.accepts(sbx.traffic_token)
    again = Sandbox.from_record("alice", sbx.record(), {})
    assert again is not None and again.token is None and again.accepts(sbx.token)
    assert sbx.token not in sbx.record()


def test_token_add_e2b_makes_an_e2b_shaped_ordinary_token(tmp_path: Any) -> None:
    import re

    from broker.api.auth import add_token

    path = tmp_path / "tokens.json"
    token = add_token(path, "alice", e2b=True)
    assert re.fullmatch(r"e2b_[0-9a-f]{40}", token)
    assert TokenAuth.from_file(path).identify(f"Bearer {token}").caller == "alice"
    assert token not in path.read_text()


def test_firepool_e2b_env_quotes_what_it_prints() -> None:
    from broker.cli_e2b import env_lines

    assert env_lines("http://h:1/", "") == ["export E2B_API_URL=http://h:1/e2b",
                                            "export E2B_SANDBOX_URL=http://h:1/e2b/sandbox"]
    assert env_lines("http://h:1", "a b")[-1] == "export E2B_API_KEY='a b'"


async def test_get_host_names_the_port_proxys_host_form_under_port_domain() -> None:
    from broker.api.portlinks import host_label, parse_host

    kernels, sessions = FakeKernels(), FakeSessions()
    service = Service(sessions, kernels, lambda: default_catalog(0).pools)  # type: ignore[arg-type]
    control = Control(service, TokenAuth(TOKENS), "ports.example.com.")
    _, body, _ = await call(control, "POST", "/v2/sandboxes", {"templateID": "cpu"})
    assert body["domain"] == "ports.example.com"
    sdk_host = f"8080-{body['sandboxID']}.{body['domain']}"  # what e2b's Sandbox.get_host(8080) builds
    assert host_label(body["sandboxID"], 8080) == sdk_host.split(".")[0]
    assert parse_host(sdk_host, "ports.example.com") == (body["sandboxID"], 8080)
    assert (await call(plane_without_domain(), "POST", "/v2/sandboxes", {"templateID": "cpu"}))[1]["domain"] is None


def plane_without_domain() -> Control:
    service = Service(FakeSessions(), FakeKernels(), lambda: default_catalog(0).pools)  # type: ignore[arg-type]
    return Control(service, TokenAuth(TOKENS))
