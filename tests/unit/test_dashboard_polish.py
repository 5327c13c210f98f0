"""The dashboard in process: owners cancel their jobs and end their sessions (CSRF-checked, 404 for another
caller's), the command and duration columns, p50/p90/p99, largest placeable in words, the favicon."""

from __future__ import annotations

import re

import httpx
import pytest

from broker.api.app import create_app
from broker.api.auth import Identity, TokenAuth
from broker.jobs import JobState
from broker.ui import views
from broker.ui.templating import elapsed, placeable
from tests.unit.harness import Harness, cpu_pool

ALICE, BOB, OPS = "alice-token", "bob-token", "ops-token"


@pytest.fixture
async def ui():
    h = await Harness([cpu_pool()]).start()
    app = create_app(h.cp, TokenAuth({ALICE: "alice", BOB: "bob", OPS: {"caller": "ops", "admin": True}}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
        http.h = h  # type: ignore[attr-defined]
        yield http
    await h.stop()


async def sign_in(http: httpx.AsyncClient, token: str) -> str:
    http.cookies.clear()
    r = await http.post("/ui/login", data={"token": token, "next": "/ui/"})
    assert r.status_code == 303, r.text
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', (await http.get("/ui/")).text)
    assert found
    return found.group(1)


def same_error(a: httpx.Response, b: httpx.Response) -> bool:
    """The same refusal but for the name asked about."""
    return bool(a.json()["error"]["class"] == b.json()["error"]["class"] == "NotFound")


async def test_an_owner_cancels_a_running_job_from_its_page_with_the_csrf_token(ui) -> None:
    job = await ui.h.submit("alice", command=("sleep", "100"), lease_tag="c")
    await ui.h.until(lambda: "first_instruction_at" in ui.h.cp.book.live[job.id].timings)
    await ui.h.run_for(2.0)
    csrf = await sign_in(ui, ALICE)
    page = (await ui.get(f"/ui/jobs/{job.id}")).text
    assert f'action="/ui/jobs/{job.id}/cancel"' in page and re.search(r"running for [0-9.]+ s<", page)
    assert f'action="/ui/jobs/{job.id}/cancel"' in (await ui.get("/ui/jobs")).text
    r = await ui.post(f"/ui/jobs/{job.id}/cancel", data={"back": f"/ui/jobs/{job.id}"})
    assert r.status_code == 403  # no CSRF token: refused, nothing done
    assert not ui.h.cp.book.live[job.id].cancel_requested
    r = await ui.post(f"/ui/jobs/{job.id}/cancel", data={"csrf": csrf, "back": f"/ui/jobs/{job.id}"},
                      headers={"Origin": "http://elsewhere.example"})
    assert r.status_code == 403
    r = await ui.post(f"/ui/jobs/{job.id}/cancel", data={"csrf": csrf, "back": f"/ui/jobs/{job.id}"})
    assert r.status_code == 303 and r.headers["location"].startswith(f"/ui/jobs/{job.id}?notice=")
    done = await ui.h.finish(job)
    assert done.state is JobState.CANCELLED
    page = (await ui.get(f"/ui/jobs/{job.id}")).text
    assert f'action="/ui/jobs/{job.id}/cancel"' not in page  # nothing left to cancel


async def test_another_callers_job_cannot_be_cancelled_and_looks_like_none(ui) -> None:
    job = await ui.h.submit("alice", command=("sleep", "100"))
    for token in (BOB, OPS):  # an admin reads the job, but its controls are the owner's alone (access.py)
        csrf = await sign_in(ui, token)
        theirs = await ui.post(f"/ui/jobs/{job.id}/cancel", data={"csrf": csrf})
        missing = await ui.post("/ui/jobs/zzzzzzzz/cancel", data={"csrf": csrf})
        assert theirs.status_code == missing.status_code == 404
        assert same_error(theirs, missing)
    assert f'action="/ui/jobs/{job.id}/cancel"' not in (await ui.get(f"/ui/jobs/{job.id}")).text
    assert not ui.h.cp.book.live[job.id].cancel_requested and not ui.h.cp.book.live[job.id].terminal


async def test_an_owner_ends_their_session_and_another_caller_gets_404(ui) -> None:
    await ui.h.run_job("alice", command=("true",), lease_tag="conv-1")
    csrf = await sign_in(ui, BOB)
    theirs = await ui.post("/ui/sessions/end", data={"csrf": csrf, "tag": "conv-1"})
    missing = await ui.post("/ui/sessions/end", data={"csrf": csrf, "tag": "no-such-tag"})
    assert theirs.status_code == missing.status_code == 404
    assert same_error(theirs, missing)
    csrf = await sign_in(ui, ALICE)
    page = (await ui.get("/ui/sessions")).text
    assert 'action="/ui/sessions/end"' in page and "End session" in page
    assert (await ui.post("/ui/sessions/end", data={"tag": "conv-1"})).status_code == 403
    assert any(p.key == ("alice", "default", "conv-1") for p in ui.h.cp.tracker.snapshot())
    r = await ui.post("/ui/sessions/end", data={"csrf": csrf, "tag": "conv-1", "queue": "default"})
    assert r.status_code == 303 and "Ended+session+conv-1" in r.headers["location"]
    await ui.h.spin()
    assert not any(p.key == ("alice", "default", "conv-1") and p.state.value != "retiring"
                   for p in ui.h.cp.tracker.snapshot())


async def test_the_admin_keeps_retire_for_other_callers_sessions(ui) -> None:
    await ui.h.run_job("alice", command=("true",), lease_tag="conv-2")
    await sign_in(ui, OPS)
    page = (await ui.get("/ui/sessions")).text
    row = next(r for r in page.split("<tr>") if "conv-2" in r)
    assert 'action="/ui/admin/retire-session"' in row and 'action="/ui/sessions/end"' not in row


async def test_jobs_show_the_quoted_command_and_a_sub_second_duration_in_ms(ui) -> None:
    job = await ui.h.run_job("alice", command=("sh", "-c", "sleep 0.3; echo 'a b'"))
    await sign_in(ui, ALICE)
    page = (await ui.get("/ui/jobs")).text
    cells = next(r for r in page.split("<tr") if f'data-job="{job.id}"' in r)
    assert "sh -c &#39;sleep 0.3; echo &#39;&#34;&#39;&#34;&#39;a b&#39;&#34;&#39;&#34;&#39;&#39;" in cells
    duration = re.search(r'data-field="duration"[^>]*>([^<]*)<', cells)
    assert duration and re.fullmatch(r"[0-9]+ ms", duration.group(1)), duration
    assert "sleep 0.3" in (await ui.get(f"/ui/jobs/{job.id}")).text


def test_durations_below_a_second_read_in_ms_and_running_jobs_count_up() -> None:
    assert elapsed(100.0, 100.34, 0.0) == "340 ms"
    assert elapsed(100.0, 102.5, 0.0) == "2.50 s"
    assert elapsed(100.0, None, 100.2) == "running for 200 ms"
    assert elapsed(None, None, 5.0) == "—"


def test_largest_placeable_reads_as_words_not_a_mapping() -> None:
    assert placeable({"node": 1, "8": 1, "1": 8, "2": 4, "4": 2}) == \
        "1 GPU: 8, 2 GPUs: 4, 4 GPUs: 2, 8 GPUs: 1, whole nodes: 1"
    assert placeable({}) == "—"


async def test_latency_gives_p50_p90_p99_per_path(ui) -> None:
    for _ in range(4):
        await ui.h.run_job("alice", command=("true",))
    lat = await views.latency(ui.h.cp, Identity("alice"))
    by_path = {q["path"]: q for q in lat["quantiles"]}
    assert sum(q["n"] for q in by_path.values()) == 4 and "warm" in by_path
    warm = by_path["warm"]
    assert warm["p50"] <= warm["p90"] <= warm["p99"]
    await sign_in(ui, ALICE)
    page = (await ui.get("/ui/latency")).text
    assert all(f"<th scope=\"col\">{q}</th>" in page for q in ("p50", "p90", "p99"))
    assert re.search(r'data-q="p99">[0-9.]+ (ms|s)<', page)


def test_percentile_is_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert (views.percentile(xs, 50), views.percentile(xs, 90), views.percentile(xs, 99)) == (50.0, 90.0, 99.0)
    assert views.percentile([3.0, 1.0, 2.0], 99) == 3.0 and views.percentile([7.0], 50) == 7.0


async def test_the_favicon_is_served_at_both_addresses_and_named_by_every_page(ui) -> None:
    for path in ("/favicon.ico", "/ui/static/favicon.svg"):
        r = await ui.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
        assert r.content.startswith(b"<svg")
    assert '<link rel="icon" href="/ui/static/favicon.svg"' in (await ui.get("/ui/")).text
