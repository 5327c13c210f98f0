"""What the port proxy needs besides bytes: its settings, its signed links and cookies, and host names.

A signed link (`POST /v1/sessions/{tag}/ports/{port}/link`) lets the owner open a server of the session in a
browser, which cannot send a bearer token. Its token is `<payload>.<HMAC-SHA256>` keyed by the broker's port
key (`PortSettings.key`: a file in the state dir, so links and cookies outlive a restart); the payload names
the caller, the session tag, the port, an expiry and the digest of the bearer token that asked for it, so a
token that leaves the tokens file takes its links and cookies with it (as it ends dashboard sessions,
broker.ui.session). Opening the link (`.../ports/{port}/.firepool/link?t=`) swaps it for a cookie of the same
form (kind `cookie`, the dashboard sessions' lifetime), scoped to that one session's port path (or port host)
and HttpOnly, then redirects to the port's root: the secret never stays in the address bar or history.

Host form (`--port-domain D`): `{port}-{tag}.D` when the tag is lowercase letters and digits with single
hyphens between, else `{port}--{base32(tag)}.D` (a raw tag never holds `--`): one DNS label (at most 63
characters) that names the session and port, for apps that must sit at `/`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from broker.api.auth import Identity
from broker.errors import InvalidRequest

LINK_PATH = "/.firepool/link"
"""Under a port's root: where a signed link is opened (the one path the proxy does not pass on)."""
COOKIE = "firepool_port"
KEY_FILE = "port-links.key"
_RAW_LABEL = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
MAX_LABEL = 63


@dataclass(frozen=True)
class PortSettings:
    low: int = 1024
    high: int = 65535
    """Ports of a sandbox the proxy reaches (`--port-range LOW-HIGH`); others are refused with a 422."""
    domain: str | None = None
    """`--port-domain`: also route `{port}-{tag}.{domain}` to the proxy (the host form)."""
    link_ttl_s: float = 300.0
    """Default lifetime of a signed link (the caller may ask for up to `max_link_ttl_s`)."""
    max_link_ttl_s: float = 3600.0
    max_body_bytes: int = 1 << 30
    """Largest request body the proxy passes to a sandbox server (`--port-max-body-bytes`), 413 above."""
    max_ws_message: int = 8 << 20
    """Largest websocket message either way (`--port-max-ws-message`); a bigger one closes with 1009."""
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    """The HMAC key of links and cookies (`load_key` reads it from the state dir)."""

    def check_port(self, port: int) -> None:
        if not self.low <= port <= self.high:
            raise InvalidRequest(f"port must be in {self.low}-{self.high} (the broker's --port-range), got {port}",
                                 {"field": "port", "low": self.low, "high": self.high})


def parse_range(text: str) -> tuple[int, int]:
    """`--port-range LOW-HIGH`."""
    low, sep, high = text.partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"--port-range must be LOW-HIGH, got {text!r}")
    lo, hi = int(low), int(high)
    if not 1 <= lo <= hi <= 65535:
        raise ValueError(f"--port-range must lie within 1-65535 with LOW <= HIGH, got {text!r}")
    return lo, hi


def load_key(state_dir: Path) -> bytes:
    """The port key kept in the state dir (created once, mode 0600)."""
    path = state_dir / KEY_FILE
    try:
        key = path.read_bytes()
        if len(key) >= 32:
            return key
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


@dataclass(frozen=True)
class Grant:
    """What a valid link or cookie says: this caller may reach this session's port until `expires_at`."""

    caller: str
    tag: str
    port: int
    expires_at: float
    token_digest: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, kind: str, payload: str) -> str:
        return _b64(hmac.new(self._key, f"{kind}\n{payload}".encode("ascii"), hashlib.sha256).digest())

    def sign(self, kind: str, grant: Grant) -> str:
        body = json.dumps([grant.caller, grant.tag, grant.port, round(grant.expires_at, 3), grant.token_digest],
                          separators=(",", ":"), ensure_ascii=True)
        payload = _b64(body.encode("ascii"))
        return f"{payload}.{self._mac(kind, payload)}"

    def verify(self, kind: str, token: str, now: float) -> Grant | None:
        """The grant of a token this key signed for `kind` and not yet expired; None for any other."""
        payload, sep, mac = token.partition(".")
        if not sep or len(token) > 4096 or not hmac.compare_digest(mac.encode(), self._mac(kind, payload).encode()):
            return None
        try:
            caller, tag, port, expires_at, digest = json.loads(_unb64(payload))
            grant = Grant(str(caller), str(tag), int(port), float(expires_at), str(digest))
        except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
            return None
        return grant if now < grant.expires_at else None


def still_valid(grant: Grant, identity_of: Callable[[str], Identity | None]) -> bool:
    """A grant's token is still honoured: a tokens-file token still maps to the same caller (a JWT's grant
    lives until its own expiry, which the link took from the JWT's)."""
    if grant.token_digest.startswith("jwt:"):
        return True
    who = identity_of(grant.token_digest)
    return who is not None and who.caller == grant.caller


def host_label(tag: str, port: int) -> str | None:
    """The DNS label of a session port in the host form, or None when the tag is too long for one."""
    if _RAW_LABEL.fullmatch(tag) and "--" not in tag:
        label = f"{port}-{tag}"
    else:
        label = f"{port}--" + base64.b32encode(tag.encode("utf-8")).decode("ascii").rstrip("=").lower()
    return label if len(label) <= MAX_LABEL else None


def parse_host(host: str, domain: str) -> tuple[str, int] | None:
    """(tag, port) of a `Host` header in the host form under `domain`, else None (not a port host)."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.lower().rstrip(".")
    suffix = "." + domain.lower().strip(".")
    if not name.endswith(suffix):
        return None
    label = name[: -len(suffix)]
    port_text, sep, rest = label.partition("-")
    if not sep or not port_text.isdigit() or len(port_text) > 5 or not rest:
        return None
    if rest.startswith("-"):
        encoded = rest[1:].upper()
        try:
            tag = base64.b32decode(encoded + "=" * (-len(encoded) % 8)).decode("utf-8")
        except (binascii.Error, ValueError):
            return None
    elif _RAW_LABEL.fullmatch(rest):
        tag = rest
    else:
        return None
    return tag, int(port_text)
