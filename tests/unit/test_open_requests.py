"""Each caller's open requests are capped: one caller's held streams cannot take the broker from the others."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from broker.api.openrequests import OpenRequests, request_key


def _scope(kind: str = "http", headers: dict[str, str] | None = None, query: str = "", client: str = "10.0.0.1",
           extensions: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": kind, "method": "GET", "path": "/v1/jobs", "query_string": query.encode(),
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
            "client": (client, 5000), "extensions": extensions or {}}


class Held:
    """An app whose requests stay open until released, as a watch stream or a long poll does."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.entered += 1
        await self.release.wait()


async def _call(app: OpenRequests, scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"} if scope["type"] == "websocket" else {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


async def test_a_caller_past_its_open_requests_gets_429_while_another_caller_is_served() -> None:
    held = Held()
    app = OpenRequests(held, limit=2)
    alice = _scope(headers={"Authorization": "Bearer alice-token"})
    waiting = [asyncio.ensure_future(_call(app, alice)) for _ in range(2)]
    await asyncio.sleep(0)
    refused = await _call(app, alice)
    assert refused[0]["status"] == 429 and dict(refused[0]["headers"])[b"retry-after"] == b"1"
    error = json.loads(refused[1]["body"])["error"]
    assert error["class"] == "TooManyOpenRequests" and error["retryable"] is True and error["details"] == {"limit": 2}
    bob = asyncio.ensure_future(_call(app, _scope(headers={"Authorization": "Bearer bob-token"})))
    await asyncio.sleep(0)
    assert held.entered == 3
    held.release.set()
    await asyncio.gather(*waiting, bob)
    assert app.open == {}  # every request left the count as it ended


async def test_a_request_that_ended_frees_its_place() -> None:
    held = Held()
    app = OpenRequests(held, limit=1)
    held.release.set()
    for _ in range(3):
        assert await _call(app, _scope(headers={"Authorization": "Bearer t"})) == []
    assert held.entered == 3 and app.open == {}


async def test_a_websocket_past_the_limit_is_refused_with_a_429_or_closed_1013() -> None:
    held = Held()
    app = OpenRequests(held, limit=1)
    scope = _scope("websocket", query="token=abc")
    first = asyncio.ensure_future(_call(app, scope))
    await asyncio.sleep(0)
    closed = await _call(app, scope)
    assert closed == [{"type": "websocket.close", "code": 1013, "reason": "too many open requests"}]
    denied = await _call(app, {**scope, "extensions": {"websocket.http.response": {}}})
    assert denied[0]["type"] == "websocket.http.response.start" and denied[0]["status"] == 429
    held.release.set()
    await first


def test_the_key_is_the_requests_own_credential_else_its_address() -> None:
    bearer = request_key(_scope(headers={"Authorization": "Bearer secret-token"}))
    assert bearer == request_key(_scope(headers={"Authorization": "Bearer secret-token"}, client="10.9.9.9"))
    assert bearer != request_key(_scope(headers={"Authorization": "Bearer other-token"}))
    assert len(bearer) == 16 and b"secret" not in bearer  # a digest: the credential itself is not kept
    e2b = request_key(_scope(headers={"X-API-Key": "k"}))
    assert e2b != request_key(_scope(headers={"X-Access-Token": "k"}))
    dashboard = request_key(_scope(headers={"Cookie": "theme=dark; firepool_session=s1"}))
    assert dashboard == request_key(_scope(headers={"Cookie": "firepool_session=s1"}))
    assert dashboard != request_key(_scope(headers={"Cookie": "firepool_session=s2"}))
    assert request_key(_scope(query="token=q")) != request_key(_scope(query="token=r"))
    assert request_key(_scope(headers={"Cookie": "theme=dark"})) == b"address:10.0.0.1"
    assert request_key(_scope(headers={"Cookie": "bad\x00cookie=;;"})) == b"address:10.0.0.1"
