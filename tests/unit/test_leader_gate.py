"""A standby serves its role and nothing else: NotLeader (503, Retry-After 0) naming the leader on every other
route, websockets closed with 1013 before they are accepted; a leader passes everything through."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from broker.api.leading import LeaderGate, Leadership
from broker.fencing import Term


async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"served"})


def call(gate: LeaderGate, kind: str, path: str) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    asyncio.run(gate({"type": kind, "path": path}, receive, send))
    return sent


def standby(url: str | None = "http://10.0.0.7:8000", term: int = 4) -> Leadership:
    return Leadership(Term(), leading=False, leader=lambda: (url, term))


def test_a_standby_answers_not_leader_naming_the_leader_and_its_term() -> None:
    start, body = call(LeaderGate(inner, standby()), "http", "/v1/jobs")
    assert start["status"] == 503 and (b"retry-after", b"0") in start["headers"]
    error = json.loads(body["body"])["error"]
    assert error["class"] == "NotLeader" and error["retryable"] is True
    assert error["details"] == {"leader": "http://10.0.0.7:8000", "term": 4}


def test_a_standby_with_no_leader_says_so() -> None:
    _, body = call(LeaderGate(inner, standby(None, 0)), "http", "/ui/")
    error = json.loads(body["body"])["error"]
    assert error["details"]["leader"] is None and "no broker leads" in error["message"]


def test_a_standby_serves_its_role_routes() -> None:
    for path in ("/healthz", "/readyz"):
        assert call(LeaderGate(inner, standby()), "http", path)[1]["body"] == b"served"


def test_a_standby_closes_a_websocket_with_try_again_later() -> None:
    (close,) = call(LeaderGate(inner, standby()), "websocket", "/api/kernels/k/channels")
    assert close["type"] == "websocket.close" and close["code"] == 1013


def test_a_leader_passes_every_route_through() -> None:
    assert call(LeaderGate(inner, Leadership()), "http", "/v1/jobs")[1]["body"] == b"served"


def test_a_standby_reports_the_newest_term_it_knows_and_a_leader_its_own() -> None:
    assert standby(term=9).current_term == 9
    assert Leadership(Term(3)).current_term == 3
