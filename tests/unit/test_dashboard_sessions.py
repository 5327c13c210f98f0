"""Dashboard sessions on a virtual clock: the cookie is a session id, never the token; sign-out, expiry,
idleness and a removed token end a session server-side; the last use is written at most every touch_s."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from broker.api.app import create_app
from broker.api.auth import TokenAuth, token_digest
from broker.api.exposure import Exposure
from broker.ports.ui_sessions import MemorySessionStore
from broker.ui.session import COOKIE, SessionSettings
from tests.unit.harness import Harness, cpu_pool

ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789"
SETTINGS = SessionSettings(max_age_s=8 * 3600, idle_s=1800, touch_s=60)


class CountingStore(MemorySessionStore):
    def __init__(self) -> None:
        super().__init__()
        self.touches = 0

    def touch(self, id_digest: str, last_seen: float) -> None:
        self.touches += 1
        super().touch(id_digest, last_seen)


class Dash:
    def __init__(self, h: Harness, auth: TokenAuth, store: CountingStore, tokens: Path) -> None:
        self.h, self.auth, self.store, self.tokens = h, auth, store, tokens

    def app(self, exposure: Exposure = Exposure()) -> httpx.AsyncClient:
        """A client of a fresh app (a fresh process's memory) over the same session store."""
        app = create_app(self.h.cp, self.auth, ui_sessions=self.store, ui_session_settings=SETTINGS,
                         exposure=exposure)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp")


@pytest.fixture
async def dash(tmp_path: Path):
    h = await Harness([cpu_pool()]).start()
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({token_digest(ALICE): "alice", token_digest(BOB): "bob"}))
    yield Dash(h, TokenAuth.from_file(tokens), CountingStore(), tokens)
    await h.stop()


async def sign_in(http: httpx.AsyncClient, token: str) -> str:
    r = await http.post("/ui/login", data={"token": token, "next": "/ui/jobs"})
    assert r.status_code == 303, r.text
    return r.cookies[COOKIE]


async def signed_in(http: httpx.AsyncClient, sid: str | None = None) -> bool:
    """Whether a page comes back signed in: with the client's cookies, or with exactly `sid` (a replay)."""
    if sid is not None:
        http.cookies.clear()
    r = await http.get("/ui/jobs", headers={"Cookie": f"{COOKIE}={sid}"} if sid is not None else None)
    return r.status_code == 200 and 'type="password"' not in r.text


async def test_the_cookie_is_a_random_session_id_never_the_token(dash: Dash) -> None:
    async with dash.app() as http:
        r = await http.post("/ui/login", data={"token": ALICE})
        cookie = r.headers["set-cookie"]
        assert ALICE not in cookie and token_digest(ALICE).removeprefix("sha256:") not in cookie
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        sid = r.cookies[COOKIE]
        assert len(sid) >= 40 and sid not in json.dumps([s.__dict__ for s in dash.store.sessions.values()])
        second = await sign_in(http, ALICE)
        assert second != sid  # each sign-in a session of its own
        assert await signed_in(http)


async def test_a_cookie_replayed_after_sign_out_is_refused(dash: Dash) -> None:
    async with dash.app() as http:
        sid = await sign_in(http, ALICE)
        page = await http.get("/ui/")
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert csrf
        assert await signed_in(http, sid)  # the replay works until sign-out
        r = await http.post("/ui/logout", data={"csrf": csrf.group(1)}, headers={"Cookie": f"{COOKIE}={sid}"})
        assert r.status_code == 303
        assert not await signed_in(http, sid)  # the attacker's saved copy
        assert (await http.get("/ui/events", headers={"Cookie": f"{COOKIE}={sid}"})).status_code == 401
        assert not dash.store.sessions


async def test_a_session_lives_on_in_a_restarted_broker(dash: Dash) -> None:
    async with dash.app() as first:
        sid = await sign_in(first, ALICE)
    async with dash.app() as second:  # nothing of the first app's memory
        assert await signed_in(second, sid)


async def test_a_session_ends_at_its_max_age_however_busy(dash: Dash) -> None:
    async with dash.app() as http:
        await sign_in(http, ALICE)
        for _ in range(int(SETTINGS.max_age_s // 1200) - 1):
            dash.h.clock.advance(1200)  # a use every 20 minutes: never idle
            assert await signed_in(http)
        dash.h.clock.advance(1200)
        assert not await signed_in(http)
        assert not dash.store.sessions


async def test_an_idle_session_ends(dash: Dash) -> None:
    async with dash.app() as http:
        await sign_in(http, ALICE)
        dash.h.clock.advance(SETTINGS.idle_s - 1)
        assert await signed_in(http)
        dash.h.clock.advance(SETTINGS.idle_s)
        assert not await signed_in(http)


async def test_an_idle_session_ends_after_a_restart_too(dash: Dash) -> None:
    async with dash.app() as first:
        sid = await sign_in(first, ALICE)
    async with dash.app() as second:
        assert await signed_in(second, sid)
    dash.h.clock.advance(SETTINGS.idle_s + 1)
    async with dash.app() as second:
        assert await signed_in(second, sid) is False


async def test_the_last_use_is_written_at_most_once_per_touch_interval(dash: Dash) -> None:
    async with dash.app() as http:
        await sign_in(http, ALICE)
        for _ in range(30):
            dash.h.clock.advance(1)
            assert await signed_in(http)
        assert dash.store.touches == 0  # 30 page views within a minute: no store write
        dash.h.clock.advance(SETTINGS.touch_s)
        assert await signed_in(http)
        assert dash.store.touches == 1


async def test_removing_a_token_from_the_file_ends_its_sessions(dash: Dash) -> None:
    async with dash.app() as alice, dash.app() as bob:
        await sign_in(alice, ALICE)
        await sign_in(bob, BOB)
        dash.tokens.write_text(json.dumps({token_digest(BOB): "bob"}))  # `firepool token rm alice`
        dash.auth.reload(dash.tokens)  # SIGHUP
        assert not await signed_in(alice)
        assert await signed_in(bob)


async def test_a_reload_purges_the_stored_sessions_of_removed_tokens(dash: Dash) -> None:
    from broker.ui import end_stale_sessions

    app = create_app(dash.h.cp, dash.auth, ui_sessions=dash.store, ui_session_settings=SETTINGS)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
        await sign_in(http, ALICE)
        await sign_in(http, BOB)
    assert len(dash.store.sessions) == 2
    dash.tokens.write_text(json.dumps({token_digest(BOB): "bob"}))
    dash.auth.reload(dash.tokens)
    assert await end_stale_sessions(app) == 1
    assert [s.caller for s in dash.store.sessions.values()] == ["bob"]


async def test_a_token_given_to_another_caller_does_not_keep_the_old_callers_session(dash: Dash) -> None:
    async with dash.app() as http:
        await sign_in(http, ALICE)
        dash.tokens.write_text(json.dumps({token_digest(ALICE): "mallory"}))
        dash.auth.reload(dash.tokens)
        assert not await signed_in(http)


@pytest.mark.parametrize(("exposure", "secure"), [
    (Exposure("127.0.0.1"), False), (Exposure("0.0.0.0", insecure_http=True), True),
    (Exposure("10.1.2.3", insecure_http=True), True), (Exposure("127.0.0.1", tls=True), True),
    (Exposure("::1"), False),
])
async def test_the_cookie_is_secure_unless_the_broker_is_plain_http_on_loopback(dash: Dash, exposure: Exposure,
                                                                               secure: bool) -> None:
    async with dash.app(exposure) as http:
        r = await http.post("/ui/login", data={"token": ALICE})
        assert ("secure" in r.headers["set-cookie"].lower()) is secure


async def test_healthz_names_the_transport(dash: Dash) -> None:
    for exposure, transport in ((Exposure(), "http"), (Exposure("0.0.0.0", insecure_http=True), "http-insecure"),
                                (Exposure("0.0.0.0", tls=True), "https")):
        async with dash.app(exposure) as http:
            assert (await http.get("/healthz")).json()["transport"] == transport


def test_plain_http_beyond_loopback_is_refused_without_insecure_http() -> None:
    assert Exposure("0.0.0.0").refusal() and "--insecure-http" in (Exposure("0.0.0.0").refusal() or "")
    assert Exposure("example.org").refusal()
    for ok in (Exposure("127.0.0.1"), Exposure("localhost"), Exposure("::1"), Exposure("0.0.0.0", tls=True),
               Exposure("0.0.0.0", insecure_http=True)):
        assert ok.refusal() is None


async def test_expired_sessions_leave_the_store_at_a_later_sign_in(dash: Dash) -> None:
    async with dash.app() as http:
        await sign_in(http, ALICE)
        dash.h.clock.advance(SETTINGS.max_age_s + 1)
        await sign_in(http, BOB)  # nobody used alice's session again: the sign-in sweeps it
        assert [s.caller for s in dash.store.sessions.values()] == ["bob"]
