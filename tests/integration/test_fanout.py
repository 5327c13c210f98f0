"""Fan-out against a real broker and real sandboxes: 200 jobs through `map` (sync in input order, async as they
finish), a Python function mapped over inputs as packaged calls, a refused batch naming its bad item and storing
nothing, an unknown id refused before any stream, and `firepool submit --from` as a real subprocess."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from broker.client import AsyncClient, Client
from broker.errors import InvalidRequest, NotFound
from broker.fanout_calls import CallFailed
from broker.retrying import RetryPolicy
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "broker.cli"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("fanout") / "state")
    try:
        yield b
    finally:
        b.stop()


def test_two_hundred_jobs_through_map_come_back_in_input_order(broker: BrokerProcess) -> None:
    with Client(broker.url, broker.tokens["alice"]) as fp:
        jobs = list(fp.map([["echo", f"job {i}"] for i in range(200)], "cpu", lease_tag="fan", timeout=300))
        assert len({j.id for j in jobs}) == 200 and {j.state for j in jobs} == {"SUCCEEDED"}
        assert [fp.logs(jobs[i].id) for i in (0, 137, 199)] == ["job 0\n", "job 137\n", "job 199\n"]


def test_two_hundred_jobs_through_the_async_map_come_back_as_they_finish(broker: BrokerProcess) -> None:
    async def fan_out() -> list[str]:
        async with AsyncClient(broker.url, broker.tokens["alice"]) as fp:
            items = [["sh", "-c", f"exit {i % 2}"] for i in range(200)]
            done = [j async for j in fp.map(items, "cpu", ordered=False, lease_tag="fan", timeout=300)]
            assert [j.state for j in done].count("FAILED") == 100 and all(j.terminal for j in done)
            return [j.id for j in done]

    finished = asyncio.run(fan_out())
    assert len(set(finished)) == 200


SOURCE = """
def square(x):
    print("working on", x)
    return {"x": x, "square": x * x}

def picky(x):
    if x == 2:
        raise ValueError("two is not allowed")
    return x
"""


@pytest.fixture
def module(tmp_path: Path) -> Iterator[ModuleType]:
    (tmp_path / "fanwork.py").write_text(SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("fanwork")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("fanwork", None)


def test_a_function_maps_over_inputs_as_packaged_calls(broker: BrokerProcess, module: ModuleType) -> None:
    with Client(broker.url, broker.tokens["alice"]) as fp:  # the session of the jobs above: its pods are warm
        assert list(fp.map(module.square, [1, 2, 3], "cpu", lease_tag="fan", timeout=120)) == [
            {"x": 1, "square": 1}, {"x": 2, "square": 4}, {"x": 3, "square": 9}]
        results = fp.map(module.picky, [1, 2, 3], lease_tag="fan", timeout=120)
        assert next(results) == 1
        with pytest.raises(CallFailed, match="input 1 failed in job .*two is not allowed") as failed:
            next(results)
    assert "Traceback" in failed.value.log_tail and failed.value.job.state == "FAILED"


def test_a_bad_item_refuses_the_whole_batch_by_its_index_and_stores_nothing(broker: BrokerProcess) -> None:
    with Client(broker.url, broker.tokens["alice"]) as fp:
        before = len(fp.jobs(limit=1000))
        with pytest.raises(InvalidRequest) as refused:
            fp.submit_many([["true"], ["true"], {"command": ["true"], "pods": 0}, ["true"]])
        assert refused.value.details["index"] == 2
        assert len(fp.jobs(limit=1000)) == before
        with pytest.raises(NotFound):
            next(fp.as_completed(["j-does-not-exist"]))
    with Client(broker.url, broker.tokens["bob"]) as bob, Client(broker.url, broker.tokens["alice"]) as alice:
        theirs = alice.submit_many([["true"]])
        with pytest.raises(NotFound):
            next(bob.as_completed(theirs))


def test_submit_from_a_file_prints_a_line_per_job_in_order_and_exits_1_when_one_failed(
        broker: BrokerProcess, tmp_path: Path) -> None:
    source = tmp_path / "jobs.jsonl"
    source.write_text('["sh", "-c", "sleep 1; echo slow"]\n\n{"command": ["false"]}\n["echo", "fast"]\n')
    r = subprocess.run([*CLI, "submit", "--from", str(source), "--tag", "fan", "--timeout", "60"],
                       env=broker.env(), capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    assert r.returncode == 1 and len(lines) == 3, (r.stdout, r.stderr)
    assert [line.split()[1:3] for line in lines] == [["SUCCEEDED", "exit=0"], ["FAILED", "exit=1"],
                                                     ["SUCCEEDED", "exit=0"]]
    assert "3/3 done, 1 failed" in r.stderr.splitlines()[-1] and "Traceback" not in r.stderr

    piped = subprocess.run([*CLI, "submit", "--from", "-", "--json", "--tag", "fan", "--env", "GREETING=hi"],
                           env=broker.env(),
                           input='["sh", "-c", "echo $GREETING"]\n["true"]\n', capture_output=True, text=True,
                           timeout=120)
    jobs = [json.loads(line) for line in piped.stdout.splitlines()]
    assert piped.returncode == 0 and [j["state"] for j in jobs] == ["SUCCEEDED", "SUCCEEDED"], piped.stderr
    with Client(broker.url, broker.tokens["alice"]) as fp:
        assert fp.logs(jobs[0]["id"]) == "hi\n"

    source.write_text('["true"]\n\n{"command": ["true"], "pods": 0}\n')
    refused = subprocess.run([*CLI, "submit", "--from", str(source)], env=broker.env(), capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1 and refused.stdout == "" and len(refused.stderr.splitlines()) == 1
    assert f"InvalidRequest: --from {source} line 3:" in refused.stderr


def test_a_watch_whose_broker_was_killed_resumes_on_the_restarted_one_and_misses_no_job(
        broker: BrokerProcess) -> None:
    with Client(broker.url, broker.tokens["alice"], retry=RetryPolicy(attempts=10)) as fp:
        watches: list[httpx.Request] = []
        fp._http.event_hooks["request"] = [lambda r: watches.append(r) if r.url.path == "/v1/jobs:watch" else None]
        jobs = fp.submit_many([["sleep", "4"], ["sleep", "4"], ["true"]], lease_tag="fan")
        finished = fp.as_completed(jobs, timeout=120)
        first = next(finished)  # the watch stream is open, and stays so while the broker dies
        broker.kill()
        broker.start()  # pods are their own sessions: the jobs run on and the new broker recovers them
        rest = list(finished)
    assert first.id == jobs[2].id and sorted(j.id for j in rest) == sorted(j.id for j in jobs[:2])
    assert {j.state for j in [first, *rest]} == {"SUCCEEDED"}
    assert [sorted(json.loads(w.content)["ids"]) for w in watches][-1] == sorted(j.id for j in jobs[:2])
    assert len(watches) >= 2  # the first stream broke with its broker; the resumed one asked for what was left
