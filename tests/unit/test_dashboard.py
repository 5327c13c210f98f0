"""The dashboard in process: sign-in cookie, CSRF, caller scoping, admin actions, the shared snapshot hub."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from broker.api.app import create_app
from broker.api.auth import Identity, TokenAuth
from broker.clock import VirtualClock
from broker.jobs import JobState
from broker.ui import views
from broker.ui.live import Hub, Timeline
from tests.unit.harness import Harness, cpu_pool

ALICE, BOB, OPS = "alice-token", "bob-token", "ops-token"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
async def ui():
    h = await Harness([cpu_pool()]).start()
    app = create_app(h.cp, TokenAuth({ALICE: "alice", BOB: "bob", OPS: {"caller": "ops", "admin": True}}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
        http.h = h  # type: ignore[attr-defined]
        yield http
    await h.stop()


async def sign_in(http: httpx.AsyncClient, token: str) -> str:
    """Sign in and return the CSRF token the pages carry."""
    http.cookies.clear()
    r = await http.post("/ui/login", data={"token": token, "next": "/ui/"})
    assert r.status_code == 303, r.text
    page = await http.get("/ui/")
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert found, page.text
    return found.group(1)


async def test_login_sets_an_httponly_strict_cookie_and_secure_only_over_tls(ui) -> None:
    r = await ui.post("/ui/login", data={"token": ALICE, "next": "/ui/jobs"})
    assert r.status_code == 303 and r.headers["location"] == "/ui/jobs"
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "secure" not in cookie
    async with httpx.AsyncClient(transport=ui._transport, base_url="https://fp") as tls:
        r = await tls.post("/ui/login", data={"token": ALICE})
        assert "secure" in r.headers["set-cookie"].lower()


async def test_unknown_token_gets_the_form_again_and_no_cookie(ui) -> None:
    r = await ui.post("/ui/login", data={"token": "nope"})
    assert r.status_code == 401 and "not known" in r.text and "set-cookie" not in r.headers
    r = await ui.get("/ui/jobs")
    assert r.status_code == 401 and 'type="password"' in r.text


async def test_ui_without_its_slash_redirects_to_the_dashboard(ui) -> None:
    r = await ui.get("/ui")
    assert r.status_code == 308 and r.headers["location"] == "/ui/"


async def test_login_redirect_stays_on_the_dashboard(ui) -> None:
    r = await ui.post("/ui/login", data={"token": ALICE, "next": "//evil.example/"})
    assert r.headers["location"] == "/ui/"


async def test_pages_render_with_a_strict_content_security_policy(ui) -> None:
    await sign_in(ui, ALICE)
    await ui.h.run_job("alice", command=("echo", "hi"))
    for path in ("/ui/", "/ui/jobs", "/ui/sessions", "/ui/pods", "/ui/latency"):
        r = await ui.get(path)
        assert r.status_code == 200, (path, r.text)
        assert "default-src 'self'" in r.headers["content-security-policy"]
        assert not re.search(r'(?:src|href)="https?://', r.text), path


async def test_a_caller_sees_only_its_own_jobs_and_another_callers_job_page_is_404(ui) -> None:
    job = await ui.h.run_job("alice", command=("echo", "hi"), lease_tag="mine")
    await sign_in(ui, ALICE)
    assert job.id in (await ui.get("/ui/jobs")).text
    page = await ui.get(f"/ui/jobs/{job.id}")
    assert page.status_code == 200 and "SUCCEEDED" in page.text and "warm" not in page.text.split("Acquisition")[0]
    await sign_in(ui, BOB)
    assert job.id not in (await ui.get("/ui/jobs")).text
    assert (await ui.get(f"/ui/jobs/{job.id}")).status_code == 404
    assert (await ui.get(f"/ui/jobs/{job.id}/log")).status_code == 404
    await sign_in(ui, OPS)
    assert job.id in (await ui.get("/ui/jobs?caller=alice")).text


async def test_jobs_filter_by_state_pool_tag_and_path(ui) -> None:
    first = await ui.h.run_job("alice", command=("true",), lease_tag="a")
    second = await ui.h.run_job("alice", command=("exit", "3"), lease_tag="a")
    await sign_in(ui, ALICE)
    failed = (await ui.get("/ui/jobs?state=FAILED")).text
    assert second.id in failed and first.id not in failed
    warm = (await ui.get("/ui/jobs?path=warm")).text
    assert second.id in warm and first.id not in warm  # the second took the first's pod, warm
    assert first.id not in (await ui.get("/ui/jobs?tag=b")).text


async def test_jobs_page_pages_newest_first_with_a_cursor(ui) -> None:
    jobs = [await ui.h.submit("alice", command=("true",)) for _ in range(views.PAGE + 5)]
    who = Identity("alice")
    rows, cursor = await views.jobs_page(ui.h.cp, who, views.JobFilter(), None)
    assert [r["id"] for r in rows] == sorted((j.id for j in jobs), reverse=True)[:views.PAGE]
    rest, end = await views.jobs_page(ui.h.cp, who, views.JobFilter(), cursor)
    assert len(rest) == 5 and end is None


async def test_mutating_forms_need_the_csrf_token_and_an_admin(ui) -> None:
    job = await ui.h.run_job("alice", command=("true",))
    pod = job.acquisition[0].pod
    assert ui.h.cp.tracker.pods[pod].held(ui.h.clock.now())
    csrf = await sign_in(ui, OPS)
    r = await ui.post("/ui/admin/break-hold", data={"pod": pod}, headers=FORM)
    assert r.status_code == 403 and ui.h.cp.tracker.pods[pod].held(ui.h.clock.now())
    csrf_alice = await sign_in(ui, ALICE)
    r = await ui.post("/ui/admin/break-hold", data={"pod": pod, "csrf": csrf_alice})
    assert r.status_code == 403
    fresh = await sign_in(ui, OPS)  # a new session: the first one's CSRF token does not carry over
    r = await ui.post("/ui/admin/break-hold", data={"pod": pod, "csrf": csrf})
    assert r.status_code == 403
    r = await ui.post("/ui/admin/break-hold", data={"pod": pod, "csrf": fresh})
    assert r.status_code == 303 and "Broke" in r.headers["location"]
    await ui.h.spin()
    assert pod not in ui.h.cp.tracker.pods or not ui.h.cp.tracker.pods[pod].held(ui.h.clock.now())
    assert ui.h.cp.pools_view()[0]["holds_broken"] == 1


async def test_admin_retires_a_session_and_drains_a_pool(ui) -> None:
    await ui.h.run_job("alice", command=("true",), lease_tag="conv-1")
    csrf = await sign_in(ui, OPS)
    assert "conv-1" in (await ui.get("/ui/sessions")).text
    r = await ui.post("/ui/admin/retire-session", data={"caller": "alice", "queue": "default", "tag": "conv-1",
                                                         "csrf": csrf})
    assert r.status_code == 303 and "1+pods+now" in r.headers["location"]
    await ui.h.run_job("bob", command=("true",))
    before = {p.name for p in ui.h.cp.tracker.snapshot()}
    assert before
    r = await ui.post("/ui/admin/drain-pool", data={"pool": "cpu", "csrf": csrf})
    assert r.status_code == 303 and "Draining+cpu" in r.headers["location"]
    left = {p.name: p.state.value for p in ui.h.cp.tracker.snapshot() if p.name in before}
    assert all(state == "retiring" for state in left.values())


async def test_twenty_clients_share_one_snapshot_per_tick_and_each_caller_one_scoped_copy(ui) -> None:
    await ui.h.submit("alice", command=("sleep", "30"))
    await ui.h.submit("bob", command=("sleep", "30"))
    hub = Hub(ui.h.cp, ui.h.clock)
    for _ in range(20):
        hub.subscribe({"jobs", "pools"}, Identity("ops", admin=True))
    snap = await hub.tick()
    assert hub.computed == 1
    alice = [snap.encoded(Identity("alice"), {"jobs", "pools"}) for _ in range(10)]
    assert all(a is alice[0] for a in alice)  # serialized once, shared
    assert '"caller":"alice"' in alice[0] and '"caller":"bob"' not in alice[0]
    ops = snap.encoded(Identity("ops", admin=True), {"jobs"})
    assert '"caller":"bob"' in ops and '"pools"' not in ops


async def test_the_hub_ticks_at_most_twice_a_second_and_not_at_all_without_clients() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        hub = Hub(h.cp, h.clock, interval=0.5)
        task = asyncio.get_running_loop().create_task(hub.run())
        await h.run_for(5.0)
        assert hub.computed == 0
        client = hub.subscribe({"pools"}, Identity("alice"))
        await h.run_for(10.0)
        assert 18 <= hub.computed <= 21
        hub.unsubscribe(client)
        before = hub.computed
        await h.run_for(5.0)
        assert hub.computed <= before + 1
        task.cancel()
    finally:
        await h.stop()


async def test_a_client_waiting_for_the_next_snapshot_gets_a_newer_one() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        hub = Hub(h.cp, h.clock)
        hub.subscribe({"pools"}, Identity("alice"))
        first = await hub.tick()
        waiter = asyncio.ensure_future(hub.next(first.seq))
        await h.spin()
        assert not waiter.done()
        second = await hub.tick()
        assert (await waiter) is second and second.data["pools"][0]["name"] == "cpu"
    finally:
        await h.stop()


def test_timeline_keeps_one_hour_of_samples() -> None:
    clock = VirtualClock()
    counts = {"held": 0}

    def read() -> list[dict[str, object]]:
        counts["held"] += 1
        return [{"name": "cpu", "held": counts["held"], "busy": 2, "queued_demand": 3}]

    tl = Timeline(read, clock, every=10.0, span=3600.0)
    for _ in range(400):
        tl.sample()
        clock.advance(10.0)
    series = tl.series("cpu")
    assert len(series["at"]) == 360 and series["held"][-1] == 400 and series["held"][0] == 41
    assert series["busy"][0] == 2 and series["queued"][0] == 3 and tl.series("nope")["at"] == []


async def test_latency_counts_each_path_in_its_bucket(ui) -> None:
    await ui.h.run_job("alice", command=("true",))
    await ui.h.run_job("alice", command=("true",))
    lat = await views.latency(ui.h.cp, Identity("alice"))
    assert lat["jobs"] == 2 and sum(lat["hist"]["warm"]) == 1
    assert sum(sum(h) for h in lat["hist"].values()) == 2 and lat["share"]["n"]
    assert (await views.latency(ui.h.cp, Identity("bob")))["jobs"] == 0


async def test_pods_page_shows_reset_proofs(ui) -> None:
    job = await ui.h.run_job("alice", command=("true",))
    rows, total = views.pods_page(ui.h.cp, Identity("alice"), None, None, 0)
    assert total == 1 and rows[0]["name"] == job.acquisition[0].pod and rows[0]["resets"][0]["clean"] is True
    assert views.pods_page(ui.h.cp, Identity("bob"), None, None, 0)[1] == 0
    assert views.pods_page(ui.h.cp, Identity("ops", admin=True), None, "idle", 0)[1] == 1
    assert JobState.SUCCEEDED  # the job's pod went back idle and held


async def test_a_job_that_starts_and_ends_between_two_ticks_still_shows_in_the_next(ui) -> None:
    hub = Hub(ui.h.cp, ui.h.clock)
    hub.subscribe({"jobs"}, Identity("alice"))
    await hub.tick()
    job = await ui.h.run_job("alice", command=("true",))
    await ui.h.run_job("bob", command=("true",))
    rows = (await hub.tick()).for_identity(Identity("alice"))["jobs"]
    assert [(r["id"], r["state"], r["path"]) for r in rows] == [(job.id, "SUCCEEDED", job.acquisition[0].path)]


async def test_a_form_posted_from_another_site_is_refused_login_included(ui) -> None:
    r = await ui.post("/ui/login", data={"token": ALICE}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "set-cookie" not in r.headers
    r = await ui.post("/ui/login", data={"token": ALICE}, headers={"Origin": "http://fp"})
    assert r.status_code == 303


async def test_a_failing_view_does_not_end_live_updates() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        hub = Hub(h.cp, h.clock, interval=0.5)
        broken = {"n": 2}
        real = h.cp.pools_view

        def flaky() -> list[dict[str, object]]:
            if broken["n"]:
                broken["n"] -= 1
                raise RuntimeError("boom")
            return real()

        h.cp.pools_view = flaky  # type: ignore[method-assign]
        task = asyncio.get_running_loop().create_task(hub.run())
        hub.subscribe({"pools"}, Identity("alice"))
        await h.run_for(3.0)
        assert hub.snapshot is not None and hub.snapshot.data["pools"][0]["name"] == "cpu"
        task.cancel()
    finally:
        await h.stop()


async def test_a_stream_skips_ticks_that_changed_nothing_it_shows() -> None:
    from broker.ui.routes import _snapshots

    h = await Harness([cpu_pool()]).start()
    try:
        hub = Hub(h.cp, h.clock)
        stream = _snapshots(hub, Identity("alice"), {"jobs"})
        assert (await stream.__anext__()).startswith("retry:")
        await hub.tick()
        first = await stream.__anext__()
        waiting = asyncio.ensure_future(stream.__anext__())
        await hub.tick()  # nothing changed
        await h.spin()
        assert not waiting.done()
        job = await h.submit("alice", command=("sleep", "30"))
        await hub.tick()
        changed = await waiting
        assert job.id in changed and job.id not in first and hub.snapshot is not None and hub.snapshot.seq == 3
        await stream.aclose()
        assert hub.clients == {}
    finally:
        await h.stop()
