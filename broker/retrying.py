"""When the SDK tries a request again, and how long it waits first.

A request is retried when the broker says so (an error body with `retryable: true`, or a 503) or the
connection failed, with exponential backoff and jitter and a bounded number of attempts. A request
that may have reached the broker is retried only when repeating it cannot do anything twice:

- reads (GET, HEAD) and PUT/DELETE, which are idempotent by HTTP's rules and the broker's API;
- `POST /v1/jobs` only with an `idempotency_key` (the SDK sends one with every submit, so a retried
  submit returns the job the first attempt created instead of creating a second);
- `POST /v1/jobs/{id}/cancel` (cancelling twice is cancelling once).

Anything else (e.g. `POST .../signal`) is retried only when the connection was never made, so the
broker provably never saw it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout)
"""Transport errors raised before a byte of the request reached the broker."""


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` in all (1 = no retry); the n-th wait is about `base * 2**n` seconds, at most `cap`."""

    attempts: int = 4
    base: float = 0.25
    cap: float = 8.0
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds before retry number `retry` (0-based): half fixed, half random ("equal jitter"),
        so many clients that failed together do not come back together; a Retry-After wins if longer."""
        ceiling = min(self.cap, self.base * (2.0 ** retry))
        wait = ceiling / 2 + self.rng.uniform(0, ceiling / 2)
        if retry_after is not None:
            wait = max(wait, min(self.cap, retry_after))
        return wait


NO_RETRY = RetryPolicy(attempts=1)


def safe_to_repeat(request: httpx.Request) -> bool:
    """Whether sending `request` twice has the effect of sending it once."""
    method = request.method.upper()
    if method in IDEMPOTENT_METHODS:
        return True
    path = request.url.path
    if method == "POST" and path.rstrip("/").endswith("/cancel"):
        return True
    if method == "POST" and path.rstrip("/") == "/v1/jobs":
        try:
            body = json.loads(request.content or b"{}")
        except ValueError:
            return False
        return isinstance(body, dict) and bool(body.get("idempotency_key"))
    return False


def retryable_response(response: httpx.Response) -> bool:
    """The broker said try again: a 503, or an error body with `retryable: true`."""
    if response.status_code < 400:
        return False
    if response.status_code == 503:
        return True
    try:
        return bool(response.json()["error"]["retryable"])
    except (ValueError, KeyError, TypeError):
        return False


def retry_after(response: httpx.Response) -> float | None:
    """The Retry-After header in seconds, when it is a number."""
    value = response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def should_retry_error(exc: httpx.TransportError, request: httpx.Request) -> bool:
    return isinstance(exc, NEVER_SENT) or safe_to_repeat(request)


def should_retry_response(response: httpx.Response) -> bool:
    return retryable_response(response) and safe_to_repeat(response.request)


Sleep = Callable[[float], None]
