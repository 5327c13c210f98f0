"""The gateway's kernels: one kernel job each, owned by one caller, with an id that survives restarts.

Start submits a kernel job (`kernel: true`, the agent's launcher) to the kernelspec's pool in the kernel's
session (`KERNEL_FIREPOOL_SESSION`, else `kernel:<id>`) and waits for its connection info, which only
`broker.running.kernelconns` learns and only the broker's bridges use. Restart is in place (SIGHUP: the
launcher forks a new kernel on the same ports and keys, firepool_agent.kernel_supervise), so the job, its
sandbox and its files stay; failing that, the next job in the same session. The kernel id stays, and every
open websocket follows to the new kernel (`GatewayKernel.changed`). Shutdown cancels the job. A caller
runs at most `max_kernels` at once (429 TooManyKernels). Idle kernels (no websocket open and no message for
`cull_idle_s`) are shut down by the broker itself, so they go even when the client's server has gone. The
id rides in the job's env (`KERNEL_ID`), so a restarted broker adopts the kernels that kept running.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import zmq.asyncio

from broker.errors import Conflict, FirepoolError, InvalidRequest, NotFound, SessionBusy, TooManyKernels
from broker.gateway.probe import kernel_answers
from broker.jobs import Job, JobSpec
from firepool_agent.limits import MAX_NAME_CHARS

log = logging.getLogger("firepool.gateway")

KERNEL_COMMAND = ("python3", "-m", "firepool_agent.kernel", "--ip", "127.0.0.1", "--restartable")
"""The agent's kernel launcher (its pre-started kernel binds to it), restartable in place by SIGHUP."""
RESTART_TIMEOUT_S = 30.0
"""A kernel restarted in place answers within this, or the restart replaces its job instead."""
SPEC_PREFIX = "firepool-"
SESSION_ENV = "KERNEL_FIREPOOL_SESSION"
QUEUE_ENV = "KERNEL_FIREPOOL_QUEUE"
"""The kernel job's queue (default `default`): a session is caller + queue + tag, as for any job."""
RECYCLE_ENV = "KERNEL_FIREPOOL_RECYCLE"
"""`0`: the kernel never takes (and so resets) an idle sandbox of another of the caller's sessions (the MCP
server's conversations keep their files apart this way); default `1`, as for any job."""
ID_ENV = "KERNEL_ID"
"""The kernel's gateway id in its job's env (Enterprise Gateway's variable): a restarted broker adopts it."""
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_ENV_VALUE = 4096


@dataclass(frozen=True)
class GatewaySettings:
    max_kernels: int = 8
    """Live gateway kernels per caller; one more start is refused (429 TooManyKernels)."""
    cull_idle_s: float = 3600.0
    """A kernel with no websocket open and no message for this long is shut down; 0: never."""
    cull_every_s: float = 10.0
    allowed_envs: tuple[str, ...] = ()
    """Client env names passed to the kernel besides `KERNEL_*` (GatewayClient's `allowed_envs`)."""
    start_timeout_s: float = 120.0
    max_message_bytes: int = 8 << 20
    """A websocket frame over this closes the socket with 1009 (uvicorn caps frames at 16 MiB before)."""


class ControlPlane(Protocol):
    async def submit(self, caller: str, spec: JobSpec) -> tuple[Job, bool]: ...

    async def cancel(self, caller: str, job_id: str) -> Job: ...

    async def signal(self, caller: str, job_id: str, name: str) -> Job: ...

    async def wait(self, caller: str, job_id: str, wait_s: float) -> Job: ...


class Connections(Protocol):
    async def connection(self, job: Job, wait_s: float = 0.0) -> dict[str, Any]: ...


def iso(at: float) -> str:
    """jupyter_server parses `last_activity` with `%Y-%m-%dT%H:%M:%S.%fZ`."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class GatewayKernel:
    id: str
    caller: str
    name: str
    pool: str
    tag: str
    env: dict[str, str]
    job_id: str = ""
    connection: dict[str, Any] = field(default_factory=dict, repr=False)
    """The kernel's keys and ports: read by the bridges, never served."""
    generation: int = 0
    last_activity: float = field(default_factory=time.time)
    execution_state: str = "starting"
    connections: int = 0
    ended: bool = False
    held: bool = False
    """Held by another door (an E2B sandbox): never culled; that door ends it."""
    changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """Set (and replaced) when the kernel behind this id changes: a restart, a shutdown."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    def touch(self) -> None:
        self.last_activity = time.time()

    def model(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "last_activity": iso(self.last_activity),
                "execution_state": self.execution_state, "connections": self.connections}

    def signal_change(self) -> None:
        old, self.changed = self.changed, asyncio.Event()
        old.set()


def kernel_env(requested: Mapping[str, str], allowed: tuple[str, ...]) -> dict[str, str]:
    """What of a start request's `env` reaches the kernel: `KERNEL_*` and the allowlist, never FIREPOOL_*."""
    env: dict[str, str] = {}
    for name, value in requested.items():
        if not (name.startswith("KERNEL_") or name in allowed) or name.startswith("FIREPOOL_"):
            continue
        if not _ENV_NAME.match(name) or "\x00" in value or len(value) > MAX_ENV_VALUE:
            raise InvalidRequest(f"env {name[:64]!r}: a variable name, a value without NUL of at most "
                                 f"{MAX_ENV_VALUE} characters", {"field": f"env.{name[:64]}"})
        env[name] = value
    return env


class GatewayKernels:
    def __init__(self, cp: ControlPlane, connections: Connections, pools: Callable[[], Mapping[str, Any]],
                 settings: GatewaySettings, ctx: Callable[[], zmq.asyncio.Context],
                 live_jobs: Callable[[], list[Job]] = list) -> None:
        self.cp = cp
        self.ctx = ctx
        self.live_jobs = live_jobs
        """The broker's live jobs, where a restarted broker finds the gateway kernels that kept running."""
        self._adopted = False
        self.connections = connections
        self.pools = pools
        self.settings = settings
        self._kernels: dict[str, GatewayKernel] = {}
        self._culler: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        """Restarted kernels' waits for their connection info, and every kernel's watch on its job."""

    # ---------------------------------------------------------------- lookups

    def of(self, caller: str) -> list[GatewayKernel]:
        return [k for k in self._kernels.values() if k.caller == caller and not k.ended]

    def live(self) -> list[GatewayKernel]:
        """Every caller's live kernels."""
        return [k for k in self._kernels.values() if not k.ended]

    def get(self, caller: str, kernel_id: str) -> GatewayKernel:
        """The caller's kernel; NotFound for an unknown id and for another caller's alike."""
        k = self._kernels.get(kernel_id)
        if k is None or k.caller != caller or k.ended:
            raise NotFound(f"no kernel {kernel_id[:64]!r}", {"kernel": kernel_id[:64]})
        return k

    def pool_of(self, spec_name: str) -> str:
        pool = spec_name.removeprefix(SPEC_PREFIX)
        if not spec_name.startswith(SPEC_PREFIX) or pool not in self.pools():
            raise NotFound(f"no kernelspec {spec_name[:80]!r} (GET /api/kernelspecs lists them)",
                           {"kernelspec": spec_name[:80]})
        return pool

    # ---------------------------------------------------------------- lifecycle

    async def start(self, caller: str, spec_name: str, env: Mapping[str, str],
                    ready: Callable[[Job], Awaitable[None]] | None = None) -> GatewayKernel:
        """Start a kernel and answer once it is up; with `ready`, once `ready(job)` returns (an E2B sandbox
        answers once its job runs) while the wait for the kernel's connection goes on in the background."""
        pool = self.pool_of(spec_name)
        passed = kernel_env(env, self.settings.allowed_envs)
        kid = str(uuid.uuid4())
        tag = passed.get(SESSION_ENV) or f"kernel:{kid}"
        if len(tag) > MAX_NAME_CHARS or not tag.isprintable():
            raise InvalidRequest(f"{SESSION_ENV} must be printable text of at most {MAX_NAME_CHARS} characters",
                                 {"field": f"env.{SESSION_ENV}"})
        queue, recycle = passed.get(QUEUE_ENV, "default"), passed.get(RECYCLE_ENV, "1")
        if not 0 < len(queue) <= 64 or not queue.isprintable():
            raise InvalidRequest(f"{QUEUE_ENV} must be printable text of 1 to 64 characters", {"field": f"env.{QUEUE_ENV}"})
        if recycle not in ("0", "1"):
            raise InvalidRequest(f"{RECYCLE_ENV} is 0 or 1", {"field": f"env.{RECYCLE_ENV}"})
        live = self.of(caller)
        if len(live) >= self.settings.max_kernels:
            raise TooManyKernels(f"you run {len(live)} gateway kernels, the broker's limit "
                                 f"(--gateway-max-kernels {self.settings.max_kernels}): shut one down first",
                                 {"limit": self.settings.max_kernels, "running": len(live)})
        if any(k.tag == tag for k in live):
            raise SessionBusy(f"a live kernel of yours already holds session {tag[:80]!r}; a session runs one "
                              "kernel at a time", {"session": tag[:80]})
        k = GatewayKernel(id=kid, caller=caller, name=spec_name, pool=pool, tag=tag, env={**passed, ID_ENV: kid})
        self._kernels[kid] = k  # counted against the limit while it starts
        try:
            async with k.lock:
                if ready is None:
                    await self._launch(k)
                else:
                    job = await self._submit(k)
                    try:
                        await ready(job)
                    except BaseException:
                        await self._cancel(k)
                        raise
                    self._track(self._come_up(k, job))
        except BaseException:
            k.ended = True
            self._kernels.pop(kid, None)
            raise
        self._ensure_culler()
        return k

    async def _launch(self, k: GatewayKernel) -> None:
        job = await self._submit(k)
        await self._connect(k, job)

    async def _submit(self, k: GatewayKernel) -> Job:
        spec = JobSpec(pool=k.pool, command=KERNEL_COMMAND, env=dict(k.env), lease_tag=k.tag,
                       queue=k.env.get(QUEUE_ENV, "default"), recycle=k.env.get(RECYCLE_ENV) != "0",
                       extra={"kernel": True})
        job, _ = await self.cp.submit(k.caller, spec)
        k.job_id = job.id
        return job

    def start_timeout(self, k: GatewayKernel) -> float:
        """The broker's start timeout, or the client's `KERNEL_LAUNCH_TIMEOUT` if shorter (GatewayClient sends
        it: its own request gives up after that plus a pad)."""
        try:
            asked = float(k.env.get("KERNEL_LAUNCH_TIMEOUT", "inf"))
        except ValueError:
            asked = float("inf")
        return max(1.0, min(self.settings.start_timeout_s, asked))

    async def _connect(self, k: GatewayKernel, job: Job) -> None:
        """Wait for the kernel job's connection info and hand it to the bridges; the job ends on failure."""
        try:
            info = await self.connections.connection(job, self.start_timeout(k))
        except BaseException:
            if k.job_id == job.id:
                await self._cancel(k)
            raise
        if k.job_id != job.id or k.ended:
            return  # restarted or shut down meanwhile: that path ended this job
        k.connection = info
        k.generation += 1
        k.execution_state = "idle"
        k.touch()
        k.signal_change()
        self._track(self._watch(k, job.id))

    def _track(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _watch(self, k: GatewayKernel, job_id: str) -> None:
        """A kernel whose job ends by itself (its code exited, a timeout, the pod lost) is dead: it leaves the
        list and its websockets close, as a gateway's vanished kernel does; a restart's end is not that."""
        while k.job_id == job_id and not k.ended:
            try:
                job = await self.cp.wait(k.caller, job_id, 300.0)
            except FirepoolError:
                await asyncio.sleep(1.0)
                continue
            if job.terminal:
                break
        if k.job_id == job_id and not k.ended and not k.lock.locked():
            log.info("gateway kernel %s of %s: its job %s ended by itself", k.id, k.caller, job_id)
            await self._end(k)

    async def _cancel(self, k: GatewayKernel) -> None:
        if not k.job_id:
            return
        try:
            await self.cp.cancel(k.caller, k.job_id)
        except FirepoolError as exc:  # already ended, or gone
            log.debug("cancelling kernel job %s: %s", k.job_id, exc)

    async def restart(self, caller: str, kernel_id: str) -> GatewayKernel:
        """A new interpreter in the same job: SIGHUP makes the launcher fork the next kernel on the same ports
        and keys (firepool_agent.kernel_supervise), and the answer comes once it answers `kernel_info`, as a
        local restart's does. Open websockets hold the client's messages meanwhile, then reconnect. A kernel
        that cannot restart in place (its job not running) gets the next job in its session instead."""
        k = self.get(caller, kernel_id)
        async with k.lock:
            if k.ended:
                raise NotFound(f"no kernel {kernel_id[:64]!r}", {"kernel": kernel_id[:64]})
            k.execution_state = "restarting"
            conn, k.connection = k.connection, {}
            k.signal_change()  # bridges drop their sockets and wait for the next kernel
            if conn and await self._restart_in_place(k, conn):
                k.connection = conn
                k.generation += 1
                k.execution_state = "idle"
                k.touch()
                k.signal_change()
                return k
            await self._cancel(k)
            try:
                job = await self._submit(k)
            except BaseException:
                await self._end(k)
                raise
        self._track(self._come_up(k, job))
        return k

    async def _restart_in_place(self, k: GatewayKernel, conn: dict[str, Any]) -> bool:
        try:
            await self.cp.signal(k.caller, k.job_id, "HUP")
        except FirepoolError:
            return False
        if await kernel_answers(self.ctx(), conn, RESTART_TIMEOUT_S):
            return True
        log.warning("gateway kernel %s did not answer within %.0f s of its restart in place; replacing its job",
                    k.id, RESTART_TIMEOUT_S)
        return False

    async def _come_up(self, k: GatewayKernel, job: Job) -> None:
        try:
            await self._connect(k, job)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported in the log and by the kernel's end
            log.warning("gateway kernel %s did not come back from its restart (job %s): %s", k.id, job.id, exc)
            if k.job_id == job.id:
                await self._end(k)

    async def interrupt(self, caller: str, kernel_id: str) -> None:
        k = self.get(caller, kernel_id)
        try:
            await self.cp.signal(caller, k.job_id, "INT")
        except Conflict as exc:
            raise Conflict(f"kernel {kernel_id} is not running (restarting or ended)", {"kernel": kernel_id}) from exc

    async def shutdown(self, caller: str, kernel_id: str) -> None:
        await self._end(self.get(caller, kernel_id))

    async def _end(self, k: GatewayKernel) -> None:
        if k.ended:
            return
        k.ended = True
        k.execution_state = "dead"
        self._kernels.pop(k.id, None)
        k.signal_change()
        await self._cancel(k)

    async def close(self) -> None:
        """Stop the culler and the watches; the kernels' jobs run on for the next broker to adopt."""
        if self._culler is not None:
            self._culler.cancel()
        for task in list(self._pending):
            task.cancel()
        for k in list(self._kernels.values()):
            k.ended = True
            k.signal_change()  # open websockets close (the server is going away)

    async def adopt(self) -> None:
        """Once per broker process: take back the gateway kernels whose jobs outlived the last broker (pods
        and their jobs survive a broker restart), each under its id, its culling clock starting now."""
        if self._adopted:
            return
        self._adopted = True
        for job in self.live_jobs():
            kid = job.spec.env.get(ID_ENV, "")
            if job.terminal or tuple(job.spec.command) != KERNEL_COMMAND or not kid or kid in self._kernels \
                    or not job.spec.extra.get("kernel"):
                continue
            k = GatewayKernel(id=kid, caller=job.caller, name=f"{SPEC_PREFIX}{job.spec.pool}", pool=job.spec.pool,
                              tag=job.spec.lease_tag, env=dict(job.spec.env), job_id=job.id)
            self._kernels[kid] = k
            log.info("gateway kernel %s of %s: adopted with its job %s", kid, job.caller, job.id)
            self._track(self._come_up(k, job))
        if self._kernels:
            self._ensure_culler()

    # ---------------------------------------------------------------- culling

    def _ensure_culler(self) -> None:
        if self.settings.cull_idle_s <= 0 or (self._culler is not None and not self._culler.done()):
            return
        self._culler = asyncio.get_running_loop().create_task(self._cull_loop())

    async def _cull_loop(self) -> None:
        while self._kernels:
            await asyncio.sleep(min(self.settings.cull_every_s, self.settings.cull_idle_s))
            await self.cull(time.time())

    async def cull(self, now: float) -> list[str]:
        """Shut down every kernel with no websocket open and no message for `cull_idle_s`; their ids."""
        idle = [k for k in self._kernels.values() if not k.ended and not k.held and k.connections == 0
                and not k.lock.locked()
                and now - k.last_activity >= self.settings.cull_idle_s]
        for k in idle:
            log.info("culling gateway kernel %s of %s (idle %.0f s, no connection)", k.id, k.caller,
                     now - k.last_activity)
            await self._end(k)
        return [k.id for k in idle]
