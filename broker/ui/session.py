"""Dashboard sign-in: the caller's bearer token in an HttpOnly cookie, and a CSRF token per session.

The login form posts the token; the broker checks it with the same `TokenAuth` as the REST API and
sets it as cookie `firepool_token` (HttpOnly, SameSite=Strict, Secure when the request came over
TLS). Every mutating form carries `csrf`, an HMAC of the cookie's token under a secret that lives
only in this broker process: a page of another site can neither read it nor forge it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.responses import Response

from broker.api.auth import Identity, TokenAuth
from broker.errors import Forbidden, InvalidRequest, Unauthorized

COOKIE = "firepool_token"
MAX_FORM_BYTES = 16 * 1024


class Sessions:
    def __init__(self, auth: TokenAuth, secret: bytes | None = None) -> None:
        self.auth = auth
        self._secret = secret or secrets.token_bytes(32)

    def identity(self, request: Request) -> Identity | None:
        """The signed-in caller, or None (no cookie, or a token the tokens file no longer holds)."""
        token = request.cookies.get(COOKIE)
        if not token:
            return None
        try:
            return self.auth.identify(f"Bearer {token}")
        except Unauthorized:
            return None

    def check_token(self, token: str) -> Identity:
        return self.auth.identify(f"Bearer {token.strip()}")

    def csrf(self, request: Request) -> str:
        token = request.cookies.get(COOKIE, "")
        return hmac.new(self._secret, token.encode(), hashlib.sha256).hexdigest()

    def check_csrf(self, request: Request, presented: str | None) -> None:
        if not presented or not hmac.compare_digest(presented, self.csrf(request)):
            raise Forbidden("the form's CSRF token is missing or wrong: reload the page and try again")

    @staticmethod
    def sign_in(response: Response, request: Request, token: str) -> None:
        response.set_cookie(COOKIE, token.strip(), httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", path="/ui")

    @staticmethod
    def sign_out(response: Response) -> None:
        response.delete_cookie(COOKIE, path="/ui")


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
