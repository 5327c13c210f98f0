"""`FirepoolProvisioner`: a jupyter_client kernel provisioner whose kernel is a broker job in a warm sandbox.

Launch submits a kernel job (`kernel: true`, lease_tag = the kernel id or the notebook path) to the pool
and asks the broker for the kernel's connection info (`GET /v1/jobs/{id}/kernel`, `AsyncClient.kernel`),
which only this caller, the job's owner, can read; no key is ever in the job's log. Signals, terminate and kill go through the broker (`POST /v1/jobs/{id}/signal`); a restart is a
new kernel job with the same tag, so it lands on the same warm sandbox. The broker's token stays here: the
kernel sees only what the broker injects (its pod's GPUs, the workspace, the verified caller).
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from collections.abc import Mapping
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Float, Unicode

from broker.client import AsyncClient, JobInfo
from broker.errors import Conflict, FirepoolError, KernelEnded, NotFound

CONNECTION_KEYS = ("ip", "transport", "shell_port", "iopub_port", "stdin_port", "control_port", "hb_port",
                   "signature_scheme")
SIGNAL_NAMES = {signal.SIGINT: "INT", signal.SIGTERM: "TERM", signal.SIGKILL: "KILL", signal.SIGHUP: "HUP",
                signal.SIGUSR1: "USR1", signal.SIGUSR2: "USR2", signal.SIGQUIT: "QUIT"}
POLL_CACHE_S = 0.25
"""poll() asks the broker at most this often; between asks it answers from the last reply."""
TAG_LIMIT = 255


class KernelStartError(RuntimeError):
    """The kernel job ended, or never reported its connection info, before the kernel was reachable."""


def parse_connection(raw: Mapping[str, Any]) -> KernelConnectionInfo:
    """The connection info the broker served, the key as bytes (as jupyter_client compares it)."""
    missing = [k for k in (*CONNECTION_KEYS, "key") if k not in raw]
    if missing:
        raise KernelStartError(f"the kernel's connection info lacks {', '.join(missing)}")
    info: KernelConnectionInfo = {k: raw[k] for k in CONNECTION_KEYS}  # type: ignore[assignment]
    info["key"] = raw["key"].encode()
    if raw.get("curve_publickey") and raw.get("curve_secretkey"):
        # Text, as the kernel manager reports them back when it checks what it loaded.
        info["curve_publickey"] = str(raw["curve_publickey"])
        info["curve_secretkey"] = str(raw["curve_secretkey"])
    return info


def session_tag(mode: str, kernel_id: str, env: dict[str, str]) -> str:
    """The job's lease_tag: `kernel` (default) -> the kernel id; `notebook` -> the notebook path the server
    names in JPY_SESSION_NAME (so reopening it lands on its warm sandbox); anything else is taken as is."""
    if mode == "kernel" or not mode:
        tag = f"kernel:{kernel_id}"
    elif mode == "notebook":
        path = env.get("JPY_SESSION_NAME", "")
        tag = f"notebook:{path}" if path else f"kernel:{kernel_id}"
    else:
        tag = mode
    if len(tag) > TAG_LIMIT:
        tag = tag[:TAG_LIMIT - 17] + ":" + hashlib.sha256(tag.encode()).hexdigest()[:16]
    return tag


def exit_code_of(job: JobInfo) -> int:
    """What poll()/wait() report for a finished kernel job: its exit code, or -1 when no process exited."""
    return job.exit_code if job.exit_code is not None else -1


class FirepoolProvisioner(KernelProvisionerBase):
    """Runs the kernel as a Firepool job; configured from the kernelspec's `metadata.kernel_provisioner.config`."""

    pool = Unicode("cpu", config=True, help="The Firepool pool (hardware SKU) the kernel runs in.")
    url = Unicode("", config=True, help="Broker URL, or a comma-separated list of the brokers of one store "
                                        "(default: $FIREPOOL_URL, else the local broker).")
    lease_tag = Unicode("kernel", config=True,
                        help="Session tag: 'kernel' (the kernel id), 'notebook' (the notebook path), or a literal.")
    queue = Unicode("default", config=True, help="The broker queue of kernel jobs.")
    ip = Unicode("127.0.0.1", config=True,
                 help="Address the kernel binds in its pod (127.0.0.1 on the local backend, 0.0.0.0 in a cluster).")
    start_timeout = Float(120.0, config=True, help="Seconds to wait for the kernel's connection info.")
    max_lifetime = Float(None, allow_none=True, config=True,
                         help="The kernel job's timeout_s: a hard cap on one kernel's life, which also bounds "
                              "a kernel whose Jupyter server died without shutting it down (default: none).")

    job_id: str | None = None
    _client: AsyncClient | None = None
    _exit: int | None = None
    _polled_at: float = 0.0
    _tag: str = ""
    last_job: JobInfo | None = None
    """The kernel job as the broker last reported it (pool, pod, acquisition path)."""
    launch_s: float | None = None
    """The last launch's submit -> connection info, seconds (the benchmark's phase)."""

    # ---------------------------------------------------------------- plumbing

    def client(self) -> AsyncClient:
        if self._client is None:
            self._client = AsyncClient(self.url or None)
        return self._client

    @property
    def has_process(self) -> bool:
        return self.job_id is not None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        kwargs["cmd"] = self.command()
        return kwargs

    async def post_launch(self, **kwargs: Any) -> None:
        await super().post_launch(**kwargs)
        self._rewatch_server_activity()

    def _rewatch_server_activity(self) -> None:
        """Point a Jupyter server's activity watch at the kernel this (re)start brought up.

        jupyter_server follows each kernel's iopub (its culler's clock, the kernel's `execution_state`) with
        the key and ports the kernel had when it was first started, and renews that only after a REST restart
        whose ports changed. Every Firepool kernel has a fresh key (and on a host-network pod fresh ports), so
        after a restart, REST or the KernelRestarter's, the server would keep a frozen `last_activity` and
        cull a kernel in use. A first start is left alone: the server starts watching it once it is ready.
        """
        manager: Any = getattr(self.parent, "parent", None)  # the server's MappingKernelManager, if any
        kernel = getattr(manager, "_kernels", {}).get(self.kernel_id)
        if kernel is None or getattr(kernel, "_activity_stream", None) is None or \
                not hasattr(manager, "start_watching_activity"):
            return
        manager.stop_watching_activity(self.kernel_id)
        manager.start_watching_activity(self.kernel_id)

    def command(self) -> list[str]:
        return ["python3", "-m", "firepool_agent.kernel", "--ip", self.ip]

    def kernel_env(self, env: dict[str, str]) -> dict[str, str]:
        """Only the kernelspec's own `env` travels: never the server's environment (its broker token)."""
        wanted = set(self.kernel_spec.env or {}) if self.kernel_spec is not None else set()
        return {k: v for k, v in env.items() if k in wanted and not k.startswith("FIREPOOL_")}

    # ---------------------------------------------------------------- launch

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        env = dict(kwargs.get("env") or {})
        began = time.perf_counter()
        if not self._tag:
            self._tag = session_tag(self.lease_tag, str(self.kernel_id), env)
        try:
            job = await self.client().submit(cmd, self.pool, lease_tag=self._tag, queue=self.queue, kernel=True,
                                             env=self.kernel_env(env), timeout_s=self.max_lifetime)
        except FirepoolError as exc:
            await self._close()  # the manager calls no cleanup after a failed start
            # One error a notebook user can act on (no broker, unknown pool, refused token), of the broker's
            # class, without the HTTP client's exception chained under it.
            raise start_error(exc, self.pool) from None
        self._exit, self._polled_at, self.last_job = None, 0.0, job
        try:
            info = await asyncio.wait_for(self._read_connection(job.id), self.start_timeout)
            self.last_job = await self.client().get(job.id)
        except (TimeoutError, KernelStartError, FirepoolError, asyncio.CancelledError) as exc:
            await self._give_up(job.id)  # also when the start is cancelled: the job must not outlive it
            if isinstance(exc, TimeoutError):
                raise KernelStartError(f"kernel job {job.id} did not report its connection within "
                                       f"{self.start_timeout:.0f} s") from exc
            raise
        # The kernel "has a process" only from here on, with no await before the manager loads `info`: a
        # Jupyter server's websocket that reconnects during a restart waits for is_alive() and then takes
        # the manager's ports and key, which until now are the previous kernel's.
        self.job_id = job.id
        self.connection_info = info
        self.launch_s = time.perf_counter() - began
        self.log.info("Firepool kernel %s: job %s on %s (%s)", self.kernel_id, job.id,
                      self.last_job.raw.get("bound_pods"), self.last_job.path)
        return info

    async def _read_connection(self, job_id: str) -> KernelConnectionInfo:
        return await read_connection(self.client(), job_id)

    async def _give_up(self, job_id: str) -> None:
        try:
            await self.client().cancel(job_id)
        except FirepoolError:
            pass
        self.job_id = None
        await self._close()

    async def _close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    # ---------------------------------------------------------------- lifecycle

    async def poll(self) -> int | None:
        """None while the kernel job is queued or running (or the broker is briefly unreachable)."""
        if self.job_id is None:
            return self._exit
        if self._exit is not None:
            return self._exit
        now = time.monotonic()
        if now - self._polled_at < POLL_CACHE_S:
            return None
        self._polled_at = now
        try:
            job = await self.client().get(self.job_id)
        except NotFound:
            self._exit = -1
            return self._exit
        except FirepoolError:
            return None
        self.last_job = job
        if job.terminal:
            self._exit = exit_code_of(job)
        return self._exit

    async def wait(self) -> int | None:
        if self.job_id is None:
            return self._exit
        while self._exit is None:
            try:
                job = await self.client().get(self.job_id, wait_s=30.0)
            except NotFound:
                self._exit = -1
                break
            except FirepoolError:
                await asyncio.sleep(0.5)
                continue
            self.last_job = job
            if job.terminal:
                self._exit = exit_code_of(job)
        return self._exit

    async def send_signal(self, signum: int) -> None:
        if self.job_id is None or self._exit is not None:
            return
        if signum == 0:
            await self.poll()
            return
        name = SIGNAL_NAMES.get(signal.Signals(signum))
        if name is None:
            raise ValueError(f"signal {signum} cannot be sent to a Firepool kernel")
        try:
            await self.client().signal(self.job_id, name)
        except (Conflict, NotFound):
            pass  # the kernel job already ended

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGTERM)

    async def kill(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGKILL)

    async def cleanup(self, restart: bool = False) -> None:
        """Forget the finished job. Without a restart, make sure it ended: the pod then goes back to the
        pool, reset and held for this caller like any released pod. (A restart's kernel job waits in the
        broker for its session's pod to finish resetting, so it lands on the same warm sandbox.)"""
        job_id, self.job_id = self.job_id, None
        if not restart:
            if job_id is not None and self._exit is None:
                try:
                    await self.client().cancel(job_id)
                except FirepoolError as exc:
                    self.log.warning("cancelling kernel job %s failed: %s", job_id, exc)
            await self._close()

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        return max(recommended, 10.0)  # the kernel's exit reaches us through the broker

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        return max(recommended, self.start_timeout)

    # ---------------------------------------------------------------- persistence

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super().get_provisioner_info()
        info.update({"job_id": self.job_id, "lease_tag": self._tag, "pool": self.pool, "url": self.url})
        info["connection_info"] = {**self.connection_info, "key": _text(self.connection_info.get("key", b""))}
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """Reattach to a running kernel job (a restarted Jupyter server) instead of leaking its sandbox."""
        await super().load_provisioner_info(provisioner_info)
        key = self.connection_info.get("key")
        if isinstance(key, str):
            self.connection_info = {**self.connection_info, "key": key.encode()}  # type: ignore[typeddict-item]
        self.job_id = provisioner_info.get("job_id")
        self._tag = provisioner_info.get("lease_tag") or ""
        self.pool = provisioner_info.get("pool") or self.pool
        self.url = provisioner_info.get("url") or self.url
        self._exit, self._polled_at = None, 0.0
        if self.job_id:
            try:
                self.last_job = await self.client().get(self.job_id)
            except FirepoolError as exc:
                self.log.warning("kernel job %s not reachable on reattach: %s", self.job_id, exc)


def start_error(exc: FirepoolError, pool: str) -> FirepoolError:
    """The broker's error for a kernel that could not be submitted, its message saying what was started."""
    error = type(exc)(f"Firepool kernel in pool {pool!r} not started: {exc.message}", exc.details)
    error.status = exc.status
    return error


def _text(key: Any) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


async def read_connection(client: Any, job_id: str) -> KernelConnectionInfo:
    """The kernel's connection info from the broker's owner-only endpoint once the kernel is up (the caller's
    own timeout bounds the wait); KernelStartError if the job ends first."""
    try:
        raw = await client.kernel(job_id, timeout=None)
    except KernelEnded:
        pass
    else:
        return parse_connection(raw)
    job = await client.get(job_id)
    raise KernelStartError(f"kernel job {job_id} ended ({job.state}, {job.error_class or 'exit'} "
                           f"{job.exit_code}) before its kernel started: "
                           f"{(await client.logs(job_id, 'stderr'))[-600:]}")
