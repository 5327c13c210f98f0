"""What the SDK's clients share: the job record, the typed errors off the wire, the request bodies."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from broker.errors import FirepoolError, StreamBroken, Unavailable, all_error_classes
from broker.locations import Discovery
from broker.retrying import NO_RETRY

_ERRORS = all_error_classes()
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


@dataclass(frozen=True)
class JobInfo:
    """A job as the broker reported it; `raw` has every field."""

    id: str
    state: str
    caller: str
    pool: str
    exit_code: int | None
    error_class: str | None
    acquisition: list[dict[str, Any]]
    timings: dict[str, float]
    attempts: list[dict[str, Any]]
    raw: dict[str, Any] = field(repr=False)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def path(self) -> str | None:
        """Rank 0's acquisition path (warm, recycled, standby, new, custom_image)."""
        return self.acquisition[0]["path"] if self.acquisition else None

    @property
    def start_latency(self) -> float | None:
        """Submit -> first instruction, seconds."""
        t = self.timings
        if "first_instruction_at" in t and "submitted_at" in t:
            return t["first_instruction_at"] - t["submitted_at"]
        return None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobInfo:
        return cls(id=data["id"], state=data["state"], caller=data.get("caller", ""), pool=data.get("pool", ""),
                   exit_code=data.get("exit_code"), error_class=data.get("error_class"),
                   acquisition=data.get("acquisition", []), timings=data.get("timings", {}),
                   attempts=data.get("attempts", []), raw=data)


def unreachable(found: Discovery, exc: httpx.TransportError) -> Unavailable:
    """The broker did not answer: say where we looked and, when we guessed, what to do."""
    why = str(exc) or type(exc).__name__
    hint = f"; {found.hint}" if found.hint else ""
    where = f"the broker at {found.url}" if len(found.urls) < 2 else f"any of the brokers {', '.join(found.urls)}"
    return Unavailable(f"cannot reach {where} ({why}){hint}", {"url": found.url})


def stream_broken(response: httpx.Response, exc: httpx.TransportError) -> StreamBroken:
    """A streamed answer broke off: not resumed (the job and its log are durable: ask again)."""
    why = str(exc) or type(exc).__name__
    return StreamBroken(f"the stream from {response.request.url} broke off ({why}); it is not resumed: "
                        f"ask again (the job and its log are kept)", {"url": str(response.request.url)})


def raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()["error"]
        cls = _ERRORS.get(body.get("class", ""), FirepoolError)
        err = cls(body.get("message", response.text), body.get("details") or {})
    except (ValueError, KeyError, TypeError):
        err = FirepoolError(f"HTTP {response.status_code}: {response.text[:200]}")
    err.status = response.status_code
    raise err


KERNEL_POLL_S = 60.0
"""The longest one `GET /v1/jobs/{id}/kernel?wait_s=` waits; `kernel` asks again until its timeout."""


KERNEL_RETRY = NO_RETRY
"""A kernel poll is not retried by the request layer: its KernelNotReady (retryable) came after a `wait_s`
long-poll, and `kernel` asks again itself within its own timeout."""


def kernel_wait(deadline: float | None) -> float:
    return KERNEL_POLL_S if deadline is None else max(0.0, min(KERNEL_POLL_S, deadline - time.monotonic()))


RUN_WAIT = {"wait_s": 60.0}
"""`run` submits and waits in one request; a job still running after it is waited for with GET, as `wait` does.
A broker that predates `wait_s` on POST ignores it and answers at once: `run` then waits with GET."""


def job_body(command: Sequence[str], pool: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The submit request; it always carries an idempotency key, so a retried submit cannot duplicate."""
    body: dict[str, Any] = {"pool": pool, "command": list(command)}
    body.update({k: v for k, v in fields.items() if v is not None})
    body.setdefault("idempotency_key", f"sdk-{uuid.uuid4().hex}")
    return body


def port_url(base: str, tag: str, port: int) -> str:
    """The path form of a session port: `{base}/v1/sessions/{tag}/ports/{port}/` (docs/ports.md)."""
    return f"{base.rstrip('/')}/v1/sessions/{quote(tag, safe='')}/ports/{int(port)}/"
