"""What the MCP server keeps of a live kernel's requests: what one request produced, how a kernel ended or
started, and cancelling a kernel job."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from broker import kernel_client
from broker.client_core import JobInfo
from broker.sdk_protocols import AsyncCalls


class KernelStartFailed(Exception):
    """The kernel job ended, or never became reachable, before the kernel could run code."""


class KernelGone(Exception):
    """The kernel was ended (idle, background job, session end) before this request reached it."""


class KernelDied(Exception):
    """The kernel job ended while a request was in flight."""

    def __init__(self, job: JobInfo) -> None:
        super().__init__(f"the kernel ({job.id}) ended: {job.state}"
                         + (f" ({job.error_class})" if job.error_class else ""))
        self.job = job


@dataclass
class Execution(kernel_client.Execution):
    """What one execute request produced (the SDK's record), and how the MCP server ended it."""

    timed_out: bool = False
    interrupted: bool = False
    duration_s: float = 0.0

    def expression(self, name: str) -> Any:
        """A user expression's value, when a helper returned JSON through its repr."""
        entry = self.user_expressions.get(name) or {}
        if entry.get("status") != "ok":
            raise RuntimeError(f"helper call failed: {entry.get('ename')}: {entry.get('evalue')}")
        return json.loads(entry["data"]["text/plain"])


@dataclass
class Ended:
    """A kernel the server ended, and what it saved: reported by the session's next call."""

    reason: str
    idle_s: float
    kept: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    blob: str | None = None
    save_error: str | None = None


@dataclass
class Started:
    """How the kernel a call runs on came to be (reported by that call)."""

    restarted: bool
    reason: str | None
    restored: list[str]
    lost: list[str]


async def cancel_quietly(client: AsyncCalls, job_id: str) -> None:
    try:
        await client.cancel(job_id)
    except Exception:  # noqa: BLE001 - best effort: the job may have ended, the broker may be gone
        pass
