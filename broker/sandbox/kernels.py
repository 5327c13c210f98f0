"""A live ipykernel per MCP session: a kernel of the broker's Jupyter gateway in the session's sandbox,
driven with the SDK's kernel client (`broker.kernel_client`: HTTP and one websocket to the broker).

The gateway runs it as a kernel job (`kernel: true`) in the session (`KERNEL_FIREPOOL_SESSION`), the MCP
server's queue (`KERNEL_FIREPOOL_QUEUE`) and without recycling another conversation's sandbox
(`KERNEL_FIREPOOL_RECYCLE=0`); the MCP server never sees the kernel's ports or keys, so it needs no route
to the pods. The kernel job's id (reported by the kernel itself) is what calls name and what the server
asks the broker about when the kernel goes quiet. While it lives it holds the session's pod, so the other tools' commands run as subprocesses of the kernel (`run_argv`) in the same
workspace. An idle kernel ends by the rules in `broker.sandbox.idle`, after saving its namespace; the next
call starts a new kernel, restores what was saved and says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from broker.client_core import JobInfo
from broker.errors import FirepoolError
from broker.kernel_client import AsyncKernel, KernelDisconnected, KernelTimeout
from broker.sandbox import idle, kernel_code
from broker.sandbox.kernel_io import (
    Ended,
    Execution,
    KernelDied,
    KernelGone,
    KernelStartFailed,
    Started,
    cancel_quietly,
)
from broker.sdk_protocols import AsyncCalls

log = logging.getLogger(__name__)

Progress = Callable[[float, float | None, str], Awaitable[None]]
OnStream = Callable[[str, str], None]
"""Called with ("stdout" | "stderr", text) as a cell prints."""


class KernelCalls(Protocol):
    """What starting a kernel needs of the session's calls (broker.sandbox.calls.Calls is one): the calls route
    code through a live kernel of this module, so this module names only this face of them."""

    @property
    def client(self) -> AsyncCalls: ...
    @property
    def queue(self) -> str: ...

    async def pool_name(self) -> str:
        """The pool the session's jobs run in (chosen on first use)."""
        ...

START_TIMEOUT_S = 120.0
"""Start request -> the gateway's answer; a kernel job queued behind a busy pod counts too."""
REACH_TIMEOUT_S = 30.0
"""The gateway's answer -> kernel_info answered over the websocket."""
JOB_ID = "__import__('os').environ.get('FIREPOOL_JOB_ID', '')"
"""Asked of the kernel once started: the kernel job it runs in."""
DRAIN_S = 10.0
"""After an interrupt, how long the interrupted request may take to end before the kernel is stopped."""
SAVE_TIMEOUT_S = 60.0
PROGRESS_EVERY_S = 2.0
ALIVE_CHECK_S = 1.0
"""Silence on the kernel's channels after which the server asks the broker whether the kernel job lives."""


@dataclass
class LiveKernel:
    caller: str
    session: str
    pool: str
    client: AsyncCalls
    job: JobInfo
    kernel: AsyncKernel
    last_used: float
    busy: int = 0
    dead: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    started: Started | None = None
    """Set at start, handed to the first call that runs on this kernel."""


class Kernels:
    """The live kernels of one MCP server, by (caller, session)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 min_idle_at_ceiling: float = idle.MIN_IDLE_AT_CEILING_S,
                 watchdog_margin: float = idle.WATCHDOG_MARGIN_S) -> None:
        self.clock = clock
        self.min_idle_at_ceiling = min_idle_at_ceiling
        self.watchdog_margin = watchdog_margin
        self._live: dict[tuple[str, str], LiveKernel] = {}
        self._ended: dict[tuple[str, str], Ended] = {}
        self._starting: dict[tuple[str, str], asyncio.Lock] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def sessions(self) -> list[tuple[str, str]]:
        """(caller, session) of every live kernel (caller is "" over stdio: one caller per process)."""
        return [key for key, k in self._live.items() if not k.dead]

    def live(self, caller: str, session: str) -> LiveKernel | None:
        k = self._live.get((caller, session))
        return None if k is None or k.dead else k

    # ---------------------------------------------------------------- start

    async def ensure(self, calls: KernelCalls, caller: str, session: str) -> LiveKernel:
        key = (caller, session)
        lock = self._starting.setdefault(key, asyncio.Lock())
        async with lock:
            k = self.live(caller, session)
            if k is not None:
                return k
            self._live.pop(key, None)
            k = await self._start(calls, caller, session)
            self._live[key] = k
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())
        return k

    async def _start(self, calls: KernelCalls, caller: str, session: str) -> LiveKernel:
        pool = await calls.pool_name()
        pressure = await self._pressure(calls.client, pool)
        env = {"KERNEL_FIREPOOL_SESSION": session, "KERNEL_FIREPOOL_QUEUE": calls.queue,
               "KERNEL_FIREPOOL_RECYCLE": "0"}
        try:
            kernel = await asyncio.wait_for(
                AsyncKernel.start(calls.client, pool=pool, env=env, ready_timeout=REACH_TIMEOUT_S), START_TIMEOUT_S)
        except (KernelTimeout, KernelDisconnected) as exc:  # before TimeoutError: KernelTimeout is one
            raise KernelStartFailed(f"KernelUnreachable: the kernel started but did not answer over the broker's "
                                    f"websocket within {REACH_TIMEOUT_S:.0f} s ({exc})") from exc
        except TimeoutError as exc:
            raise KernelStartFailed(f"the session's kernel was not up within {START_TIMEOUT_S:.0f} s (queued "
                                    "behind another job of the session, or a slow start)") from exc
        try:
            probe = await kernel.execute("", silent=True, user_expressions={"j": JOB_ID}, timeout=REACH_TIMEOUT_S)
            job_id = str(probe.user_expressions["j"]["data"]["text/plain"]).strip("'\"")
            job = await calls.client.get(job_id)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._shutdown(calls.client, kernel, None)
            raise
        k = LiveKernel(caller=caller, session=session, pool=pool, client=calls.client, job=job, kernel=kernel,
                       last_used=self.clock())
        ended = self._ended.pop((caller, session), None)
        setup = kernel_code.setup_code("FIREPOOL_WORKSPACE", idle.watchdog_seconds(pressure, self.watchdog_margin))
        ex = await self.execute(k, setup + kernel_code.call("restore", ended.blob if ended else None),
                                silent=True, user_expressions={"r": kernel_code.LAST}, timeout_s=SAVE_TIMEOUT_S)
        if ex.error is not None:
            await self.stop(k)
            raise KernelStartFailed(f"the kernel's setup failed: {ex.error.get('ename')}: {ex.error.get('evalue')}")
        back = ex.expression("r")
        lost = sorted(set(back["lost"]) | (set(ended.lost) if ended else set()))
        if ended is not None:
            k.started = Started(True, ended.reason, back["restored"], lost)
        elif back["found"]:
            k.started = Started(True, "a saved namespace was found in the workspace", back["restored"], lost)
        else:
            k.started = Started(False, None, [], [])
        return k

    async def _pressure(self, client: AsyncCalls, pool: str) -> idle.Pressure:
        try:
            views = await client.pools()
        except FirepoolError:
            views = []
        view = next((v for v in views if v.get("name") == pool), {})
        return idle.pressure_of(view)

    # ---------------------------------------------------------------- requests

    async def execute(self, k: LiveKernel, code: str, *, silent: bool = False,
                      user_expressions: dict[str, str] | None = None, timeout_s: float,
                      progress: Progress | None = None, on_stream: OnStream | None = None) -> Execution:
        """Run one cell; a timeout or a cancelled call interrupts the kernel and waits for it to settle."""
        async with k.lock:
            if k.dead:
                raise KernelGone(k.session)
            k.busy += 1
            began = time.monotonic()
            ex = Execution()
            msg_id = ""
            try:
                msg_id = await k.kernel.request_execute(code, silent=silent, user_expressions=user_expressions)
                try:
                    await self._collect(k, msg_id, ex, began + timeout_s, progress, timeout_s, on_stream)
                except TimeoutError:
                    ex.timed_out = True
                    await self._interrupt(k, msg_id, ex)
                except KernelDied as exc:
                    # Its state is gone with it; the next call starts a new kernel and says why.
                    self._ended[(k.caller, k.session)] = Ended(reason=str(exc), idle_s=0.0,
                                                               save_error="the kernel died before it could save")
                    await self.stop(k)
                    if not ex.reached:
                        raise KernelGone(k.session) from exc  # dead before the code ran: safe to run elsewhere
                    raise
                except BaseException:
                    with anyio.CancelScope(shield=True):
                        await self._interrupt(k, msg_id, ex)
                    raise
            finally:
                k.kernel.forget(msg_id)
                k.busy -= 1
                k.last_used = self.clock()
                ex.duration_s = time.monotonic() - began
            return ex

    async def _interrupt(self, k: LiveKernel, msg_id: str, ex: Execution) -> None:
        ex.interrupted = True
        try:
            await k.kernel.interrupt()
            await self._collect(k, msg_id, ex, time.monotonic() + DRAIN_S, dropped_ends=True)
        except (TimeoutError, KernelDied, FirepoolError) as exc:
            log.warning("kernel %s did not settle after an interrupt (%s): stopping it", k.job.id, exc)
            await self.stop(k)

    async def _collect(self, k: LiveKernel, msg_id: str, ex: Execution, deadline: float,
                       progress: Progress | None = None, total: float | None = None,
                       on_stream: OnStream | None = None, dropped_ends: bool = False) -> None:
        """The request's messages until its reply and its idle status are in (TimeoutError at `deadline`;
        KernelDied when the kernel job ended). `dropped_ends`: after an interrupt, an idle status with no reply
        ends it too. ipykernel drops a request, with no reply, when the SIGINT lands in its own handler before
        the cell's code runs ("KeyboardInterrupt caught in kernel"): the kernel is idle and its state intact."""
        reply: dict[str, Any] | None = None
        idle_seen = False
        began = silent_since = time.monotonic()
        next_report = began + PROGRESS_EVERY_S
        while not (idle_seen and reply is not None):
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError
            if progress is not None and now >= next_report:
                # Long cells report like long commands: elapsed time and the last output line.
                last = next((ln for ln in reversed(ex.stdout.splitlines()) if ln.strip()), "")[:200]
                await progress(now - began, total, f"running {now - began:.0f}s" + (f": {last}" if last else ""))
                next_report = now + PROGRESS_EVERY_S
            try:
                msg = await k.kernel.next_reply(msg_id, min(deadline, now + ALIVE_CHECK_S,
                                                            next_report if progress is not None else deadline))
            except KernelTimeout:
                quiet = time.monotonic() - silent_since >= ALIVE_CHECK_S
                if quiet and (reply is not None or (dropped_ends and idle_seen)):
                    break  # the reply is in and iopub stayed quiet (its idle status was lost), or it was dropped
                if quiet:
                    job = await k.client.get(k.job.id)
                    if job.terminal:
                        raise KernelDied(job) from None
                    silent_since = time.monotonic()
                continue
            except KernelDisconnected:
                # The gateway closes the websocket when the kernel job ends: say how it ended.
                raise KernelDied(await k.client.get(k.job.id, wait_s=5.0)) from None
            silent_since = time.monotonic()
            if msg.get("channel") == "shell":
                reply = msg
            elif ex.absorb(msg):
                idle_seen = True
            elif on_stream is not None and msg.get("msg_type") == "stream":
                content = msg.get("content") or {}
                on_stream(str(content.get("name", "stdout")), str(content.get("text", "")))
        if reply is None:  # dropped after an interrupt: `ex.interrupted` says how it ended
            return
        content = reply.get("content", {})
        ex.status = content.get("status", "ok")
        ex.execution_count = content.get("execution_count")
        ex.user_expressions = content.get("user_expressions") or {}
        if ex.status == "error" and ex.error is None:
            ex.error = {k_: content.get(k_) for k_ in ("ename", "evalue", "traceback")}

    async def run_argv(self, k: LiveKernel, argv: list[str], env: dict[str, str] | None,
                       timeout_s: float, grace_s: float, *, stdin: bytes | None = None,
                       on_stream: OnStream | None = None) -> tuple[Execution, dict[str, Any] | None]:
        """Run a tool's command as a subprocess of the kernel; its result dict, or None when it did not end.
        With `on_stream` its output comes as it is printed (the execution's stdout/stderr), not in the dict."""
        code = kernel_code.run_call(argv, env, timeout_s, stdin, live=on_stream is not None)
        ex = await self.execute(k, code, silent=True, user_expressions={"r": kernel_code.LAST},
                                timeout_s=timeout_s + grace_s, on_stream=on_stream)
        if ex.error is not None or ex.timed_out:
            return ex, None
        result: dict[str, Any] = ex.expression("r")
        return ex, result

    # ---------------------------------------------------------------- end

    async def end(self, caller: str, session: str, reason: str, *, save: bool = True) -> Ended | None:
        """End the session's kernel (saving its namespace first when asked); None when none was live."""
        k = self._live.pop((caller, session), None)
        if k is None:
            return None
        ended = Ended(reason=reason, idle_s=max(0.0, self.clock() - k.last_used))
        if save and not k.dead:
            try:
                ex = await self.execute(k, kernel_code.call("save"), silent=True,
                                        user_expressions={"r": kernel_code.LAST}, timeout_s=SAVE_TIMEOUT_S)
                if ex.error is not None:
                    raise RuntimeError(f"{ex.error.get('ename')}: {ex.error.get('evalue')}")
                saved = ex.expression("r")
                ended.kept, ended.lost, ended.blob = saved["kept"], saved["lost"], saved["blob"]
            except (Exception, KernelDied) as exc:  # noqa: BLE001 - the kernel ends either way
                ended.save_error = str(exc)
        if save:  # before the stop: a call waiting for the pod starts its kernel as soon as this one ends
            self._ended[(caller, session)] = ended
        await self.stop(k)
        return ended

    async def stop(self, k: LiveKernel) -> None:
        k.dead = True
        self._live.pop((k.caller, k.session), None)
        await self._shutdown(k.client, k.kernel, k.job.id)

    @staticmethod
    async def _shutdown(client: AsyncCalls, kernel: AsyncKernel, job_id: str | None) -> None:
        """Shut the gateway kernel down (its job ends); the job is cancelled too when the gateway had lost it."""
        try:
            await kernel.shutdown()
        except Exception as exc:  # noqa: BLE001 - best effort: the broker may be gone
            log.debug("shutting kernel %s down: %s", kernel.id, exc)
        if job_id is not None:
            await cancel_quietly(client, job_id)

    def forget(self, caller: str, session: str) -> None:
        """Drop a saved namespace (the session ended: its state is gone by definition)."""
        self._ended.pop((caller, session), None)

    async def sweep(self) -> list[tuple[str, str, str]]:
        """End the kernels whose idle time the pools' rules no longer allow; (caller, session, reason) each."""
        done: list[tuple[str, str, str]] = []
        pressures: dict[tuple[int, str], idle.Pressure] = {}
        for (caller, session), k in list(self._live.items()):
            key = (id(k.client), k.pool)
            if key not in pressures:
                pressures[key] = await self._pressure(k.client, k.pool)
            busy = k.busy > 0 or k.lock.locked()
            reason = idle.end_reason(self.clock(), k.last_used, busy, pressures[key], self.min_idle_at_ceiling)
            if reason is not None:
                idle_s = self.clock() - k.last_used
                await self.end(caller, session, f"idle {idle_s:.0f} s, past the pool's keep-alive"
                               if reason == idle.KEEP_ALIVE else
                               f"idle {idle_s:.0f} s while the pool was blocked at its ceiling")
                done.append((caller, session, reason))
        return done

    async def _sweep_loop(self) -> None:
        while self._live:
            try:
                await self.sweep()
                ticks = [idle.tick(await self._pressure(k.client, k.pool), self.min_idle_at_ceiling)
                         for k in list(self._live.values())[:1]]
            except Exception:  # noqa: BLE001 - the sweeper must outlive a broker hiccup
                log.exception("idle-kernel sweep failed")
                ticks = []
            await asyncio.sleep(min(ticks, default=idle.MAX_TICK_S))

    async def close(self, save: bool = True) -> None:
        """End every live kernel (the server is shutting down)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for caller, session in list(self._live):
            await self.end(caller, session, "the MCP server stopped", save=save)
