"""Creating and ending E2B sandboxes: a sandbox's session is claimed through the gateway's kernel start and
ended like any session (`ControlPlane.end_session`: its jobs cancelled, its pod reset and wiped)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from broker.api.e2b.http import HttpError
from broker.api.e2b.sandboxes import META_ENV, Registry, Sandbox, new_id
from broker.errors import FirepoolError, TooManyKernels
from broker.gateway.kernels import RECYCLE_ENV, SESSION_ENV, SPEC_PREFIX, GatewayKernels
from broker.jobs import Job, JobState
from broker.pods import Pod

log = logging.getLogger("firepool.e2b")

MAX_RECORD_CHARS = 4096
"""The sandbox's record rides in one kernel env value (the gateway's cap)."""

Closer = Callable[[Sandbox], Awaitable[None]]


class Book(Protocol):
    async def wait_change(self, job_id: str, timeout: float) -> None: ...


class Tracker(Protocol):
    def pods_of(self, job_id: str) -> tuple[Pod, ...]: ...

    def retire_at_release(self, name: str) -> bool: ...


class Controller(Protocol):
    def wake(self) -> None: ...


class Sessions(Protocol):
    book: Book
    tracker: Tracker
    controller: Controller

    async def end_session(self, caller: str, tag: str, queue: str = "default") -> dict[str, Any]: ...

    async def get(self, caller: str, job_id: str) -> Job: ...


class Service:
    def __init__(self, sessions: Sessions, kernels: GatewayKernels, pools: Callable[[], Any],
                 now: Callable[[], float] = time.time) -> None:
        self.sessions = sessions
        self.kernels = kernels
        self.pools = pools
        self.now = now
        self.registry = Registry(self.end, now)
        self.closers: list[Closer] = []
        """What the data plane releases when a sandbox ends (its processes, its kernel sockets)."""
        self._adopted = False

    def pool(self, template: str) -> Any:
        pools = self.pools()
        if template not in pools:
            raise HttpError(400, f"unknown template {template[:80]!r}: a template is a Firepool pool "
                                 f"(pools: {', '.join(sorted(pools))})")
        return pools[template]

    async def create(self, caller: str, template: str, timeout_s: float, metadata: dict[str, str],
                     envs: dict[str, str]) -> Sandbox:
        self.pool(template)
        await self.adopt()
        now = self.now()
        sbx = Sandbox(id=new_id(), caller=caller, template=template, metadata=metadata, envs=envs, started_at=now,
                      end_at=now + timeout_s)
        sbx.mint_tokens()
        record = sbx.record()
        if len(record) > MAX_RECORD_CHARS:
            raise HttpError(400, f"metadata too large: a sandbox's metadata takes at most about "
                                 f"{MAX_RECORD_CHARS - 400} characters of JSON")
        env = {SESSION_ENV: sbx.id, RECYCLE_ENV: "0", META_ENV: record}
        try:
            sbx.kernel = await self.kernels.start(caller, SPEC_PREFIX + template, env,
                                                  ready=lambda job: self.running(caller, job))
        except TooManyKernels as exc:
            raise HttpError(429, f"{exc.message} (each E2B sandbox holds one gateway kernel)",
                            {"Should-Retry": "false"}) from None
        except FirepoolError as exc:
            raise HttpError(exc.status if exc.status < 500 else 503, exc.message,
                            {"Should-Retry": "false"}) from None
        sbx.kernel.held = True
        self.registry.add(sbx)
        log.info("e2b sandbox %s of %s: created on pool %s (kernel job %s)", sbx.id, caller, template,
                 sbx.kernel.job_id)
        return sbx

    async def running(self, caller: str, job: Job) -> None:
        """Until the holding job runs (its pod claimed, its process launched): commands and files work from
        then on; the kernel's connection is awaited by the code interpreter's first call instead."""
        deadline = self.now() + self.kernels.settings.start_timeout_s
        while job.state is not JobState.RUNNING:
            if job.terminal:
                raise HttpError(503, f"the sandbox's job {job.id} ended before it ran ({job.state.value}: "
                                     f"{job.error_message or 'no message'})", {"Should-Retry": "false"})
            left = deadline - self.now()
            if left <= 0:
                raise HttpError(503, f"no sandbox of this template came up within "
                                     f"{self.kernels.settings.start_timeout_s:.0f} s", {"Should-Retry": "false"})
            await self.sessions.book.wait_change(job.id, min(left, 1.0))
            job = await self.sessions.get(caller, job.id)
        # The pod is never reused after the sandbox (kill ends the session): marked so now, the pool starts
        # its replacement while the sandbox lives, and the next sandbox finds a warm pod.
        for pod in self.sessions.tracker.pods_of(job.id):
            self.sessions.tracker.retire_at_release(pod.name)
        self.sessions.controller.wake()

    async def end(self, sbx: Sandbox) -> None:
        """End the sandbox now: the data plane lets go, its kernel stops, its session ends (pod wiped)."""
        self.registry.forget(sbx)
        for close in self.closers:
            with contextlib.suppress(Exception):
                await close(sbx)
        k = sbx.kernel
        if k is not None and not k.ended:
            with contextlib.suppress(FirepoolError):
                await self.kernels.shutdown(k.caller, k.id)
        with contextlib.suppress(FirepoolError):
            await self.sessions.end_session(sbx.caller, sbx.id, "default")
        log.info("e2b sandbox %s of %s: ended", sbx.id, sbx.caller)

    async def adopt(self) -> None:
        """Once per broker: the sandboxes whose kernels outlived the last broker, rebuilt from their record."""
        if self._adopted:
            return
        self._adopted = True
        await self.kernels.adopt()
        for k in self.kernels.live():
            text = k.env.get(META_ENV)
            if not text or self.registry.get(k.tag) is not None:
                continue
            sbx = Sandbox.from_record(k.caller, text, {})
            if sbx is None or sbx.id != k.tag:
                continue
            sbx.kernel = k
            k.held = True
            self.registry.add(sbx)
            log.info("e2b sandbox %s of %s: adopted with its kernel %s", sbx.id, sbx.caller, k.id)

    def set_end(self, sbx: Sandbox, end_at: float) -> None:
        sbx.end_at = end_at
