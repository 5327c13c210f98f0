"""Dashboard sessions on a real broker: the cookie is not the token, a session survives a restart, and
sign-out or `firepool token rm` + SIGHUP ends it, so a saved cookie replayed afterwards signs nobody in."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration


def sign_in(broker: BrokerProcess, caller: str) -> tuple[dict[str, str], str]:
    """(the cookies sign-in set, the CSRF token of the page after it)."""
    with httpx.Client(base_url=broker.url) as http:
        r = http.post("/ui/login", data={"token": broker.tokens[caller], "next": "/ui/"})
        assert r.status_code == 303, r.text
        cookies = dict(r.cookies)
        page = http.get("/ui/", headers=cookie_header(cookies))
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert csrf, page.text
    return cookies, csrf.group(1)


def cookie_header(cookies: dict[str, str]) -> dict[str, str]:
    """The cookies sent as a browser (or an attacker replaying a saved copy) would, whatever the jar thinks."""
    return {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())}


def signed_in(broker: BrokerProcess, cookies: dict[str, str]) -> bool:
    with httpx.Client(base_url=broker.url) as http:
        r = http.get("/ui/jobs", headers=cookie_header(cookies))
    return r.status_code == 200 and 'type="password"' not in r.text


def test_a_session_survives_a_restart_and_dies_at_sign_out(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b")
    try:
        cookies, csrf = sign_in(broker, "alice")
        assert all(broker.tokens["alice"] not in v for v in cookies.values())
        assert signed_in(broker, cookies)
        broker.stop()
        broker.start()  # same state dir and job store, a new process
        assert signed_in(broker, cookies)
        r = httpx.post(broker.url + "/ui/logout", data={"csrf": csrf}, headers=cookie_header(cookies))
        assert r.status_code == 303
        assert not signed_in(broker, cookies)  # the saved cookie, replayed
    finally:
        broker.stop()


def test_token_rm_and_sighup_end_that_callers_sessions(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b")
    try:
        alice, _ = sign_in(broker, "alice")
        bob, _ = sign_in(broker, "bob")
        tokens = tmp_path / "b-tokens.json"
        r = subprocess.run([sys.executable, "-m", "broker.cli", "token", "rm", "alice", "--tokens", str(tokens)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert signed_in(broker, alice)  # the running broker reads the file at SIGHUP
        assert broker.proc is not None
        os.kill(broker.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 20
        while signed_in(broker, alice) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not signed_in(broker, alice)
        assert signed_in(broker, bob)
        assert httpx.get(broker.url + "/v1/whoami",
                         headers={"Authorization": f"Bearer {broker.tokens['alice']}"}).status_code == 401
    finally:
        broker.stop()
