"""E2B sandboxes as Firepool sessions: the registry the control plane and the data plane share.

A sandbox is a session of its caller (`lease_tag` = the sandbox id, queue `default`) held by one gateway
kernel job (broker.gateway.kernels): create starts the kernel (a warm pod of the template's pool claimed),
kill and the timeout end the session (the pod is reset and wiped). The per-sandbox access tokens are kept
as SHA-256 digests next to the plain one this broker handed out (a restarted broker mints a new one at the
next connect; the digests of the old ones ride in the kernel job's env, so clients keep working).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from broker.gateway.kernels import GatewayKernel

log = logging.getLogger("firepool.e2b")

ID_PREFIX = "e2b-"
META_ENV = "KERNEL_E2B_SANDBOX"
"""The sandbox's own record in its kernel job's env (id, template, times, metadata, token digests)."""
DEFAULT_TIMEOUT_S = 300
MAX_TIMEOUT_S = 24 * 3600
SWEEP_EVERY_S = 0.5


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_id() -> str:
    return ID_PREFIX + secrets.token_hex(8)


@dataclass
class Sandbox:
    id: str
    caller: str
    template: str
    metadata: dict[str, str]
    envs: dict[str, str]
    started_at: float
    end_at: float
    kernel: GatewayKernel | None = None
    token: str | None = None
    """The plain envd access token this broker handed out (None after a restart until the next connect)."""
    token_digests: set[str] = field(default_factory=set)
    traffic_token: str | None = None
    traffic_digests: set[str] = field(default_factory=set)
    ended: bool = False
    extras: dict[str, Any] = field(default_factory=dict)
    """Per-sandbox state of the data plane (its processes, its kernel sockets)."""

    @property
    def alive(self) -> bool:
        return not self.ended and (self.kernel is None or not self.kernel.ended)

    def mint_tokens(self) -> None:
        self.token = secrets.token_urlsafe(24)
        self.token_digests.add(digest(self.token))
        self.traffic_token = secrets.token_urlsafe(24)
        self.traffic_digests.add(digest(self.traffic_token))

    def accepts(self, token: str | None, traffic: bool = False) -> bool:
        """Whether a presented token is one of this sandbox's (constant time per digest, every digest tried)."""
        if not token:
            return False
        presented = digest(token).encode()
        ok = False
        for d in self.traffic_digests if traffic else self.token_digests:
            ok |= hmac.compare_digest(d.encode(), presented)
        return ok

    def record(self) -> str:
        """What the kernel job's env carries so a restarted broker can rebuild this sandbox."""
        return json.dumps({"id": self.id, "template": self.template, "started_at": self.started_at,
                           "end_at": self.end_at, "metadata": self.metadata,
                           "tokens": sorted(self.token_digests), "traffic": sorted(self.traffic_digests)},
                          separators=(",", ":"))

    @classmethod
    def from_record(cls, caller: str, text: str, envs: dict[str, str]) -> Sandbox | None:
        try:
            data = json.loads(text)
            return cls(id=str(data["id"]), caller=caller, template=str(data["template"]),
                       metadata={str(k): str(v) for k, v in dict(data.get("metadata") or {}).items()},
                       envs=envs, started_at=float(data["started_at"]), end_at=float(data["end_at"]),
                       token_digests=set(data.get("tokens") or ()), traffic_digests=set(data.get("traffic") or ()))
        except (ValueError, KeyError, TypeError):
            return None


class Registry:
    """The live sandboxes by id; a sweeper ends each one when its `end_at` passes."""

    def __init__(self, end: Callable[[Sandbox], Awaitable[None]], now: Callable[[], float] = time.time) -> None:
        self._by_id: dict[str, Sandbox] = {}
        self._end = end
        self.now = now
        self._sweeper: asyncio.Task[None] | None = None

    def add(self, sbx: Sandbox) -> None:
        self._by_id[sbx.id] = sbx
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())

    def get(self, sandbox_id: str) -> Sandbox | None:
        sbx = self._by_id.get(sandbox_id)
        if sbx is not None and not sbx.alive:
            self._by_id.pop(sandbox_id, None)
            self._schedule_end(sbx)
            return None
        return sbx

    def owned(self, caller: str, sandbox_id: str) -> Sandbox | None:
        """The caller's live sandbox; None for an unknown id and another caller's alike."""
        sbx = self.get(sandbox_id)
        return sbx if sbx is not None and sbx.caller == caller else None

    def of(self, caller: str) -> list[Sandbox]:
        return [s for s in list(self._by_id.values()) if s.caller == caller and self.get(s.id) is not None]

    def signed_by(self, signature: str, path: str, operation: str, user: str, expiry: str | None) -> Sandbox | None:
        """The live sandbox whose plain access token made `signature` (E2B's v1 file URL signature), else None.
        Every sandbox that has one is tried (no early exit), each compared in constant time."""
        found = None
        for sbx in list(self._by_id.values()):
            if sbx.token is None or not sbx.alive:
                continue
            raw = f"{path}:{operation}:{user}:{sbx.token}" + (f":{expiry}" if expiry is not None else "")
            mine = "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode("ascii")
            if hmac.compare_digest(mine.encode(), signature.encode("utf-8", "replace")):
                found = sbx
        return found

    def forget(self, sbx: Sandbox) -> None:
        self._by_id.pop(sbx.id, None)
        sbx.ended = True

    def _schedule_end(self, sbx: Sandbox) -> None:
        """A sandbox whose kernel went away by itself: its session still ends (the pod wiped)."""
        if sbx.extras.get("ending"):
            return
        sbx.extras["ending"] = True
        asyncio.get_running_loop().create_task(self._end_quietly(sbx))

    async def _end_quietly(self, sbx: Sandbox) -> None:
        try:
            await self._end(sbx)
        except Exception:  # noqa: BLE001 - logged; the sweeper must live on
            log.exception("ending e2b sandbox %s", sbx.id)

    async def sweep(self) -> list[str]:
        """End every sandbox whose timeout passed (or whose kernel ended); their ids."""
        now = self.now()
        due = [s for s in list(self._by_id.values()) if s.end_at <= now or not s.alive]
        for sbx in due:
            self._by_id.pop(sbx.id, None)
            log.info("e2b sandbox %s of %s: %s", sbx.id, sbx.caller,
                     "its timeout passed" if sbx.alive else "its kernel ended")
            sbx.extras["ending"] = True
            await self._end_quietly(sbx)
        return [s.id for s in due]

    async def _sweep_loop(self) -> None:
        while self._by_id:
            await asyncio.sleep(SWEEP_EVERY_S)
            await self.sweep()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
