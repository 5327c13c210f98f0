"""The dashboard-session port: signed-in browser sessions, kept across broker restarts.

A session is known only by the SHA-256 digest of its random id (the cookie holds the id; the store never
does), so a copy of the store lets nobody sign in. `token_digest` names the credential the session was
opened with (`sha256:<hex>` of a tokens-file token, or `jwt:<hex>` of a JWT): when that credential leaves
the tokens file, its sessions end. The SQL implementation is `broker.store.ui_sessions` (the
`ui_sessions` table); `MemorySessionStore` is the fake for unit tests and stores without SQL.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Protocol


@dataclass(frozen=True)
class UiSession:
    id_digest: str
    """Hex SHA-256 of the session id the cookie carries."""
    caller: str
    token_digest: str
    """The credential it was opened with: `sha256:<hex>` (tokens file) or `jwt:<hex>` (a JWT)."""
    created_at: float
    last_seen: float
    """Last use as last written to the store (written at most every touch interval)."""
    expires_at: float
    """Absolute end: never valid after this, however busy."""


class UiSessionStore(Protocol):
    blocking: bool
    """True when calls do I/O (run them off the event loop)."""

    def get(self, id_digest: str) -> UiSession | None: ...

    def put(self, session: UiSession) -> None:
        """Insert a new session; durable on return."""
        ...

    def touch(self, id_digest: str, last_seen: float) -> None: ...

    def delete(self, id_digest: str) -> None: ...

    def delete_except(self, token_digests: Collection[str], before: float) -> int:
        """End every session opened with a static token not in `token_digests` (JWT sessions are kept),
        and every session that expired before `before`; return how many ended."""
        ...


class MemorySessionStore:
    blocking = False

    def __init__(self) -> None:
        self.sessions: dict[str, UiSession] = {}

    def get(self, id_digest: str) -> UiSession | None:
        return self.sessions.get(id_digest)

    def put(self, session: UiSession) -> None:
        self.sessions[session.id_digest] = session

    def touch(self, id_digest: str, last_seen: float) -> None:
        if id_digest in self.sessions:
            self.sessions[id_digest] = replace(self.sessions[id_digest], last_seen=last_seen)

    def delete(self, id_digest: str) -> None:
        self.sessions.pop(id_digest, None)

    def delete_except(self, token_digests: Collection[str], before: float) -> int:
        gone = [k for k, s in self.sessions.items() if s.expires_at < before
                or (s.token_digest.startswith("sha256:") and s.token_digest not in token_digests)]
        for k in gone:
            del self.sessions[k]
        return len(gone)
