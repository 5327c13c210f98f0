"""The emulated containers: one real pod agent per pod, started the way the local backend starts one.

The command line comes from `broker.backends.sandboxing` (a bubblewrap sandbox whose PID 1 is
`python -m firepool_agent`, or the unisolated fallback where bwrap is unavailable) and the process
handling from `broker.backends.podprocs`; only `--listen` differs: the agent serves TCP on the pod's
own loopback IP (127.1.x.y, host network), as a real agent serves on its pod IP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.backends.podprocs import PodProcesses, remove_tree, same_process, starttime
from broker.backends.sandboxing import (
    PodDirs,
    SandboxSpec,
    agent_env,
    agent_package_dir,
    bwrap_argv,
    exposed_sources,
    fallback_argv,
    probe_bwrap,
    python_of,
    python_prefixes,
    uses,
    write_users,
)

log = logging.getLogger(__name__)

KILL_TIMEOUT_S = 10.0
START_TIMEOUT_S = 30.0


class ContainerError(Exception):
    """A container that cannot start (its reason goes into the pod's container status)."""


@dataclass
class AgentProcess:
    """One running agent: where it listens and the pids that end it (a `PodProcesses` record)."""

    pod: str
    dirs: PodDirs
    endpoint: str
    record: dict[str, Any] = field(default_factory=dict)
    info_fd: int | None = None


class Agents:
    def __init__(self, state_dir: Path, *, sandbox: str = "auto", python_prefix: str = sys.prefix,
                 sandbox_uid: int | None = None) -> None:
        if sandbox not in ("auto", "bwrap", "none"):
            raise ValueError(f"sandbox must be auto, bwrap or none, got {sandbox!r}")
        self.state_dir = Path(state_dir).resolve()
        self.pods_dir = self.state_dir / "pods"
        self.pods_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.python = python_of(python_prefix)
        self.prefixes = python_prefixes(python_prefix)
        self.agent_dir = agent_package_dir()
        self.uid = (sandbox_uid if sandbox_uid is not None else 65534) if os.geteuid() == 0 else None
        self.bwrap = shutil.which("bwrap")
        self.procs = PodProcesses()
        self.mode = "none"
        if sandbox != "none":
            why = probe_bwrap(self.bwrap, self.uid)
            if why is None:
                self.mode = "bwrap"
            elif sandbox == "bwrap":
                raise ContainerError(f"bubblewrap sandboxes are unavailable: {why}")
            else:
                log.warning("emulated pods run UNISOLATED: %s", why)
        probe = SandboxSpec(name="probe", dirs=PodDirs(self.pods_dir / "probe"), python=self.python,
                            prefixes=self.prefixes, agent_dir=self.agent_dir, cuda_visible_devices="")
        if self.mode == "bwrap" and uses(exposed_sources(probe), str(self.state_dir)) is not None:
            raise ContainerError(f"the emulator's state directory {self.state_dir} would be visible in every sandbox")

    def spawn(self, key: str, pod: str, ip: str, port: int, secret: str, *, cuda: str = "",
              kernels: str = "cold", flags: Sequence[str] = ()) -> AgentProcess:
        """Spawn the agent of pod `pod` (directory `key`) listening on tcp:ip:port.

        Synchronous, so the caller holds the process before any await: a pod deleted while its agent
        starts still has it killed. `settle` then learns the sandbox's own pid.
        """
        if len(secret.encode()) < 16:
            raise ContainerError("the agent's secret must be at least 16 bytes")
        isolated = self.mode == "bwrap"
        dirs = PodDirs(self.pods_dir / key)
        dirs.root.mkdir(mode=0o700)
        for path in (dirs.workspace, dirs.pkg, dirs.run, dirs.deps, *([] if isolated else [dirs.tmp])):
            path.mkdir(mode=0o700, parents=True)  # workspace, pkg and deps sit under disk/ (uncapped here)
            if isolated and self.uid is not None:
                os.chown(path, self.uid, self.uid)
        spec = SandboxSpec(name=pod, dirs=dirs, python=self.python, prefixes=self.prefixes, agent_dir=self.agent_dir,
                           cuda_visible_devices=cuda, uid=self.uid,
                           network="host")  # the emulated pod network: each pod IP is a host loopback address
        if isolated:
            write_users(spec)  # the sandbox's /etc/passwd and /etc/group, as the local backend's
        argv = bwrap_argv(self.bwrap or "bwrap", spec) if isolated else fallback_argv(spec)
        argv[argv.index("--listen") + 1] = f"tcp:{ip}:{port}"
        argv += ["--kernels", kernels, *flags]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"} if isolated else agent_env(spec, isolated=False)
        agent = AgentProcess(pod, dirs, f"tcp:{ip}:{port}", {"mode": self.mode})
        try:
            pid, agent.info_fd = self.procs.spawn(argv, env, secret, dirs.log, with_info=isolated)
        except OSError as exc:
            remove_tree(dirs.root)
            raise ContainerError(f"cannot start the agent: {exc}") from exc
        agent.record.update(launcher_pid=pid, launcher_start=starttime(pid))
        if not isolated:
            agent.record.update(pid=pid, pid_start=starttime(pid))
        return agent

    async def settle(self, agent: AgentProcess) -> None:
        """Wait for bwrap's report of the sandbox's PID 1 (nothing to wait for unisolated)."""
        info_fd, agent.info_fd = agent.info_fd, None
        if info_fd is None:
            return
        inner = await self.procs.sandbox_pid(info_fd, int(agent.record["launcher_pid"]), START_TIMEOUT_S)
        if inner is None:
            raise ContainerError(f"bwrap did not start the sandbox: {self.log_tail(agent)}")
        agent.record.update(pid=inner, pid_start=starttime(inner))

    def exited(self, agent: AgentProcess) -> bool:
        return self.procs.exited(int(agent.record["launcher_pid"]))

    def log_tail(self, agent: AgentProcess) -> str:
        try:
            return agent.dirs.log.read_text(errors="replace")[-600:].strip() or "(no output)"
        except OSError:
            return "(no output)"

    async def stop(self, agent: AgentProcess, grace_s: float, cut: Callable[[], bool] = lambda: False) -> bool:
        """End a container as a kubelet does: SIGTERM to its PID 1 (the agent), then, if it is still there at
        the end of `grace_s` (or once `cut()` says so), SIGKILL (`kill`). An agent that is its sandbox's PID 1
        installs no SIGTERM handler, so the kernel drops the SIGTERM and it runs the whole grace, as in a real
        container."""
        pid = same_process(agent.record.get("pid"), agent.record.get("pid_start"))
        if pid is not None and grace_s > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace_s
            while loop.time() < deadline and not self.exited(agent) and not cut():
                await asyncio.sleep(0.02)
        return await self.kill(agent)

    async def kill(self, agent: AgentProcess) -> bool:
        """SIGKILL the agent's sandbox, wait until every process is gone, remove its directory."""
        if agent.info_fd is not None:
            os.close(agent.info_fd)
            agent.info_fd = None
        gone = await self.procs.kill(agent.record, KILL_TIMEOUT_S)
        if not gone:
            log.error("emulated pod %s: processes alive %.0f s after SIGKILL", agent.pod, KILL_TIMEOUT_S)
        await asyncio.to_thread(remove_tree, agent.dirs.root)  # a big workspace must not stall the API's loop
        return gone
