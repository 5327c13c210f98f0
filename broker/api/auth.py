"""Bearer tokens mapped to callers. Tokens are kept only as SHA-256 digests in memory."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from broker.errors import Unauthorized


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenAuth:
    def __init__(self, tokens: Mapping[str, str]) -> None:
        for token, caller in tokens.items():
            if not token or not isinstance(caller, str) or not caller:
                raise ValueError("the token file must map non-empty tokens to non-empty caller names")
        self._callers = {_digest(t): c for t, c in tokens.items()}

    def caller(self, authorization: str | None) -> str:
        """The verified caller of an `Authorization` header, or Unauthorized."""
        if not authorization:
            raise Unauthorized("missing bearer token")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("expected 'Authorization: Bearer <token>'")
        caller = self._callers.get(_digest(token.strip()))
        if caller is None:
            raise Unauthorized("unknown token")
        return caller

    @classmethod
    def from_file(cls, path: Path) -> TokenAuth:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read token file {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"token file {path} must hold a JSON object token -> caller")
        return cls(data)


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
