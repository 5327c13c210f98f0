"""The dashboard's terminal page in headless Chromium: xterm.js (vendored) on the broker's websocket, under
the dashboard's CSP, signed in by the session cookie; another caller, or another site's page, gets nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.integration.conftest import BrokerProcess, run_job
from tests.integration.test_dashboard import browser, collect_requests, login, wait_for

pytestmark = pytest.mark.integration
__all__ = ["browser"]  # the module-scoped Chromium fixture, shared with test_dashboard


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("dashterm") / "broker")
    yield b
    b.stop()


def _screen(d: Any) -> str:
    from selenium.webdriver.common.by import By

    return "\n".join(e.text for e in d.find_elements(By.CSS_SELECTOR, ".xterm-rows > div"))


def test_the_terminal_page_runs_a_typed_command_in_the_session_sandbox(broker: BrokerProcess, browser: Any) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    d = browser
    job = run_job(broker.client("alice"), {"command": ["sh", "-c", "echo page-ok > seen.txt"], "pool": "cpu",
                                           "lease_tag": "web"})
    assert job["state"] == "SUCCEEDED", job
    login(d, broker, "alice")
    d.get(broker.url + "/ui/sessions")
    d.find_element(By.CSS_SELECTOR, "a[data-terminal='web']").click()
    wait_for(lambda: d.find_element(By.ID, "terminal-status").text == "connected", what="the terminal connected")
    wait_for(lambda: "$" in _screen(d), what="the shell's prompt")
    ActionChains(d).send_keys("cat seen.txt; echo $((6 * 7))-answer\n").perform()
    wait_for(lambda: "42-answer" in _screen(d) and "page-ok" in _screen(d), what="the command's output")
    violations = [e["message"] for e in d.get_log("browser") if "Content Security Policy" in e["message"]]
    assert violations == []
    assert all(u.startswith((broker.url, broker.url.replace("http", "ws", 1), "data:"))
               for u in collect_requests(d))
    ActionChains(d).send_keys("exit 4\n").perform()
    wait_for(lambda: "code 4" in d.find_element(By.ID, "terminal-status").text, what="the exit code shown")


def test_another_callers_terminal_page_and_socket_are_not_found(broker: BrokerProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    run_job(broker.client("alice"), {"command": ["true"], "pool": "cpu", "lease_tag": "alices"})
    login(browser, broker, "bob")
    browser.get(broker.url + "/ui/sessions/alices/terminal")
    assert "Not found" in browser.find_element(By.TAG_NAME, "h1").text
    cookie = "; ".join(f"{c['name']}={c['value']}" for c in browser.get_cookies())
    ws_url = broker.url.replace("http", "ws", 1) + "/ui/sessions/alices/terminal/ws"
    with pytest.raises(InvalidStatus) as bob:
        connect(ws_url, origin=broker.url, additional_headers={"Cookie": cookie}, open_timeout=10)  # type: ignore[arg-type]
    assert bob.value.response.status_code == 404


def test_a_dashboard_terminal_refuses_another_sites_page(broker: BrokerProcess, browser: Any) -> None:
    run_job(broker.client("alice"), {"command": ["true"], "pool": "cpu", "lease_tag": "csws"})
    login(browser, broker, "alice")
    cookie = "; ".join(f"{c['name']}={c['value']}" for c in browser.get_cookies())
    ws_url = broker.url.replace("http", "ws", 1) + "/ui/sessions/csws/terminal/ws"
    with pytest.raises(InvalidStatus) as foreign:
        connect(ws_url, origin="http://evil.example", additional_headers={"Cookie": cookie},  # type: ignore[arg-type]
                open_timeout=10)
    assert foreign.value.response.status_code == 403
    assert json.loads(foreign.value.response.body)["error"]["class"] == "Forbidden"
    with connect(ws_url, origin=broker.url, additional_headers={"Cookie": cookie},  # type: ignore[arg-type]
                 open_timeout=10) as ws:
        ws.send(json.dumps(["stdin", "exit 5\r"]))
        frames = [json.loads(m) for m in ws]
    assert frames[-1] == ["exit", 5]
