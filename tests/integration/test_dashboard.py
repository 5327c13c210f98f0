"""The dashboard in a real browser: headless Chromium (Debian's package) driven by Selenium against a real broker.

Screenshots of every page go to $FIREPOOL_DASHBOARD_SCREENSHOTS when set (docs/img/ holds the committed
ones), else to a temporary folder: each page is still rendered and captured.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from broker.client import Client
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("dash") / "broker")
    yield b
    b.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("FIREPOOL_DASHBOARD_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("Debian's chromium and chromium-driver are not installed (.ci/run installs them)")
    from selenium import webdriver

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--force-prefers-reduced-motion", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"):
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    d = webdriver.Chrome(service=webdriver.ChromeService(CHROMEDRIVER), options=opts)
    d.set_page_load_timeout(30)
    requests: list[str] = []
    d.requests_seen = requests  # type: ignore[attr-defined]
    yield d
    d.quit()


def shot(d: Any, path: Path) -> None:
    """A screenshot, reduced to a 64-colour palette where Pillow is installed (docs/img stays small)."""
    d.save_screenshot(str(path))
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as image:
        image.convert("RGB").quantize(colors=64).save(path, optimize=True)


def collect_requests(d: Any) -> list[str]:
    """Every URL the page asked for since the last call (Chrome's performance log: CDP Network events)."""
    for entry in d.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            d.requests_seen.append(message["params"]["request"]["url"])
    return list(d.requests_seen)


def wait_for(cond: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = cond()
        except Exception:  # a node replaced by a live update between find and read
            got = None
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def login(d: Any, b: BrokerProcess, caller: str) -> None:
    from selenium.webdriver.common.by import By

    d.delete_all_cookies()
    d.get(b.url + "/ui/")
    box = d.find_element(By.CSS_SELECTOR, "input[type=password]")
    box.send_keys(b.tokens[caller])
    box.submit()
    wait_for(lambda: d.find_elements(By.CSS_SELECTOR, "form[action='/ui/logout']"), what="signed in")
    collect_requests(d)


def body(d: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(d.find_element(By.TAG_NAME, "body").text)


def sdk(b: BrokerProcess, caller: str) -> Client:
    return Client(b.url, b.tokens[caller])


def cookie_client(d: Any, b: BrokerProcess) -> httpx.Client:
    c = httpx.Client(base_url=b.url)
    for cookie in d.get_cookies():
        c.cookies.set(cookie["name"], cookie["value"], path=cookie.get("path", "/"))
    return c


def test_login_page_is_plain_html_with_no_external_asset(broker: BrokerProcess, browser: Any, shots: Path) -> None:
    browser.delete_all_cookies()
    browser.get(broker.url + "/ui/")
    assert "Bearer token" in body(browser)
    shot(browser, shots / "login.png")


def test_submitted_jobs_appear_live_with_their_acquisition_path(broker: BrokerProcess, browser: Any,
                                                                 shots: Path) -> None:
    from selenium.webdriver.common.by import By

    login(browser, broker, "alice")
    browser.get(broker.url + "/ui/jobs")
    wait_for(lambda: "live" in browser.find_element(By.ID, "live-status").text, what="the SSE stream")
    browser.execute_script("window.__sameDocument = true")  # a reload would drop it: rows must come over SSE
    with sdk(broker, "alice") as c:
        first = c.run(["sh", "-c", "echo first"], lease_tag="dash-live")
        second = c.run(["sh", "-c", "echo second"], lease_tag="dash-live")
    for job in (first, second):
        row = f"tr[data-job='{job.id}']"
        wait_for(lambda r=row: "SUCCEEDED" in browser.find_element(By.CSS_SELECTOR, r).text,
                 what=f"job {job.id} shown SUCCEEDED")
        cell = browser.find_element(By.CSS_SELECTOR, f"{row} [data-field=path]").text
        assert cell == job.path, (cell, job.path)
    assert second.path == "warm"  # the same session's second job took the first's pod
    assert browser.execute_script("return window.__sameDocument === true")
    shot(browser, shots / "jobs.png")


def test_a_job_page_streams_its_log_while_it_runs(broker: BrokerProcess, browser: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    login(browser, broker, "alice")
    with sdk(broker, "alice") as c:
        job = c.submit(["sh", "-c", "for i in 1 2 3 4 5 6; do echo line$i; sleep 0.7; done"], lease_tag="dash-log")
        browser.get(broker.url + f"/ui/jobs/{job.id}")
        log = lambda: browser.find_element(By.ID, "log").text  # noqa: E731
        wait_for(lambda: "line1" in log(), what="the first line")
        assert "line6" not in log()  # seen while the job still prints: streamed, not loaded at the end
        assert not c.get(job.id).terminal
        c.wait(job.id, timeout=60)
    wait_for(lambda: "SUCCEEDED" in body(browser), what="the page showing the end")  # it re-renders once
    wait_for(lambda: "line6" in log() and "end of output" in body(browser), what="the whole log")
    text = body(browser)
    assert "first instruction" in text and "Acquisition" in text
    shot(browser, shots / "job.png")


def test_another_caller_sees_none_of_the_jobs_and_gets_404_by_url(broker: BrokerProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    with sdk(broker, "alice") as c:
        job = c.run(["true"], lease_tag="dash-private")
    login(browser, broker, "bob")
    browser.get(broker.url + "/ui/jobs")
    wait_for(lambda: "live" in browser.find_element(By.ID, "live-status").text, what="the SSE stream")
    time.sleep(1.0)  # two live updates: neither may bring alice's jobs
    assert job.id not in browser.page_source and "dash-private" not in browser.page_source
    browser.get(broker.url + f"/ui/jobs/{job.id}")
    assert "Not found" in body(browser)
    with cookie_client(browser, broker) as http:
        assert http.get(f"/ui/jobs/{job.id}").status_code == 404
        assert http.get(f"/ui/jobs/{job.id}/log").status_code == 404
        assert http.get("/ui/jobs").status_code == 200


def test_an_admin_breaks_a_hold_and_the_pool_page_shows_it(broker: BrokerProcess, browser: Any,
                                                           shots: Path) -> None:
    from selenium.webdriver.common.by import By

    with sdk(broker, "carol") as c:
        job = c.run(["true"], lease_tag="dash-hold")
    pod = job.acquisition[0]["pod"]
    login(browser, broker, "ops")
    browser.get(broker.url + "/ui/")
    wait_for(lambda: pod in body(browser), what=f"carol's hold on {pod}")
    before = int(browser.find_element(By.CSS_SELECTOR, "[data-pool=cpu][data-field=holds_broken]").text)
    shot(browser, shots / "pools.png")
    row = wait_for(lambda: next(r for r in browser.find_elements(By.CSS_SELECTOR, "table.holds tr") if pod in r.text))
    row.find_element(By.CSS_SELECTOR, "button[data-action=break-hold]").click()
    wait_for(lambda: "Broke carol's hold" in body(browser), what="the notice")
    wait_for(lambda: int(browser.find_element(By.CSS_SELECTOR, "[data-pool=cpu][data-field=holds_broken]").text)
             == before + 1, what="holds broken to count it")
    holds = browser.find_element(By.CSS_SELECTOR, "table.holds").text
    assert pod not in holds
    with sdk(broker, "ops") as c:
        pods = {p["name"]: p for p in c.pods()}
    assert pod not in pods or pods[pod]["state"] in ("retiring", "gone")


def test_every_page_renders_and_no_request_leaves_127_0_0_1(broker: BrokerProcess, browser: Any,
                                                             shots: Path) -> None:
    login(browser, broker, "ops")
    for name, path in (("sessions", "/ui/sessions"), ("pods", "/ui/pods"), ("latency", "/ui/latency"),
                       ("pools-admin", "/ui/")):
        browser.get(broker.url + path)
        time.sleep(1.2)  # let the live stream and charts run
        assert "Internal" not in body(browser), path
        shot(browser, shots / f"{name}.png")
    seen = collect_requests(browser)
    assert any(u.endswith("/ui/static/uPlot.iife.min.js") for u in seen)
    outside = [u for u in seen if urlsplit(u).scheme not in ("data", "blob", "about", "chrome")
               and urlsplit(u).hostname not in ("127.0.0.1",)]
    assert not outside, outside[:5]


def test_the_dashboard_works_without_the_browser_too(broker: BrokerProcess) -> None:
    """The pages are server-rendered: a plain HTTP client reads the same figures, a session's workspace size too."""
    with sdk(broker, "alice") as c:
        c.run(["sh", "-c", "head -c 10240 /dev/zero > blob"], lease_tag="dash-size")
    with httpx.Client(base_url=broker.url) as http:
        r = http.post("/ui/login", data={"token": broker.tokens["alice"]})
        assert r.status_code == 303
        page = http.get("/ui/")
        assert page.status_code == 200 and "<table" in page.text and "cpu" in page.text
        sessions = http.get("/ui/sessions").text
        row = next(r for r in sessions.split("<tr>") if "dash-size" in r)
        assert "10.0 KiB" in row, row
