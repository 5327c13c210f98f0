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


class TokenAuth:
    def __init__(self, tokens: Mapping[str, Any], jwt: JwtVerifier | None = None) -> None:
        entries = [_entry(k, v) for k, v in tokens.items()]
        self._entries = [(digest, identity) for digest, identity, _ in entries]
        self._plain = {k: v.caller for (k, (_, v, plain)) in zip(tokens, entries, strict=True) if plain}
        self.jwt = jwt

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def plain_tokens(self) -> dict[str, str]:
        """Entries stored in plain text (token -> caller): the only ones a proxy such as /mcp/ can forward."""
        return dict(self._plain)

    def caller(self, authorization: str | None) -> str:
        """The verified caller of an `Authorization` header, or Unauthorized."""
        return self.identify(authorization).caller

    def identify(self, authorization: str | None) -> Identity:
        """The verified identity of an `Authorization` header, or Unauthorized."""
        if not authorization:
            raise Unauthorized("missing bearer token")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("expected 'Authorization: Bearer <token>'")
        if self.jwt is not None and token.count(".") == 2:  # a JWT; static tokens have no dots
            return Identity(self.jwt.caller(token))
        presented = hashlib.sha256(token.encode()).digest()
        found: Identity | None = None
        for digest, identity in self._entries:  # every entry, no early exit: the time says nothing
            if hmac.compare_digest(digest, presented):
                found = identity
        if found is None:
            raise Unauthorized("unknown token")
        return found

    @classmethod
    def from_file(cls, path: Path, jwt: JwtVerifier | None = None) -> TokenAuth:
        data = read_tokens_file(path)
        auth = cls(data, jwt)
        if auth._plain:
            log.warning("%s holds %d token(s) in plain text: replace them with `firepool token add` "
                        "(stores only a hash)", path, len(auth._plain))
        return auth


def read_tokens_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read token file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"token file {path} must hold a JSON object token -> caller")
    return data


def add_token(path: Path, caller: str, *, admin: bool = False) -> str:
    """Create a token for `caller`, store only its digest in the tokens file (created 0600), return it."""
    if not caller or not caller.isprintable() or len(caller) > 128:
        raise ValueError("a caller name is 1 to 128 printable characters")
    data = read_tokens_file(path) if path.exists() else {}
    TokenAuth(data)  # refuse to add to a file the broker would refuse anyway
    token = secrets.token_urlsafe(32)
    data[token_digest(token)] = {"caller": caller, "admin": True} if admin else caller
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)  # whole or not at all: a running broker never reads half a file
    return token


def local_token(state_dir: Path) -> str:
    """The embedded broker's token for the local user, created once in the state dir (mode 0600)."""
    path = state_dir / "token"
    try:
        return path.read_text().strip()
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
