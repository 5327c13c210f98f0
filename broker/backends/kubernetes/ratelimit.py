"""Client-side pacing of pod creates: a token bucket (QPS, burst) and backoff on 429 and 5xx.

A burst of scale-ups must not flood the API server; a 429 or 5xx is retried after a growing pause
(the server's Retry-After when it gives one), a bounded number of times, then surfaced.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from broker.clock import Clock

T = TypeVar("T")


@dataclass(frozen=True)
class RateSettings:
    qps: float = 20.0
    """Creates per second, sustained."""
    burst: int = 40
    """Creates allowed at once after a quiet spell."""
    retries: int = 5
    """Retries of one call answered 429 or 5xx."""
    backoff_s: float = 0.2
    """The first pause; doubled each retry up to `backoff_max_s`."""
    backoff_max_s: float = 5.0


class Retryable(Exception):
    """An API answer worth retrying (429, 5xx); `after_s` is the server's Retry-After, if any."""

    def __init__(self, status: int, message: str, after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.after_s = after_s


class TokenBucket:
    """`take()` waits (on the injected clock) until a token is free; no lock: one event loop."""

    def __init__(self, clock: Clock, qps: float, burst: int) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"qps must be > 0 and burst >= 1, got {qps}, {burst}")
        self.clock = clock
        self.qps = qps
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = clock.now()

    def retune(self, qps: float, burst: int) -> None:
        """New pacing (a reloaded catalog): tokens earned so far count at the old rate, the rest at the new
        one; a smaller burst caps what is saved up at once."""
        if qps <= 0 or burst < 1:
            raise ValueError(f"qps must be > 0 and burst >= 1, got {qps}, {burst}")
        self._refill()
        self.qps = qps
        self.burst = float(burst)
        self.tokens = min(self.tokens, self.burst)

    def _refill(self) -> None:
        now = self.clock.now()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.qps)
        self.stamp = now

    def wait_s(self) -> float:
        """Seconds until a token is free (0 when one is)."""
        self._refill()
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.qps

    async def take(self) -> None:
        while (pause := self.wait_s()) > 0:
            await self.clock.sleep(pause)
        self.tokens -= 1.0


async def with_backoff(clock: Clock, settings: RateSettings, call: Callable[[], Awaitable[T]]) -> T:
    """Run `call`; on Retryable pause and retry up to `settings.retries` times, then re-raise."""
    pause = settings.backoff_s
    for attempt in range(settings.retries + 1):
        try:
            return await call()
        except Retryable as exc:
            if attempt == settings.retries:
                raise
            await clock.sleep(exc.after_s if exc.after_s is not None else pause)
            pause = min(pause * 2, settings.backoff_max_s)
    raise AssertionError("unreachable")

