"""The dashboard at fleet scale: 1,000 tracked pods and 100,000 jobs in a SQLite store render each page in time.

The pods are virtual (tracked records over the fake backend; nothing to start), the jobs real rows written
in bulk through the store's own row encoding, so every page runs its real paged queries and views.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa

from broker.api.app import create_app
from broker.api.auth import Identity, TokenAuth
from broker.clock import RealClock
from broker.control import ControlPlane
from broker.jobs import Acquisition, JobSpec, JobState
from broker.pods import Pod
from broker.pools import Catalog, PoolSpec
from broker.ports.backend import FakeBackend
from broker.ports.logs import MemoryLogStore
from broker.store import rows
from broker.store.schema import jobs as jobs_table
from broker.store.sql import SqlJobStore
from broker.ui.live import Hub

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

PODS, JOBS = 1000, 100_000
PAGE_BUDGET_S = 2.0
"""Slowest page allowed (server time for one request, this machine, busy with other tests or not)."""
CALLERS = ("alice", "bob", "carol", "dave")
PATHS = ("warm", "recycled", "standby", "new")
STATES = (JobState.SUCCEEDED, JobState.SUCCEEDED, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def fill_store(store: SqlJobStore, now: float) -> None:
    template = JobSpec(pool="gpu", command=("python", "train.py"))
    from broker.claiming.admission import admit

    pools = {"gpu": PoolSpec(name="gpu", max_count=PODS), "cpu": PoolSpec(name="cpu", max_count=PODS)}
    base = admit(template, "alice", pools, now - JOBS)
    batch = []
    with store.engine.begin() as conn:
        for i in range(JOBS):
            t = now - JOBS + i
            state = STATES[i % len(STATES)]
            job = dataclasses.replace(
                base, id=f"j{i:012d}", caller=CALLERS[i % len(CALLERS)], state=state,
                spec=dataclasses.replace(base.spec, pool="gpu" if i % 3 else "cpu", lease_tag=f"s{i % 500}"),
                acquisition=(Acquisition(f"gpu-{i % PODS:04d}", PATHS[i % len(PATHS)]),),
                timings={"submitted_at": t, "queued_at": t + 0.001, "committed_at": t + 0.01,
                         "handed_off_at": t + 0.02, "first_instruction_at": t + 0.05 + (i % 7) * 0.1,
                         "finished_at": t + 0.9},
                exit_code=0 if state is JobState.SUCCEEDED else 1)
            row = rows.job_row(job, t)
            row["created_at"] = t
            batch.append(row)
            if len(batch) == 5000:
                conn.execute(jobs_table.insert(), batch)
                batch = []
        if batch:
            conn.execute(jobs_table.insert(), batch)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def big(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path: Path = tmp_path_factory.mktemp("scale") / "jobs.db"
    clock = RealClock()
    store = SqlJobStore.open(f"sqlite:///{path}")
    t0 = time.perf_counter()
    fill_store(store, clock.now())
    fill_s = time.perf_counter() - t0
    pools = {"gpu": PoolSpec(name="gpu", gpus=1, accelerator="virtual", max_count=PODS, max_idle_count=PODS,
                             idle_timeout=3600.0),
             "cpu": PoolSpec(name="cpu", max_count=PODS, max_idle_count=PODS, idle_timeout=3600.0)}
    cp = ControlPlane(clock=clock, store=store, backend=FakeBackend(clock), logs=MemoryLogStore(clock.now),
                      catalog=Catalog(pools=pools, caller_limits={}, budgets={}))
    await cp.start(loops=False)
    now = clock.now()
    for i in range(PODS):
        pod = Pod(f"gpu-{i:04d}", "gpu", created_at=now)
        cp.tracker.add(pod)
        cp.tracker.ready(pod.name, now, (f"GPU-{i:04d}",))
        if i % 4 == 0:  # a quarter held for their last caller's session
            pod.caller = CALLERS[i % len(CALLERS)]
            pod.key = (pod.caller, "default", f"s{i % 500}")
            pod.used = True
            pod.hold_until = now + 600
        cp.stats.observe_reset(pod.name, now - 5, True, 0.4, 0, ())
    app = create_app(cp, TokenAuth({"ops-token": {"caller": "ops", "admin": True}, "alice-token": "alice"}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp", timeout=60) as http:
        yield http, cp, fill_s
    await cp.tasks.stop()
    store.close()


async def timed(http: httpx.AsyncClient, path: str) -> tuple[float, httpx.Response]:
    t0 = time.perf_counter()
    r = await http.get(path)
    return time.perf_counter() - t0, r


@pytest.mark.parametrize("token", ["ops-token", "alice-token"])
async def test_every_page_renders_in_time_with_1000_pods_and_100k_jobs(big, token: str) -> None:
    http, cp, fill_s = big
    http.cookies.clear()
    assert (await http.post("/ui/login", data={"token": token})).status_code == 303
    with cp.store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs_table)).scalar() == JOBS
    took = {}
    for path in ("/ui/", "/ui/jobs", "/ui/jobs?state=FAILED", "/ui/jobs?pool=cpu", "/ui/jobs?tag=s42",
                 "/ui/jobs?path=standby", "/ui/jobs?before=j000000050000", "/ui/pods", "/ui/pods?page=4",
                 "/ui/sessions", "/ui/latency"):
        seconds, r = await timed(http, path)
        assert r.status_code == 200, (path, r.text[:500])
        took[path] = seconds
    print(f"\n{token}: store filled in {fill_s:.1f} s; page times: " +
          ", ".join(f"{p} {s * 1000:.0f} ms" for p, s in took.items()))
    assert max(took.values()) < PAGE_BUDGET_S, took
    jobs_page = (await http.get("/ui/jobs?state=FAILED")).text
    ids = re.findall(r'data-job="(j\d+)"', jobs_page)
    newest = max(i for i in range(JOBS) if STATES[i % len(STATES)] is JobState.FAILED
                 and (token == "ops-token" or CALLERS[i % len(CALLERS)] == "alice"))
    assert len(ids) == 50 and ids == sorted(ids, reverse=True) and ids[0] == f"j{newest:012d}"
    if token == "ops-token":
        assert len(re.findall(r"<tr data-pod=", (await http.get("/ui/pods")).text)) == 200
        assert "page 1 of 5" in (await http.get("/ui/pods")).text
    else:
        assert 'data-job="j' in (await http.get("/ui/jobs")).text
        assert "bob" not in re.sub(r"<[^>]+>", "", (await http.get("/ui/jobs")).text)


async def test_one_live_tick_over_1000_pods_is_cheap_and_shared(big) -> None:
    _, cp, _ = big
    hub = Hub(cp, cp.clock)
    for i in range(20):
        hub.subscribe({"pools", "pods", "jobs"}, Identity("ops", admin=True) if i % 2 else Identity("alice"))
    t0, cpu0 = time.perf_counter(), time.process_time()
    snap = await hub.tick()
    texts = [snap.encoded(Identity("ops", admin=True) if i % 2 else Identity("alice"), {"pools", "pods", "jobs"})
             for i in range(20)]
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(f"\none tick for 20 clients over {PODS} pods: {seconds * 1000:.0f} ms, {cpu * 1000:.0f} ms CPU, "
          f"{len(texts[1]) // 1024} KiB")
    assert len(snap.data["pods"]) == PODS and hub.computed == 1
    # At most 2 ticks a second: a tick's work must stay well under its interval. Its CPU time is the measure
    # (a CI machine busy with other tests stretched one tick's wall time from 43 ms to 0.88 s); the wall time
    # gets the pages' bound.
    assert cpu < 0.25 and seconds < PAGE_BUDGET_S
