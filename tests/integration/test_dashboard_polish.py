"""Dashboard polish (issue 24) in headless Chromium against a real broker: the live Pools update reads as the
server page does, the Jobs page's command and duration columns, p50/p90/p99, owners cancel their jobs and
end their sessions (CSRF-checked; 404 for another caller), chart ticks that do not overlap, no 404 (favicon)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.sandbox import wrappers
from broker.ui.commands import display_command
from tests.integration.conftest import BrokerProcess
from tests.integration.test_dashboard import body, browser, cookie_client, login, sdk, shot, shots, wait_for

pytestmark = pytest.mark.integration
__all__ = ["browser", "shots"]  # fixtures shared with test_dashboard.py (Chromium; where screenshots go)

X_AXIS_GAPS = """
const u = arguments[0].uplot, ax = u.axes[0];
const ctx = document.createElement("canvas").getContext("2d");
ctx.font = Array.isArray(ax.font) ? ax.font[0] : ax.font;
const xs = ax._splits.map((v) => u.valToPos(v, "x"));
const labels = ax._values.map(String);
const widths = labels.map((s) => Math.max(...s.split("\\n").map((l) => ctx.measureText(l).width)));
const gaps = [];
for (let i = 1; i < xs.length; i++) gaps.push(xs[i] - xs[i - 1] - (widths[i] + widths[i - 1]) / 2);
return {labels: labels, gaps: gaps};
"""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("polish") / "broker")
    yield b
    b.stop()


def statuses(d: Any) -> list[tuple[int, str]]:
    """(status, url) of every response the page received since the last call (Chrome's performance log)."""
    out = []
    for entry in d.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.responseReceived":
            r = message["params"]["response"]
            out.append((int(r["status"]), str(r["url"])))
    return out


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, page[:500]
    return found.group(1)


def test_the_live_pools_update_writes_what_the_server_page_wrote(broker: BrokerProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    login(browser, broker, "alice")
    with cookie_client(browser, broker) as http:
        served = http.get("/ui/").text
    expected = dict(re.findall(r'data-pool="([^"]+)" data-field="largest_placeable">([^<]*)<', served))
    assert expected and "{" not in "".join(expected.values()), expected
    assert any("GPU" in v for v in expected.values()), expected  # the GPU pool's shapes, in words
    browser.get(broker.url + "/ui/")
    wait_for(lambda: "updated" in browser.find_element(By.ID, "live-status").text, what="a first live update")
    cells = "[data-field=largest_placeable]"
    browser.execute_script(f"document.querySelectorAll('{cells}').forEach((c) => {{ c.textContent = '(replaced)'; }})")
    with sdk(broker, "alice") as c:  # the pools change (a pod is busy, then held): the next events carry them
        c.run(["sleep", "1"], pool="cpu", lease_tag="polish-pools")
    wait_for(lambda: all(e.text != "(replaced)" for e in browser.find_elements(By.CSS_SELECTOR, cells)),
             what="a live pools update")
    shown = {e.get_attribute("data-pool"): e.text for e in browser.find_elements(By.CSS_SELECTOR, cells)}
    assert shown == expected
    assert "[object Object]" not in body(browser)


def test_jobs_show_the_quoted_command_the_mcp_callers_own_and_a_duration(broker: BrokerProcess,
                                                                          browser: Any) -> None:
    from selenium.webdriver.common.by import By

    login(browser, broker, "alice")
    browser.get(broker.url + "/ui/jobs")
    wait_for(lambda: "live" in browser.find_element(By.ID, "live-status").text, what="the SSE stream")
    plain = ["sh", "-c", "echo 'a b'; sleep 0.2"]
    mcp = wrappers.shell("echo from-mcp | tr a-z A-Z")
    with sdk(broker, "alice") as c:  # submitted after the page loaded: their rows arrive over SSE
        first = c.run(plain, lease_tag="polish-cmd")
        second = c.run(mcp, lease_tag="polish-cmd")
    assert second.exit_code == 0
    want = {first.id: "sh -c 'echo '\"'\"'a b'\"'\"'; sleep 0.2'", second.id: "echo from-mcp | tr a-z A-Z"}
    assert want[first.id] == display_command(plain)

    def check(origin: str) -> None:
        for job_id, command in want.items():
            row = f"tr[data-job='{job_id}']"
            wait_for(lambda r=row: "SUCCEEDED" in browser.find_element(By.CSS_SELECTOR, r).text,
                     what=f"{job_id} SUCCEEDED ({origin})")
            cell = browser.find_element(By.CSS_SELECTOR, f"{row} [data-field=command] code")
            assert cell.get_attribute("title") == command, origin
            assert cell.get_attribute("textContent") == command, origin
            took = browser.find_element(By.CSS_SELECTOR, f"{row} [data-field=duration]").text
            assert re.fullmatch(r"[0-9]+ ms|[0-9]+\.[0-9]{2} s", took), (origin, took)
        took = browser.find_element(By.CSS_SELECTOR, f"tr[data-job='{second.id}'] [data-field=duration]").text
        assert took.endswith(" ms"), took  # a sub-second job reads in ms, not "0 s"

    check("live")
    browser.get(broker.url + "/ui/jobs")
    check("server-rendered")
    assert "__fp_" not in browser.page_source and "firepool-call" not in browser.page_source
    browser.get(broker.url + f"/ui/jobs/{second.id}")
    assert browser.find_element(By.CSS_SELECTOR, "code.command").text == want[second.id]


def test_an_owner_cancels_a_running_job_from_the_jobs_list(broker: BrokerProcess, browser: Any,
                                                           shots: Path) -> None:
    from selenium.webdriver.common.by import By

    login(browser, broker, "alice")
    with sdk(broker, "alice") as c:
        job = c.submit(["sleep", "120"], lease_tag="polish-cancel")
        wait_for(lambda: c.get(job.id).state == "RUNNING", what="the job running")
        with cookie_client(browser, broker) as http:  # a POST without the token is refused
            r = http.post(f"/ui/jobs/{job.id}/cancel", data={"back": "/ui/jobs"})
            assert r.status_code == 403 and c.get(job.id).state == "RUNNING"
        bob = httpx.Client(base_url=broker.url)
        assert bob.post("/ui/login", data={"token": broker.tokens["bob"]}).status_code == 303
        token = csrf_of(bob.get("/ui/").text)
        theirs = bob.post(f"/ui/jobs/{job.id}/cancel", data={"csrf": token})
        missing = bob.post("/ui/jobs/j00000000000000000/cancel", data={"csrf": token})
        bob.close()
        assert theirs.status_code == missing.status_code == 404 and c.get(job.id).state == "RUNNING"
        browser.get(broker.url + "/ui/jobs")
        row = f"tr[data-job='{job.id}']"
        wait_for(lambda: re.search(r"running for [0-9.]+ (ms|s)", browser.find_element(By.CSS_SELECTOR, row).text),
                 what="a running duration")
        shot(browser, shots / "jobs-cancel.png")
        browser.find_element(By.CSS_SELECTOR, f"{row} button[data-action=cancel]").click()
        wait_for(lambda: f"Job {job.id}" in body(browser), what="the notice")
        assert c.wait(job.id, timeout=60).state == "CANCELLED"
    wait_for(lambda: "CANCELLED" in browser.find_element(By.CSS_SELECTOR, row).text, what="the row CANCELLED")
    assert not browser.find_elements(By.CSS_SELECTOR, f"{row} button[data-action=cancel]")


def test_an_owner_ends_their_session_from_the_sessions_page(broker: BrokerProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    with sdk(broker, "alice") as c:
        job = c.run(["true"], lease_tag="polish-end")
    pod = job.acquisition[0]["pod"]
    login(browser, broker, "bob")
    with cookie_client(browser, broker) as http:
        token = csrf_of(http.get("/ui/sessions").text)
        theirs = http.post("/ui/sessions/end", data={"csrf": token, "tag": "polish-end"})
        missing = http.post("/ui/sessions/end", data={"csrf": token, "tag": "polish-nobody"})
        assert theirs.status_code == missing.status_code == 404
    login(browser, broker, "alice")
    with cookie_client(browser, broker) as http:
        assert http.post("/ui/sessions/end", data={"tag": "polish-end"}).status_code == 403
    browser.get(broker.url + "/ui/sessions")
    browser.execute_script("window.confirm = () => true")
    row = wait_for(lambda: next(r for r in browser.find_elements(By.CSS_SELECTOR, "table.sessions tbody tr")
                                if "polish-end" in r.text))
    row.find_element(By.CSS_SELECTOR, "button[data-action=end-session]").click()
    wait_for(lambda: "Ended session polish-end" in body(browser), what="the notice")
    with sdk(broker, "alice") as c:
        pods = {p["name"]: p for p in c.pods()}
    assert pod not in pods or pods[pod]["state"] in ("retiring", "gone") or pods[pod].get("lease_tag") is None


def test_latency_shows_p50_p90_p99_per_path(broker: BrokerProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    with sdk(broker, "alice") as c:
        for _ in range(3):
            c.run(["true"], lease_tag="polish-lat")
    login(browser, broker, "alice")
    browser.get(broker.url + "/ui/latency")
    rows = {r.get_attribute("data-path"): r for r in browser.find_elements(By.CSS_SELECTOR, "table.quantiles tr[data-path]")}
    assert "warm" in rows, list(rows)
    for q in ("p50", "p90", "p99"):
        text = rows["warm"].find_element(By.CSS_SELECTOR, f"[data-q={q}]").text
        assert re.fullmatch(r"[0-9]+ ms|[0-9.]+ (s|min|h)", text), (q, text)


def test_chart_x_axis_labels_do_not_overlap(broker: BrokerProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    with sdk(broker, "alice") as c:  # jobs over a few seconds: the warm-share chart spans them
        for _ in range(4):
            c.run(["true"], lease_tag="polish-axis")
            time.sleep(1.0)
    login(browser, broker, "alice")
    for path, selector in (("/ui/latency", "[data-share]"), ("/ui/", "[data-timeline=cpu]")):
        deadline = time.monotonic() + 40
        while True:  # the timeline samples every 10 s: wait for a chart with several ticks
            browser.get(broker.url + path)
            el = wait_for(lambda s=selector: browser.find_element(By.CSS_SELECTOR, s), what=selector)
            got = wait_for(lambda e=el: browser.execute_script("return arguments[0].uplot ? 1 : 0", e) and
                           browser.execute_script(X_AXIS_GAPS, e), what=f"the chart on {path}")
            if len(got["labels"]) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(2.0)
        assert len(got["labels"]) >= 2, (path, got)
        assert min(got["gaps"]) >= 8, (path, got)  # at least 8 px between neighbouring labels
        assert len(set(got["labels"])) == len(got["labels"]), got  # no two ticks read the same
        assert all("\n" not in label for label in got["labels"]), got  # one line per tick, no date under the first


def test_no_page_gets_a_404_and_the_favicon_is_served(broker: BrokerProcess, browser: Any) -> None:
    login(browser, broker, "alice")
    statuses(browser)
    for path in ("/ui/", "/ui/jobs", "/ui/sessions", "/ui/pods", "/ui/latency"):
        browser.get(broker.url + path)
        time.sleep(0.5)
        icon = browser.execute_script("const l = document.querySelector('link[rel=icon]');"
                                      "return l && fetch(l.href).then((r) => [r.status, r.headers.get('content-type')]);")
        assert icon == [200, "image/svg+xml"], (path, icon)
    seen = statuses(browser)
    assert len(seen) > 10 and not [(s, u) for s, u in seen if s >= 400], seen
    r = httpx.get(broker.url + "/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
