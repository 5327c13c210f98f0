"""Starting a local pod: its directories, limits and sandbox, the agent as PID 1, then its first answer; and
the end of a start that failed or was stopped (a half-made pod is destroyed, and `close` waits for that).

A mixin of `LocalBackend` (its create path). The pod's record is written before its disk is mounted or its
cgroup made, so a restarted broker finds (and can clean up) a half-made pod; the agent's incarnation (design R5) is counted
on the host beside its ledger, where no job reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Protocol

from broker.backends import networking
from broker.backends.podlimits import PodLimiter
from broker.backends.podnets import PodNetworks
from broker.backends.podprocs import LEDGER_FD, PodProcesses, starttime
from broker.backends.sandboxing import PodDirs, SandboxSpec, agent_env, bwrap_argv, fallback_argv, write_users
from broker.backends.volumes import make_volume_dirs
from broker.errors import AgentError, BackendError
from broker.podtemplate import Limits
from broker.running.agent_http import HttpAgentClient
from firepool_agent.incarnation import next_incarnation

log = logging.getLogger("broker.backends.local")

START_TIMEOUT_S = 30.0
"""How long a new pod's agent may take to answer its first health check."""


class _Pods(Protocol):
    state_dir: Path
    ledger_dir: Path
    limiter: PodLimiter
    nets: PodNetworks
    procs: PodProcesses
    bwrap: str | None
    mode: str
    uid: int | None
    orphan_after_s: float | None

    @property
    def isolated(self) -> bool: ...

    def _dirs(self, name: str) -> PodDirs: ...

    def _write(self, record: dict[str, Any]) -> None: ...

    def agent(self, name: str) -> HttpAgentClient: ...

    def _log_tail(self, name: str) -> str: ...

    async def _wait_healthy(self, name: str, launcher: int) -> None: ...

    async def _destroy(self, name: str) -> None: ...

    _creates: dict[str, asyncio.Task[Any]]
    _abandoned: dict[str, asyncio.Future[None]]


class PodStarting:
    """The start of a pod (mixin)."""

    async def _start(self: _Pods, spec: SandboxSpec, record: dict[str, Any], limits: Limits) -> None:
        began = time.perf_counter()
        dirs = spec.dirs
        dirs.root.mkdir(mode=0o700)
        # Recorded before its disk is mounted or its cgroup made: a broker killed from here on leaves a record
        # by which the next one finds the pod and releases both.
        record["limits"] = {"cgroup": self.limiter.cgroup_for(spec.name)}
        self._write(record)
        try:
            spec, join = await asyncio.to_thread(
                self.limiter.apply, spec, record, limits, self.uid if self.isolated else None
            )
        except OSError as exc:
            raise BackendError(f"cannot set up the limits of pod {spec.name}: {exc}") from exc
        self._write(record)
        for path in (
            dirs.workspace,
            dirs.pkg,
            dirs.run,
            dirs.deps,
            dirs.volumes,
            *([] if self.isolated else [dirs.tmp]),
        ):
            path.mkdir(mode=0o700)
            if self.isolated and self.uid is not None:
                os.chown(path, self.uid, self.uid)
        make_volume_dirs(
            tuple(b for b in spec.binds if b.src.startswith(f"{self.state_dir}/")),
            self.uid if self.isolated else None,
        )
        if self.isolated and spec.network == "isolated":
            dirs.resolv.write_text(networking.resolv_conf())
            dirs.resolv.chmod(0o644)
        if self.isolated:  # the sandbox's own users: its jobs' uid by name, nothing of the host's passwd
            write_users(spec)
        argv = bwrap_argv(self.bwrap or "bwrap", spec) if self.isolated else fallback_argv(spec)
        # The agent's incarnation (R5) is counted here, on the host beside its ledger, where no job reaches it.
        record["incarnation"] = await asyncio.to_thread(
            next_incarnation, self.ledger_dir / f"{spec.name}.incarnation"
        )
        argv += [
            "--kernels",
            record["kernels"],
            "--ledger-fd",
            str(LEDGER_FD),
            "--incarnation",
            str(record["incarnation"]),
        ]  # the agent's own flags end it
        if self.orphan_after_s is not None:
            argv += ["--orphan-after-s", str(self.orphan_after_s)]
        argv = [*join, *argv]
        # The agent's own env in the fallback; bwrap clears it and sets the sandbox's.
        env = (
            agent_env(spec, isolated=False)
            if not self.isolated
            else {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        )
        self._write(record)
        try:
            pid, info_fd = self.procs.spawn(
                argv,
                env,
                record["secret"],
                dirs.log,
                with_info=self.isolated,
                ledger=self.ledger_dir / f"{spec.name}.jsonl",
            )
        except OSError as exc:
            raise BackendError(f"cannot start pod {spec.name}: {exc}") from exc
        record["launcher_pid"] = pid
        record["launcher_start"] = starttime(pid)
        self._write(record)
        agent_pid: int | None = pid
        if info_fd is not None:
            agent_pid = await self.procs.sandbox_pid(info_fd, pid, START_TIMEOUT_S)
            if agent_pid is None:
                raise BackendError(f"bwrap did not start pod {spec.name}: {self._log_tail(spec.name)}")
        record["pid"] = agent_pid  # the agent; SIGKILL to it ends the whole pod (a PID namespace init)
        record["pid_start"] = starttime(agent_pid)
        self._write(record)
        await self._wait_healthy(spec.name, pid)
        net_ms = await self.nets.attach(spec, record, agent_pid) if self.isolated else 0.0
        log.info(
            "pod %s up in %.0f ms (%s, network %s%s, GPUs %s, limits %.0f ms)",
            spec.name,
            (time.perf_counter() - began) * 1000,
            self.mode,
            record["network"],
            f" +{net_ms:.1f} ms" if net_ms else "",
            record["cuda_visible_devices"] or "none",
            record.get("limits_ms", 0.0),
        )

    def _log_tail(self: _Pods, name: str) -> str:
        with contextlib.suppress(OSError):
            return self._dirs(name).log.read_text(errors="replace")[-600:].strip() or "(no output)"
        return "(no output)"

    async def _wait_healthy(self: _Pods, name: str, launcher: int) -> None:
        client = self.agent(name)
        deadline = time.monotonic() + START_TIMEOUT_S
        pause = 0.002
        while True:
            try:
                await client.health()
                return
            except AgentError as exc:
                if self.procs.exited(launcher):
                    raise BackendError(f"pod {name} exited while starting: {self._log_tail(name)}") from exc
                if time.monotonic() > deadline:
                    raise BackendError(
                        f"pod {name}'s agent did not answer within {START_TIMEOUT_S:.0f} s"
                    ) from exc
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 0.05)

    def _abandon(self: _Pods, name: str, starting: asyncio.Future[None]) -> asyncio.Future[None]:
        """Destroy a half-made pod once its start has stopped, on a task `close` waits for: a broker stopped
        (SIGTERM) while a pod starts must not leave its sandbox behind, however long the stop of its loops
        may wait (`Supervisor.stop` gives up after 5 s and the event loop then cancels what is left)."""
        ending = self._abandoned.get(name)
        if ending is None:
            async def destroy() -> None:
                await asyncio.gather(starting, return_exceptions=True)  # no process spawns after this
                await self._destroy(name)

            ending = self._abandoned[name] = asyncio.ensure_future(destroy())
            ending.add_done_callback(lambda _: self._abandoned.pop(name, None))
        return ending

    async def end_starts(self: _Pods) -> None:
        """Cancel the starts in flight and wait until every half-made pod is destroyed (at `close`)."""
        for task in list(self._creates.values()):
            task.cancel()
        while pending := [t for t in (*self._creates.values(), *self._abandoned.values()) if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)
