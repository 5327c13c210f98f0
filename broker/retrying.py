"""When the SDK tries a request again, and how long it waits first.

A request is retried when the broker says so (an error body with `retryable: true`, or a 503) or the
connection failed, with exponential backoff and jitter and a bounded number of attempts. A request
that may have reached the broker is retried only when repeating it cannot do anything twice:

- reads (GET, HEAD) and PUT/DELETE, which are idempotent by HTTP's rules and the broker's API;
- `POST /v1/jobs` only with an `idempotency_key` (the SDK sends one with every submit, so a retried
  submit returns the job the first attempt created instead of creating a second);
- `POST /v1/jobs:batch` only when every job in it has an `idempotency_key` (`submit_many` gives each one);
- `POST /v1/jobs:watch`, a read (it waits for jobs to end and changes nothing);
- `POST /v1/jobs/{id}/cancel` (cancelling twice is cancelling once).

Anything else (e.g. `POST .../signal`) is retried only when the broker provably never acted on it: the
connection was never made, or a standby answered NotLeader (a standby does nothing but say so).

With several brokers (`broker.locations.Brokers`) a request that gets no answer or a NotLeader moves on at
once to the leader named or the next URL, while some URL is untried in this round; once every URL was
tried it backs off as above. The policy's `attempts` bounds the rounds (with one URL: the attempts).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from broker.locations import Brokers

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
    path = request.url.path.rstrip("/")
    if method == "POST" and (path.endswith("/cancel") or path == "/v1/jobs:watch"):
        return True
    if method == "POST" and path in ("/v1/jobs", "/v1/jobs:batch"):
        try:
            body = json.loads(request.content or b"{}")
        except ValueError:
            return False
        if path == "/v1/jobs":
            return isinstance(body, dict) and bool(body.get("idempotency_key"))
        jobs = body.get("jobs") if isinstance(body, dict) else None
        return isinstance(jobs, list) and all(isinstance(j, dict) and j.get("idempotency_key") for j in jobs)
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


def not_leader(response: httpx.Response) -> tuple[bool, object]:
    """Whether a standby answered (503 NotLeader), and the leader URL it named (None while none leads)."""
    if response.status_code != 503:
        return False, None
    try:
        error = response.json()["error"]
        if error.get("class") != "NotLeader":
            return False, None
        return True, (error.get("details") or {}).get("leader")
    except (ValueError, KeyError, TypeError, AttributeError):
        return False, None


class Tries:
    """One request's tries across the brokers, the same for the sync and the async client: each answer or
    failure says how long to wait before the next try (0: at once, on another broker), or None: stop."""

    def __init__(self, brokers: Brokers, policy: RetryPolicy) -> None:
        self.policy = policy
        self.round = brokers.round()
        self.backoffs = 0

    @property
    def url(self) -> str:
        """Where to send the next try."""
        return self.round.url

    def after_error(self, exc: httpx.TransportError, request: httpx.Request) -> float | None:
        """No answer: None to give up (raise), else the wait before the next try."""
        if not should_retry_error(exc, request):
            return None
        return 0.0 if self.round.move_on() else self._back_off()

    def after_response(self, response: httpx.Response) -> float | None:
        """An answer: None when it is the one to return, else the wait before the next try."""
        standby, leader = not_leader(response)
        if standby:
            return 0.0 if self.round.move_on(leader) else self._back_off(retry_after(response))
        self.round.answered()
        if not should_retry_response(response):
            return None
        return self._back_off(retry_after(response))

    def _back_off(self, retry_after: float | None = None) -> float | None:
        if self.backoffs >= self.policy.attempts - 1:
            return None
        wait = self.policy.delay(self.backoffs, retry_after)
        self.backoffs += 1
        self.round.again()
        return wait


Sleep = Callable[[float], None]
