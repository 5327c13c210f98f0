"""Faults a test injects into the emulator's API: error answers, answers lost after the write, silent holds.

`fail_next` answers the next requests of a verb on a resource with an error Status (429 with Retry-After,
500, 409, 410 ...); `lose_next` does the work, then cuts the connection before the answer (the client
cannot know its write happened); `stall_next` holds a request open without a byte of answer, as a NAT or
load balancer that dropped the connection silently. Thread-safe: tests call these from their own thread.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from k8s_emulator.objects import ApiError

VERBS = ("create", "get", "list", "watch", "update", "patch", "delete", "deletecollection", "evict")
REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 410: "Expired",
           422: "Invalid", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


@dataclass
class _Fault:
    verb: str
    resource: str
    status: int
    times: int
    retry_after_s: int


@dataclass
class _Stall:
    verb: str
    resource: str
    seconds: float
    times: int

    async def hold(self, request: web.Request) -> None:
        """Say nothing for `seconds`, the connection open (a NAT or load balancer that dropped it silently);
        ends early once the client hangs up, as its read timeout makes it."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self.seconds
        while loop.time() < until and request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.02)


class Faults:
    """Errors to answer to the next requests of a verb on a resource (thread-safe, test-facing)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[_Fault] = []
        self._stalls: list[_Stall] = []
        self._losses: list[list[Any]] = []
        self.stalled = 0
        """Requests held silent so far."""

    def stall_next(self, verb: str, resource: str, seconds: float = 3600.0, times: int = 1) -> None:
        """Hold the next `times` requests of `verb` on `resource` ("*": any) open without a byte of answer."""
        if verb not in VERBS:
            raise ValueError(f"verb must be one of {VERBS}, got {verb!r}")
        with self._lock:
            self._stalls.append(_Stall(verb, resource, seconds, times))

    def lose_next(self, verb: str, resource: str, times: int = 1) -> None:
        """Carry out the next `times` requests of `verb` on `resource`, then cut the connection before the
        answer: the client cannot know the write happened (its retry meets its own object)."""
        if verb not in VERBS:
            raise ValueError(f"verb must be one of {VERBS}, got {verb!r}")
        with self._lock:
            self._losses.append([verb, resource, times])

    def take_loss(self, verb: str, resource: str) -> bool:
        with self._lock:
            for loss in self._losses:
                if loss[0] == verb and loss[1] in (resource, "*"):
                    loss[2] -= 1
                    if loss[2] <= 0:
                        self._losses.remove(loss)
                    return True
        return False

    def take_stall(self, verb: str, resource: str) -> _Stall | None:
        with self._lock:
            for stall in self._stalls:
                if stall.verb == verb and stall.resource in (resource, "*"):
                    stall.times -= 1
                    if stall.times <= 0:
                        self._stalls.remove(stall)
                    self.stalled += 1
                    return stall
        return None

    def fail_next(self, verb: str, resource: str, status: int, times: int = 1, retry_after_s: int = 1) -> None:
        if verb not in VERBS:
            raise ValueError(f"verb must be one of {VERBS}, got {verb!r}")
        if status not in REASONS:
            raise ValueError(f"status must be one of {sorted(REASONS)}, got {status}")
        with self._lock:
            self._pending.append(_Fault(verb, resource, status, times, retry_after_s))

    def take(self, verb: str, resource: str) -> ApiError | None:
        """The error to answer this request with, if one is pending (each answer uses up one time)."""
        with self._lock:
            for fault in self._pending:
                if fault.verb == verb and fault.resource in (resource, "*"):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._pending.remove(fault)
                    retry = fault.retry_after_s if fault.status == 429 else None
                    return ApiError(fault.status, REASONS[fault.status],
                                    f"injected {fault.status} for {verb} {resource}", retry_after_s=retry)
        return None
