"""The election and the fence on a real store (SQLite file, MariaDB, PostgreSQL): one leader, terms that only grow,
a dead leader's lock free at once, a paused leader's session ended after its lease, an old term's writes refused."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from broker.errors import Fenced
from broker.fencing import Term
from broker.store.engines import WRITE
from broker.store.leadership import Election, install_fence, read_leader
from broker.store.schema import events, leadership
from broker.store.sql import SqlJobStore
from tests.integration.store_databases import BACKENDS, Databases

pytestmark = pytest.mark.integration


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    dbs = Databases(request.param, tmp_path)
    try:
        url = dbs.create()
        SqlJobStore.open(url).close()  # the schema, leadership row included
        yield url
    finally:
        dbs.drop_all()


class Broker:
    """One candidate: its own engine (its own sessions), term and deposition record."""

    def __init__(self, url: str, name: str, lease_s: float = 30.0) -> None:
        self.store = SqlJobStore.open(url, migrate=False)
        self.deposed: list[str] = []
        self.term = Term(on_deposed=self.deposed.append)
        install_fence(self.store.engine, self.term)
        self.election = Election(self.store.engine, self.term, holder=name, url=f"http://{name}", lease_s=lease_s)

    def campaign(self) -> int:
        self.term.value = self.election.campaign()
        return self.term.value

    def write(self) -> None:
        with self.store.engine.connect() as conn, conn.execution_options(**{WRITE: True}).begin():
            conn.execute(events.delete().where(events.c.id == -1))

    def close(self) -> None:
        self.election.stop()
        self.store.close()


def campaign_in_background(broker: Broker) -> tuple[threading.Thread, list[float]]:
    took: list[float] = []

    def run() -> None:
        broker.campaign()
        took.append(time.monotonic())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, took


def poll(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait for `check` to hold: a standby warms its sessions before it first reads the leader, slower under load."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_dead_leaders_lock_passes_to_the_waiting_standby_at_once_with_the_next_term(store_url: str) -> None:
    a, b = Broker(store_url, "a"), Broker(store_url, "b")
    try:
        assert a.campaign() == 1
        thread, took = campaign_in_background(b)
        poll(lambda: b.election.known_leader() == ("http://a", 1))  # b stands by and knows the leader
        assert not took
        died = time.monotonic()
        a.election.lock.close()  # the leader's session ends, as when its process is killed
        thread.join(5)
        assert b.term.value == 2 and took[0] - died < 0.1
        with b.store.engine.connect() as conn:
            assert read_leader(conn).holder == "b"
    finally:
        a.close()
        b.close()


def test_an_old_terms_write_is_refused_and_deposes_its_broker(store_url: str) -> None:
    a, b = Broker(store_url, "a"), Broker(store_url, "b")
    try:
        a.campaign()
        a.write()  # the leader writes
        a.election.lock.close()
        b.campaign()
        with pytest.raises(Fenced):
            a.write()  # woke up under term 1 after term 2 began
        assert a.deposed and "term 2" in a.deposed[0]
        b.write()
        assert not b.deposed
    finally:
        a.close()
        b.close()


def test_a_silent_leader_is_replaced_after_its_lease_and_its_open_write_rolled_back(store_url: str) -> None:
    if store_url.startswith("sqlite"):
        pytest.skip("a file lock cannot be taken from a live process: on SQLite a paused leader is never replaced")
    a, b = Broker(store_url, "a"), Broker(store_url, "b", lease_s=0.5)
    try:
        a.campaign()
        conn = a.store.engine.connect()
        tx = conn.execution_options(**{WRITE: True}).begin()  # a write under way when the leader froze
        conn.execute(leadership.update().where(leadership.c.id == 1).values(url="http://a/frozen"))
        started = time.monotonic()
        assert b.campaign() == 2  # no beat from a for a lease: its sessions are ended, the bump goes through
        assert 0.5 <= time.monotonic() - started < 5
        with pytest.raises(sa.exc.DBAPIError):
            tx.commit()
        with b.store.engine.connect() as check:
            leader = read_leader(check)
        assert (leader.term, leader.url) == (2, "http://b")
        with pytest.raises(Exception):  # noqa: B017 - the driver's error for a killed session
            a.election.lock.check()
    finally:
        a.close()
        b.close()


def test_two_candidates_at_once_on_a_fresh_store_make_one_leader(store_url: str) -> None:
    brokers = [Broker(store_url, f"c{i}") for i in range(3)]
    try:
        threads = [campaign_in_background(x)[0] for x in brokers]
        poll(lambda: any(x.term.value for x in brokers))
        time.sleep(0.5)  # time for a second leader, were the lock to let one through
        leaders = [x for x in brokers if x.term.value]
        assert len(leaders) == 1 and leaders[0].term.value == 1
    finally:
        for x in brokers:
            x.election.stop()
        for t in threads:  # before the stores close: a campaign still reading would hand its session back to a
            t.join(5)      # disposed engine's pool, which never closes it
        for x in brokers:
            x.store.close()
