"""Several brokers on one store (docs/ha.md), as real processes on real MariaDB and PostgreSQL: the short
form of `bench failover` (leader SIGKILLs and a SIGSTOP longer than the lease under W-Agent + W-RL load), an
election between brokers started together on an empty store, a standby that meets a newer schema, and a
leader cut from its database by a partition (tests/integration/partition_proxy.py)."""

from __future__ import annotations

import random
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from bench.failover import DEPOSED_EXIT, DEPOSED_LINE, run_database, serve_lease_s
from bench.failover_cluster import Brokers, ScratchDatabase
from bench.failover_load import COMMAND
from broker.client import Client
from tests.integration.partition_proxy import PartitionProxy

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DATABASES = ("mariadb", "postgresql")
LEASE_S = min(2.0, serve_lease_s())
"""Short enough that a pause or a cut past it keeps each test under a minute."""


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ScratchDatabase, Brokers]]:
    """Two brokers (not started) on a scratch database of the parametrized kind."""
    with ScratchDatabase(request.param) as db:
        brokers = Brokers(tmp_path / "brokers", db.url, count=2, lease_s=LEASE_S)
        try:
            yield db, brokers
        finally:
            brokers.stop()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", DATABASES)
def test_three_leader_kills_and_a_pause_under_load_lose_nothing_run_nothing_twice_and_never_split(kind: str) -> None:
    out = run_database(kind, kills=3, pauses=1, gap=(0.5, 1.5), lease_s=LEASE_S, rng=random.Random(26), drain_s=60)
    why = {k: out.get(k) for k in ("states", "lost", "executed_twice", "succeeded_unexecuted", "kept_dir")}
    assert (out["kills"], out["pauses"]) == (3, 1), out
    assert out["jobs"] > 0, out  # the load really ran
    assert out["lost"] == [] and out["executed_twice"] == [] and out["succeeded_unexecuted"] == [], why
    assert set(out["states"]) == {"SUCCEEDED"}, why
    assert out["same_term_samples"] == 0, out["same_term_leaders"]
    assert out["deposed_exits"] == [DEPOSED_EXIT], out
    assert out["broker_refusals"] >= 1, "the woken leader logged why it left"
    held = out["pods"]["held"]
    assert held[0] == held[1], out["pods"]
    assert len(out["failover_s"]) == 3 and max(out["failover_s"]) < LEASE_S + 5, out["failover_s"]


@pytest.mark.parametrize("cluster", DATABASES, indirect=True)
def test_two_brokers_started_at_once_on_an_empty_store_elect_one_leader(
        cluster: tuple[ScratchDatabase, Brokers]) -> None:
    _db, brokers = cluster
    brokers.start()
    leader, term, _ = brokers.wait_leader()
    standby = 1 - leader
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # and it stays that way
        roles = brokers.roles()
        assert roles[leader] == ("leader", term) and roles[standby][0] == "standby", roles
        time.sleep(0.05)
    with httpx.Client(timeout=5) as http:
        token = {"Authorization": f"Bearer {brokers.tokens['bench']}"}
        assert http.get(brokers.urls[leader] + "/readyz").status_code == 200
        assert http.get(brokers.urls[standby] + "/readyz").status_code == 503
        refused = http.get(brokers.urls[standby] + "/v1/pools", headers=token)
        assert refused.status_code == 503 and refused.headers.get("Retry-After") == "0"
        error = refused.json()["error"]
        assert error["class"] == "NotLeader" and error["retryable"] is True
        assert error["details"] == {"leader": brokers.urls[leader], "term": term}
        assert http.get(brokers.urls[leader] + "/v1/pools", headers=token).status_code == 200


@pytest.mark.parametrize("cluster", ["postgresql"], indirect=True)
def test_a_standby_meeting_a_newer_schema_refuses_in_one_line(cluster: tuple[ScratchDatabase, Brokers]) -> None:
    db, brokers = cluster
    brokers.spawn(0)
    brokers.wait_up(0)
    brokers.wait_leader([0])
    engine = sa.create_engine(db.url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:  # as if a newer broker had migrated the store
        conn.exec_driver_sql("UPDATE firepool_alembic_version SET version_num = 'f0f0f0f0f0f0'")
    done = subprocess.run(brokers.command(1), capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("firepool:")]
    assert "f0f0f0f0f0f0" in line, done.stderr
    with engine.connect() as conn:  # it changed nothing
        assert conn.exec_driver_sql("SELECT version_num FROM firepool_alembic_version").scalar() == "f0f0f0f0f0f0"
    engine.dispose()


def _jobs(url: str, token: str) -> list[dict[str, Any]]:
    with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {token}"}) as http:
        response = http.get(url + "/v1/jobs", params={"limit": 1000})
        response.raise_for_status()
        jobs: list[dict[str, Any]] = response.json()["jobs"]
        return jobs


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cluster", DATABASES, indirect=True)
def test_a_leader_cut_from_its_store_is_replaced_and_exits_without_committing_after_the_cut(
        cluster: tuple[ScratchDatabase, Brokers]) -> None:
    db, brokers = cluster
    server = sa.engine.make_url(db.url)
    token = brokers.tokens["bench"]
    with PartitionProxy(server.host or "127.0.0.1", int(server.port or 0)) as proxy:
        brokers.db_urls[0] = server.set(port=proxy.port).render_as_string(hide_password=False)
        brokers.spawn(0)
        brokers.wait_up(0)
        _, term, _ = brokers.wait_leader([0])
        brokers.spawn(1)
        brokers.wait_up(1)
        with Client(brokers.urls[0], token) as fp:
            before = fp.run(COMMAND, "cpu", lease_tag="before", max_retries=0)
        assert before.state == "SUCCEEDED"

        proxy.cut()
        answers: list[Any] = []

        def submit_to_the_old_leader() -> None:
            try:
                with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token}"}) as http:
                    answers.append(http.post(brokers.urls[0] + "/v1/jobs", json={
                        "pool": "cpu", "command": COMMAND, "max_retries": 0, "idempotency_key": "after-the-cut"}))
            except httpx.HTTPError as exc:
                answers.append(exc)

        writer = threading.Thread(target=submit_to_the_old_leader, daemon=True)
        writer.start()
        new, new_term, took = brokers.wait_leader([1], after_term=term, timeout_s=LEASE_S * 4 + 20)
        assert new == 1 and new_term > term
        code = brokers.wait_exit(0, LEASE_S * 4 + 20)
        assert code == DEPOSED_EXIT, brokers.tail(0)
        assert DEPOSED_LINE in brokers.tail(0, 20_000)
        writer.join(35)
        assert answers and not (isinstance(answers[0], httpx.Response) and answers[0].is_success), answers
        jobs = _jobs(brokers.urls[1], token)
        assert [j["id"] for j in jobs] == [before.id], jobs  # nothing the old leader took after the cut
        assert (brokers.shared / "log").read_text().split() == ["S", before.id]
        assert took < LEASE_S * 4 + 20
