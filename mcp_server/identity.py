"""Who a tool call acts for, toward the broker, and how HTTP clients prove who they are.

stdio: one process serves one user; it talks to the broker with `FIREPOOL_TOKEN` (the SDK's discovery).

HTTP: clients send `Authorization: Bearer <mcp token>`; the SDK's bearer middleware asks
`FileTokenVerifier`, which maps the token (kept only as a SHA-256 digest; the `--tokens` file may hold
`sha256:` entries only) to a caller name. The server
then talks to the broker *as that caller* with the broker credential it holds for the caller (a
broker token file, token -> caller, the broker's own format), never with the client's token: MCP
tokens and broker tokens are separate secrets, and a caller with no broker credential is refused.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken

from broker.api.auth import HASH_PREFIX, TokenAuth
from broker.client import AsyncClient
from broker.errors import Unauthorized
from broker.locations import read_private


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def read_client_tokens(path: Path) -> dict[str, str]:
    """MCP client tokens, the broker's `--tokens` format: SHA-256 hex digest -> caller. These are only
    checked, never sent on, so `sha256:` entries (what `firepool token add` writes) serve as well as plain
    ones. ValueError names the line or entry that is wrong, in one line."""
    auth = TokenAuth.from_file(path)
    return {d.removeprefix(HASH_PREFIX): who.caller for d in auth.digests if (who := auth.identity_of(d))}


def read_broker_tokens(path: Path) -> dict[str, str]:
    """Broker token -> caller, for the server to act as each caller. These are sent to the broker, so they
    are kept in clear: the file must be private to its owner (InsecureFileError otherwise, as ssh refuses
    an open key) and a hashed entry, which cannot be sent, is refused."""
    read_private(path)
    auth = TokenAuth.from_file(path)
    hashed = len(auth) - len(auth.plain_tokens)
    if hashed:
        raise ValueError(f"broker token file {path}: {hashed} entr{'y is' if hashed == 1 else 'ies are'} stored "
                         "hashed; this server sends each caller's broker token on, so it needs them in clear "
                         "(keep the file mode 0600)")
    return auth.plain_tokens


class FileTokenVerifier:
    """The SDK's `TokenVerifier` over a token file: a known token verifies as its caller (`client_id`)."""

    def __init__(self, tokens: Mapping[str, str], digests: Mapping[str, str] | None = None) -> None:
        """`tokens`: plain token -> caller; `digests`: SHA-256 hex digest of a token -> caller."""
        self._callers = {_digest(t): c for t, c in tokens.items()}
        self._callers.update(digests or {})

    async def verify_token(self, token: str) -> AccessToken | None:
        caller = self._callers.get(_digest(token))
        if caller is None:
            return None
        return AccessToken(token=_digest(token), client_id=caller, subject=caller, scopes=[],
                           expires_at=int(time.time()) + 3600)


class Broker(Protocol):
    """The broker client to use for the current tool call."""

    transport: str

    def client(self) -> tuple[str, AsyncClient]:
        """(the caller's label, a client acting as that caller)."""
        ...

    async def close(self) -> None: ...


class StdioBroker:
    """One user per process: the client of FIREPOOL_URL / FIREPOOL_TOKEN (or the local broker)."""

    transport = "stdio"

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        self._client = AsyncClient(url, token)

    def client(self) -> tuple[str, AsyncClient]:
        return "", self._client

    async def close(self) -> None:
        await self._client.close()


class HttpBroker:
    """Many callers: the verified caller of the request picks the broker credential held for it."""

    transport = "http"

    def __init__(self, url: str | None, broker_tokens: Mapping[str, str]) -> None:
        self.url = url
        self._tokens = {caller: token for token, caller in broker_tokens.items()}
        self._clients: dict[str, AsyncClient] = {}

    def knows(self, caller: str) -> bool:
        return caller in self._tokens

    def client(self) -> tuple[str, AsyncClient]:
        access = get_access_token()
        if access is None:
            raise Unauthorized("no verified caller on this request")
        caller = access.client_id
        client = self._clients.get(caller)
        if client is None:
            token = self._tokens.get(caller)
            if token is None:
                raise Unauthorized(f"caller {caller!r} has no broker credential on this MCP server")
            client = self._clients[caller] = AsyncClient(self.url, token)
        return caller, client

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


class KnownCallerVerifier(FileTokenVerifier):
    """Verifies only callers the server can act for, so a token without a broker credential is a 401."""

    def __init__(self, tokens: Mapping[str, str], broker: HttpBroker, digests: Mapping[str, str] | None = None) -> None:
        super().__init__(tokens, digests)
        self._broker = broker

    async def verify_token(self, token: str) -> AccessToken | None:
        access = await super().verify_token(token)
        return access if access is not None and self._broker.knows(access.client_id) else None
