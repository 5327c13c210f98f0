"""The wire between the MCP server and a live kernel: what one request produced, how a kernel ended or
started, the kernel job's connection line, and closing a kernel client."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.client import AsyncClient, JobInfo

if TYPE_CHECKING:
    from jupyter_client.asynchronous.client import AsyncKernelClient

MAX_STREAM_CHARS = 1 << 20
"""Stream output kept per request (its tail)."""


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
class Execution:
    """What one execute request produced, in order."""

    stdout: str = ""
    stderr: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """display_data / execute_result bundles: {"kind", "data", "metadata"}."""
    error: dict[str, Any] | None = None
    status: str = "ok"
    execution_count: int | None = None
    user_expressions: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False
    interrupted: bool = False
    duration_s: float = 0.0
    reached: bool = False
    """The kernel announced the request (busy): the code may have run."""

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


def absorb(ex: Execution, msg: dict[str, Any]) -> bool:
    """Fold one iopub message into `ex`; True at the request's idle status."""
    kind = msg.get("msg_type") or msg.get("header", {}).get("msg_type")
    content = msg.get("content", {})
    ex.reached = True
    if kind == "stream":
        text = content.get("text", "")
        if content.get("name") == "stderr":
            ex.stderr = (ex.stderr + text)[-MAX_STREAM_CHARS:]
        else:
            ex.stdout = (ex.stdout + text)[-MAX_STREAM_CHARS:]
    elif kind in ("display_data", "execute_result"):
        ex.outputs.append({"kind": kind, "data": content.get("data", {}), "metadata": content.get("metadata", {})})
    elif kind == "error":
        ex.error = {k: content.get(k) for k in ("ename", "evalue", "traceback")}
    elif kind == "clear_output":
        ex.outputs.clear()
    elif kind == "status" and content.get("execution_state") == "idle":
        return True
    return False


async def read_connection(client: AsyncClient, job_id: str) -> Any:
    """The kernel job's connection line (the Jupyter provisioner's reader), or KernelStartFailed."""
    from jupyter_ext.provisioner import KernelStartError
    from jupyter_ext.provisioner import read_connection as follow

    try:
        return await follow(client, job_id)
    except KernelStartError as exc:
        raise KernelStartFailed(str(exc)) from exc


def close_client(kc: AsyncKernelClient) -> None:
    with contextlib.suppress(Exception):
        kc.stop_channels()
        kc.context.destroy(linger=0)  # the client's own context: no socket left for the garbage collector


async def cancel_quietly(client: AsyncClient, job_id: str) -> None:
    try:
        await client.cancel(job_id)
    except Exception:  # noqa: BLE001 - best effort: the job may have ended, the broker may be gone
        pass
