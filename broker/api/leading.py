"""What a standby broker answers: `/healthz` and `/readyz` say its role; everything else is NotLeader (503).

The gate sits outside every other layer (REST, dashboard, ports, E2B, MCP), so a standby serves nothing but its
role: a client that reaches it is told to try again elsewhere, with the leader's URL when it is known
(broker.store.leadership keeps it), and `Retry-After: 0` (another broker may answer now). A websocket is closed
with 1013 (try again later) before it is accepted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.errors import NotLeader
from broker.fencing import Term

OPEN_PATHS = frozenset({"/healthz", "/readyz"})


@dataclass
class Leadership:
    """This broker's role as the API shows it; `leading` turns true once it dispatches."""

    term: Term = field(default_factory=Term)
    leading: bool = True
    leader: Callable[[], tuple[str | None, int]] = lambda: (None, 0)
    """The leader as a standby last read it: (its URL or None, its term)."""

    @property
    def role(self) -> str:
        return "leader" if self.leading else "standby"

    @property
    def current_term(self) -> int:
        """This broker's term while it leads; the newest term it knows of while it stands by."""
        return self.term.value if self.leading else max(self.term.value, self.leader()[1])

    def refusal(self) -> NotLeader:
        url, term = self.leader()
        where = f"the leader is {url}" if url else "no broker leads at this moment"
        return NotLeader(f"this broker is a standby: {where}", {"leader": url, "term": term})


class LeaderGate:
    """ASGI middleware: a standby refuses every request but its role's."""

    def __init__(self, app: Any, leadership: Leadership) -> None:
        self.app = app
        self.leadership = leadership

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.leadership.leading or scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        refusal = self.leadership.refusal()
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1013, "reason": refusal.message[:120]})
            return
        body = json.dumps(refusal.to_wire()).encode()
        await send({"type": "http.response.start", "status": refusal.status,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after", b"0"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
