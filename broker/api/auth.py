"""Who is calling: bearer tokens from the tokens file (stored hashed), or JWTs checked against a JWKS.

The tokens file is a JSON object. Each key is a token's SHA-256 digest (`sha256:<hex>`, what
`firepool token add` writes) or, for compatibility, the plain token (accepted with a warning). Each value
is the caller's name, or `{"caller": NAME, "admin": true}` for an operator who sees every caller's pods,
jobs and metrics. A presented token is hashed and compared with every entry in constant time, so neither
the file nor the comparison tells an attacker how close a guess came.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import json
import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.api.jwt_auth import JwtVerifier
from broker.errors import Unauthorized
from broker.locations import read_private

log = logging.getLogger("firepool.auth")

HASH_PREFIX = "sha256:"


@dataclass(frozen=True)
class Identity:
    """A verified caller; `admin` callers see every caller's pods, holds, jobs and metrics."""

    caller: str
    admin: bool = False


def token_digest(token: str) -> str:
    """The form a token is stored in: `sha256:<hex>`."""
    return HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def _entry(key: object, value: object) -> tuple[bytes, Identity, bool]:
    """(digest, identity, stored plain) of one tokens-file entry; ValueError names what is wrong."""
    if not isinstance(key, str) or not key:
        raise ValueError("the token file must map non-empty tokens to callers")
    if isinstance(value, str):
        identity = Identity(value)
    elif isinstance(value, dict) and set(value) <= {"caller", "admin"} and isinstance(value.get("caller"), str) \
            and isinstance(value.get("admin", False), bool):
        identity = Identity(value["caller"], bool(value.get("admin", False)))
    else:
        raise ValueError("a token must map to a caller name or to {\"caller\": NAME, \"admin\": true|false}")
    if not identity.caller:
        raise ValueError("the token file must map non-empty tokens to non-empty caller names")
    if key.startswith(HASH_PREFIX):
        hexdigest = key.removeprefix(HASH_PREFIX)
        if len(hexdigest) != 64 or any(c not in "0123456789abcdef" for c in hexdigest):
            raise ValueError(f"{key[:16]}…: a hashed token is sha256: and 64 lowercase hex digits")
        return bytes.fromhex(hexdigest), identity, False
    return hashlib.sha256(key.encode()).digest(), identity, True


class TokenFileError(ValueError):
    """A tokens-file entry the broker cannot use: which one (by position, never by its key) and why."""

    def __init__(self, n: int, key: object, message: str) -> None:
        super().__init__(f"entry {n}: {message}")
        self.n, self.key, self.reason = n, key, message


@dataclass(frozen=True)
class Credential:
    """What a dashboard session is bound to: the verified identity, the digest of the token presented
    (`sha256:<hex>` for a tokens-file token, `jwt:<hex>` for a JWT) and, for a JWT, its expiry."""

    identity: Identity
    digest: str
    expires_at: float | None = None


class TokenAuth:
    def __init__(self, tokens: Mapping[str, Any], jwt: JwtVerifier | None = None) -> None:
        entries = []
        for n, (key, value) in enumerate(tokens.items(), 1):
            try:
                entries.append(_entry(key, value))
            except ValueError as exc:
                raise TokenFileError(n, key, str(exc)) from None
        self._set(tokens, entries)
        self.jwt = jwt

    def _set(self, tokens: Mapping[str, Any], entries: list[tuple[bytes, Identity, bool]]) -> None:
        self._entries = [(digest, identity) for digest, identity, _ in entries]
        self._by_digest = {HASH_PREFIX + digest.hex(): identity for digest, identity in self._entries}
        self._plain = {k: v.caller for (k, (_, v, plain)) in zip(tokens, entries, strict=True) if plain}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def plain_tokens(self) -> dict[str, str]:
        """Entries stored in plain text (token -> caller): the only ones a proxy such as /mcp/ can forward."""
        return dict(self._plain)

    @property
    def digests(self) -> frozenset[str]:
        """The `sha256:<hex>` digest of every token in the file (what dashboard sessions are bound to)."""
        return frozenset(self._by_digest)

    def identity_of(self, digest: str) -> Identity | None:
        """The identity a token digest maps to now, or None once the token left the file. The digest comes
        from the broker's own session store, not from a caller, so a dictionary lookup is safe here."""
        return self._by_digest.get(digest)

    def caller(self, authorization: str | None) -> str:
        """The verified caller of an `Authorization` header, or Unauthorized."""
        return self.identify(authorization).caller

    def identify(self, authorization: str | None) -> Identity:
        """The verified identity of an `Authorization` header, or Unauthorized."""
        return self.credential(authorization).identity

    def credential(self, authorization: str | None) -> Credential:
        """The verified identity of an `Authorization` header and what it was proven with, or Unauthorized."""
        if not authorization:
            raise Unauthorized("missing bearer token")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("expected 'Authorization: Bearer <token>'")
        if self.jwt is not None and token.count(".") == 2:  # a JWT; static tokens have no dots
            caller, expires_at = self.jwt.verify(token)
            return Credential(Identity(caller), "jwt:" + hashlib.sha256(token.encode()).hexdigest(), expires_at)
        presented = hashlib.sha256(token.encode()).digest()
        found: Identity | None = None
        for digest, identity in self._entries:  # every entry, no early exit: the time says nothing
            if hmac.compare_digest(digest, presented):
                found = identity
        if found is None:
            raise Unauthorized("unknown token")
        return Credential(found, HASH_PREFIX + presented.hex())

    def reload(self, path: Path) -> None:
        """Re-read the tokens file in place (every holder of this object sees the new file); a bad file
        raises ValueError and the running tokens stay."""
        fresh = TokenAuth.from_file(path, self.jwt)
        self._entries, self._by_digest, self._plain = fresh._entries, fresh._by_digest, fresh._plain

    @classmethod
    def from_file(cls, path: Path, jwt: JwtVerifier | None = None) -> TokenAuth:
        data = read_tokens_file(path)
        try:
            auth = cls(data, jwt)
        except TokenFileError as exc:
            raise ValueError(f"token file {path}{_line_of(path, exc.key)}: {exc}") from None
        if auth._plain:
            log.warning("%s holds %d token(s) in plain text: replace them with `firepool token add` "
                        "(stores only a hash)", path, len(auth._plain))
        return auth


def _line_of(path: Path, key: object) -> str:
    """` line N` where the entry's key is written, for a message that points at it (never quoting it)."""
    try:
        text = path.read_text()
    except OSError:
        return ""
    at = text.find(json.dumps(key))
    return f" line {text.count(chr(10), 0, at) + 1}" if at >= 0 else ""


def read_tokens_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read token file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"token file {path} line {exc.lineno} column {exc.colno}: not JSON ({exc.msg})") from None
    except ValueError as exc:
        raise ValueError(f"token file {path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"token file {path} must hold a JSON object token -> caller")
    return data


def add_token(path: Path, caller: str, *, admin: bool = False, e2b: bool = False) -> str:
    """Create a token for `caller`, store only its digest in the tokens file (created 0600), return it.
    `e2b`: shaped as E2B's API keys, `e2b_<40 hex>` (an ordinary token all the same)."""
    if not caller or not caller.isprintable() or len(caller) > 128:
        raise ValueError("a caller name is 1 to 128 printable characters")
    data = read_tokens_file(path) if path.exists() else {}
    TokenAuth(data)  # refuse to add to a file the broker would refuse anyway
    token = "e2b_" + secrets.token_hex(20) if e2b else secrets.token_urlsafe(32)
    data[token_digest(token)] = {"caller": caller, "admin": True} if admin else caller
    _write_tokens(path, data)
    return token


def remove_tokens(path: Path, caller: str) -> int:
    """Remove every token of `caller` from the tokens file; return how many went. A running broker drops
    them (and ends their dashboard sessions) at its next SIGHUP or start."""
    data = read_tokens_file(path)
    TokenAuth(data)
    kept = {k: v for k, v in data.items() if (v.get("caller") if isinstance(v, dict) else v) != caller}
    if len(kept) < len(data):
        _write_tokens(path, kept)
    return len(data) - len(kept)


def _write_tokens(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)  # whole or not at all: a running broker never reads half a file


def local_token(state_dir: Path) -> str:
    """The embedded broker's token for the local user, created once in the state dir (mode 0600). It stays in
    clear because local clients (the SDK, the CLI, Jupyter) send it: a file others may read is refused."""
    path = state_dir / "token"
    try:
        return read_private(path).strip()
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def local_caller() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid{os.getuid()}"
