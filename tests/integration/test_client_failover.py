"""Clients follow the leader over real sockets: stub broker processes over one store (tests/brokerstub.py),
a dead URL first in FIREPOOL_URL's list, a standby that names the leader, and a leader SIGKILLed while a
client waits on it: the wait is asked again of the broker elected next."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import AsyncClient, Client, JobInfo
from broker.retrying import RetryPolicy
from tests.brokerstub import StubBrokers, stub_brokers

pytestmark = pytest.mark.integration

RETRY = RetryPolicy(attempts=6, base=0.1, cap=0.5)
"""About 1.5 s of back-off in all: an election here takes as long as the test takes to write `leader`."""


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[StubBrokers]:
    with stub_brokers(tmp_path / "store", 2) as stubs:
        yield stubs


def test_a_client_reaches_the_leader_past_a_dead_url_and_a_standby(brokers: StubBrokers) -> None:
    leader, standby = brokers.urls
    brokers.store.elect(leader)
    with Client(f"{brokers.dead_url},{standby},{leader}", brokers.token, retry=RETRY, timeout=10) as fp:
        assert fp.whoami() == "alice" and fp.url == leader
        job = fp.run(["true"])
        assert job.state == "SUCCEEDED" and fp.get(job.id).state == "SUCCEEDED"
    assert brokers.served(standby, "GET", "/v1/whoami") == 1  # asked once, then the client stuck to the leader
    assert brokers.served(standby, "POST", "/v1/jobs") == 0


def test_an_async_client_reaches_the_leader_the_same_way(brokers: StubBrokers) -> None:
    leader, standby = brokers.urls
    brokers.store.elect(leader)

    async def scenario() -> tuple[str, JobInfo]:
        async with AsyncClient([brokers.dead_url, standby, leader], brokers.token, retry=RETRY, timeout=10) as fp:
            return await fp.whoami(), await fp.run(["true"])

    caller, job = asyncio.run(scenario())
    assert caller == "alice" and job.state == "SUCCEEDED"
    assert brokers.served(leader, "POST", "/v1/jobs") == 1


def test_a_wait_whose_leader_is_killed_is_answered_by_the_next_leader(brokers: StubBrokers) -> None:
    old, new = brokers.urls
    brokers.store.elect(old)
    with Client(f"{brokers.dead_url},{new},{old}", brokers.token, retry=RETRY, timeout=10) as fp:
        job = fp.submit(["sleep", "1.5"])
        waited: list[JobInfo] = []
        waiter = threading.Thread(target=lambda: waited.append(fp.wait(job.id, timeout=20)))
        waiter.start()
        brokers.until(old, "GET", f"/v1/jobs/{job.id}")  # the leader holds the long-poll
        brokers.kill(old)
        brokers.store.elect(new)
        waiter.join(20)
        assert waited and waited[0].state == "SUCCEEDED" and waited[0].id == job.id
        assert brokers.served(new, "GET", f"/v1/jobs/{job.id}") >= 1 and fp.url == new


def test_an_async_run_whose_leader_is_killed_mid_wait_finishes_on_the_next_leader(brokers: StubBrokers) -> None:
    old, new = brokers.urls
    brokers.store.elect(old)

    async def scenario() -> JobInfo:
        async with AsyncClient(f"{brokers.dead_url},{old},{new}", brokers.token, retry=RETRY, timeout=10) as fp:
            run = asyncio.create_task(fp.run(["sleep", "1.5"]))
            while not brokers.served(old, "POST", "/v1/jobs"):  # submitted, and waiting on the leader
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            brokers.kill(old)
            brokers.store.elect(new)
            return await asyncio.wait_for(run, 20)

    job = asyncio.run(scenario())
    assert job.state == "SUCCEEDED" and job.exit_code == 0
    assert brokers.served(new, "POST", "/v1/jobs") >= 1  # the submit repeated, with its key: one job
    assert len(list((brokers.store.root / "jobs").iterdir())) == 1


def test_the_cli_takes_the_list_from_firepool_url_or_url(brokers: StubBrokers, tmp_path: Path) -> None:
    leader, standby = brokers.urls
    brokers.store.elect(leader)
    listed = f"{brokers.dead_url},{standby},{leader}"
    env = {**os.environ, "FIREPOOL_TOKEN": brokers.token, "FIREPOOL_STATE_DIR": str(tmp_path / "none")}
    cli = [sys.executable, "-m", "broker.cli", "submit", "--json"]
    from_env = subprocess.run([*cli, "--", "true"], env={**env, "FIREPOOL_URL": listed}, capture_output=True,
                              text=True, timeout=60)
    from_flag = subprocess.run([*cli, "--url", listed, "--", "true"], env=env, capture_output=True, text=True,
                               timeout=60)
    for done in (from_env, from_flag):
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["caller"] == "alice"
    assert brokers.served(leader, "POST", "/v1/jobs") == 2 and brokers.served(standby, "POST", "/v1/jobs") == 2
