"""Dashboard sign-in: a server-side session per browser, and a CSRF token per session.

The login form posts the bearer token once; the broker checks it with the same `TokenAuth` as the REST
API and answers with cookie `firepool_session`: a random id (never the token) whose SHA-256 digest the
job store keeps with the caller, the digest of the token it was opened with, an absolute expiry and the
last use. The cookie is HttpOnly, SameSite=Strict, and Secure over TLS or whenever the broker listens
beyond loopback (`SessionSettings.secure`). Sign-out deletes the stored session, so a copied cookie
dies with it; a token removed from the tokens file ends its sessions (checked on every request, purged
at reload). Every mutating form carries `csrf`, an HMAC keyed by the session id: only a holder of the
HttpOnly cookie can compute it, a page of another site can neither read it nor forge it, and it stays
good across a broker restart as the session does.

Sessions are cached in memory, so a page view costs no store read; the last use is written back at most
every `touch_s` seconds, so it costs no store write either.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.responses import Response
from starlette.requests import HTTPConnection

from broker.api.auth import Credential, Identity
from broker.clock import Clock
from broker.errors import Forbidden, InvalidRequest
from broker.ports.ui_sessions import UiSession, UiSessionStore

COOKIE = "firepool_session"
OLD_COOKIE = "firepool_token"
"""The cookie of brokers before sessions, which held the token itself: cleared at sign-in and sign-out."""
MAX_FORM_BYTES = 16 * 1024
CACHED = 10_000
"""Sessions kept in memory; past it the oldest are dropped from memory (not ended: re-read on next use)."""
PURGE_EVERY_S = 3600.0
"""Expired sessions are deleted from the store at most this often, on a sign-in: the table holds only the
sessions opened within one max age, not every sign-in ever."""

T = TypeVar("T")


@dataclass(frozen=True)
class SessionSettings:
    max_age_s: float = 12 * 3600.0
    """Absolute lifetime of a session, however busy (`--ui-session-max-age`)."""
    idle_s: float = 3600.0
    """A session unused this long ends (`--ui-session-idle`)."""
    touch_s: float = 60.0
    """The last use is written to the store at most this often (the idle timeout is that much coarser
    after a restart)."""
    secure: bool = False
    """Always mark the cookie Secure (a broker served over TLS or bound beyond loopback)."""


class Verifier(Protocol):
    """What sessions need of `TokenAuth`."""

    def credential(self, authorization: str | None) -> Credential: ...

    def identity_of(self, digest: str) -> Identity | None: ...

    @property
    def digests(self) -> frozenset[str]: ...


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    def __init__(self, auth: Verifier, store: UiSessionStore, clock: Clock,
                 settings: SessionSettings = SessionSettings()) -> None:
        self.auth = auth
        self.store = store
        self.clock = clock
        self.settings = settings
        self._cache: dict[str, UiSession] = {}
        self._used: dict[str, float] = {}
        """Last use of each cached session, exact (the store's copy lags by up to touch_s)."""
        self._purged_at = float("-inf")

    async def _io(self, fn: Callable[..., T], *args: object) -> T:
        if self.store.blocking:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    async def identity(self, request: HTTPConnection) -> Identity | None:
        """The signed-in caller (of a page request or a websocket handshake), or None (no cookie, or a session that ended, expired or idled out, or whose
        token the tokens file no longer holds)."""
        sid = request.cookies.get(COOKIE)
        if not sid or len(sid) > 128:
            return None
        key = _digest(sid)
        session = self._cache.get(key)
        if session is None:
            session = await self._io(self.store.get, key)
            if session is None:
                return None
            self._remember(session)
        now = self.clock.now()
        used = self._used.get(key, session.last_seen)
        who = self._valid(session, now, used)
        if who is None:
            await self._end(key)
            return None
        self._used[key] = now
        if now - session.last_seen >= self.settings.touch_s:
            self._cache[key] = replace(session, last_seen=now)
            await self._io(self.store.touch, key, now)
        return who

    def _valid(self, session: UiSession, now: float, used: float) -> Identity | None:
        if now >= session.expires_at or now - used >= self.settings.idle_s:
            return None
        if session.token_digest.startswith("jwt:"):
            return Identity(session.caller)  # a JWT caller is never admin; its session ends with the JWT
        who = self.auth.identity_of(session.token_digest)
        return who if who is not None and who.caller == session.caller else None

    def _remember(self, session: UiSession) -> None:
        while len(self._cache) >= CACHED:
            oldest = next(iter(self._cache))
            self._cache.pop(oldest)
            self._used.pop(oldest, None)
        self._cache[session.id_digest] = session

    async def _end(self, key: str) -> None:
        self._cache.pop(key, None)
        self._used.pop(key, None)
        await self._io(self.store.delete, key)

    def check_token(self, token: str) -> Credential:
        return self.auth.credential(f"Bearer {token.strip()}")

    async def sign_in(self, response: Response, request: Request, token: str) -> Identity:
        """Open a session for a valid token and set its cookie; Unauthorized for any other."""
        cred = self.check_token(token)
        now = self.clock.now()
        if now - self._purged_at >= PURGE_EVERY_S:
            await self.purge()
        expires = now + self.settings.max_age_s
        if cred.expires_at is not None:
            expires = min(expires, cred.expires_at)
        sid = secrets.token_urlsafe(32)
        session = UiSession(_digest(sid), cred.identity.caller, cred.digest, now, now, expires)
        await self._io(self.store.put, session)
        self._remember(session)
        response.set_cookie(COOKIE, sid, httponly=True, samesite="strict", path="/ui",
                            secure=self.settings.secure or request.url.scheme == "https",
                            max_age=int(max(1.0, expires - now)))
        response.delete_cookie(OLD_COOKIE, path="/ui")
        return cred.identity

    async def sign_out(self, request: Request, response: Response) -> None:
        """End the session server-side: its cookie, replayed, no longer signs anyone in."""
        sid = request.cookies.get(COOKIE)
        if sid:
            await self._end(_digest(sid))
        response.delete_cookie(COOKIE, path="/ui")
        response.delete_cookie(OLD_COOKIE, path="/ui")

    async def purge(self) -> int:
        """End the sessions whose token left the tokens file and those past their expiry (at start and
        after the tokens file is reloaded)."""
        self._purged_at = self.clock.now()
        digests = self.auth.digests
        for key, session in list(self._cache.items()):
            if session.token_digest.startswith("sha256:") and session.token_digest not in digests:
                self._cache.pop(key, None)
                self._used.pop(key, None)
        return await self._io(self.store.delete_except, digests, self.clock.now())

    def csrf(self, request: Request) -> str:
        sid = request.cookies.get(COOKIE, "")
        return hmac.new(sid.encode(), b"firepool dashboard csrf", hashlib.sha256).hexdigest()

    def check_csrf(self, request: Request, presented: str | None) -> None:
        if not request.cookies.get(COOKIE) or not presented or not hmac.compare_digest(presented, self.csrf(request)):
            raise Forbidden("the form's CSRF token is missing or wrong: reload the page and try again")


def check_origin(request: Request) -> None:
    """A form posted from another site's page is refused before anything else (login included): browsers
    name the page's origin on every POST, and it must be this broker's own."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null" and request.headers.get("sec-fetch-site") in (None, "same-origin"):
        return  # not a browser (SDK, tests), or a browser that withholds it: CSRF tokens still apply
    if urlsplit(origin).netloc != request.headers.get("host", ""):
        raise Forbidden("this form was posted from another site")


async def form(request: Request) -> dict[str, str]:
    """An url-encoded form body (the only kind the dashboard's forms send), first value per field."""
    check_origin(request)
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind != "application/x-www-form-urlencoded":
        raise InvalidRequest("dashboard forms are application/x-www-form-urlencoded", {"field": "body"})
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise InvalidRequest("form too large", {"field": "body"})
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items() if v}
