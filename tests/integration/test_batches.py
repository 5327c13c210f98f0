"""Batches over REST on a real broker: `POST /v1/jobs:batch` is all or nothing, `POST /v1/jobs:watch` streams each
result as it ends, and a batch submitted across a broker SIGKILL runs every item exactly once."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from firepool_agent.ledger import read_ledger
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration

POOLS = "pools:\n  - {name: cpu, min_count: 4, max_count: 4, max_idle_count: 4, idle_timeout: 600, step: 4}\n"


def sse(response: httpx.Response) -> Iterator[tuple[str, dict]]:
    """(event, data) of a Server-Sent Events stream."""
    event = ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            yield event, json.loads(line[6:])


def watch(c: httpx.Client, ids: list[str], wait_s: float = 120) -> tuple[list[dict], list[str]]:
    """The jobs as the stream handed them over, and the ids its `end` said were still pending."""
    ended: list[dict] = []
    with c.stream("POST", "/v1/jobs:watch", json={"ids": ids, "wait_s": wait_s}) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        for event, data in sse(response):
            if event == "job":
                ended.append(data)
            elif event == "end":
                return ended, data["pending"]
    raise AssertionError("the stream closed without an end event")


def test_a_batch_runs_every_item_and_the_watch_hands_each_back_once(broker_factory) -> None:
    broker: BrokerProcess = broker_factory(pools=POOLS)
    c = broker.client()
    r = c.post("/v1/jobs:batch", json={"jobs": [{"command": ["true"], "lease_tag": f"t{i % 3}"} for i in range(300)]})
    assert r.status_code == 201, r.text
    body = r.json()
    ids = [job["id"] for job in body["jobs"]]
    assert body["created"] == 300 and len(set(ids)) == 300
    ended, pending = watch(c, ids)
    assert pending == [] and sorted(j["id"] for j in ended) == sorted(ids)
    assert {j["state"] for j in ended} == {"SUCCEEDED"}
    finished = [j["timings"]["finished_at"] for j in ended]
    assert finished == sorted(finished)  # in the order they ended


def test_a_bad_item_refuses_the_whole_batch_and_names_its_index(broker: BrokerProcess) -> None:
    c = broker.client()
    items: list[dict] = [{"command": ["true"]} for _ in range(4)]
    items[2]["colour"] = "red"
    r = c.post("/v1/jobs:batch", json={"jobs": items})
    assert r.status_code == 422 and r.json()["error"]["class"] == "UnknownField", r.text
    assert r.json()["error"]["details"] == {"field": "jobs.2.colour", "index": 2}
    items[2] = {"command": ["true"], "pool": "nope"}
    r = c.post("/v1/jobs:batch", json={"jobs": items})
    assert r.json()["error"]["class"] == "UnknownPool" and r.json()["error"]["details"]["index"] == 2
    r = c.post("/v1/jobs:batch", json={"jobs": [{"command": ["true"]}] * 1001})
    assert r.status_code == 422 and r.json()["error"]["details"]["field"] == "jobs", r.text
    assert c.get("/v1/jobs").json()["jobs"] == []  # nothing of the refused batches was stored


def test_a_watch_ends_at_its_wait_naming_what_still_runs_and_knows_only_the_callers_jobs(broker: BrokerProcess) -> None:
    c = broker.client()
    (slow,) = c.post("/v1/jobs:batch", json={"jobs": [{"command": ["sleep", "30"]}]}).json()["jobs"]
    t0 = time.monotonic()
    ended, pending = watch(c, [slow["id"]], wait_s=1.0)
    assert ended == [] and pending == [slow["id"]] and time.monotonic() - t0 < 10
    r = broker.client("bob").post("/v1/jobs:watch", json={"ids": [slow["id"]]})
    assert r.status_code == 404 and r.json()["error"]["class"] == "NotFound"
    c.post(f"/v1/jobs/{slow['id']}/cancel")


def test_a_batch_submitted_across_a_broker_sigkill_runs_every_item_exactly_once(broker_factory) -> None:
    broker: BrokerProcess = broker_factory(pools=POOLS)
    c = broker.client()
    r = c.post("/v1/jobs:batch", json={"jobs": [{"command": ["sleep", "0.05"]} for _ in range(150)]})
    ids = [job["id"] for job in r.json()["jobs"]]
    deadline = time.monotonic() + 60
    with c.stream("POST", "/v1/jobs:watch", json={"ids": ids, "wait_s": 60}) as response:
        seen = 0
        for event, _ in sse(response):
            seen += event == "job"
            if seen >= 20 or time.monotonic() > deadline:
                break
    broker.kill()  # mid-batch: some jobs ended, some run, most are queued
    broker.start()
    c = broker.client()
    ended, pending = watch(c, ids)
    assert pending == [] and {j["state"] for j in ended} == {"SUCCEEDED"}, Counter(j["state"] for j in ended)
    started = Counter(str(r["attempt"]).split(":")[0] for r in read_ledger((broker.state_dir / "ledger").glob("*.jsonl")))
    assert set(started) == set(ids) and set(started.values()) == {1}, [k for k, v in started.items() if v != 1]
