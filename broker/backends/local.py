"""`LocalBackend`: pods as bubblewrap sandboxes on this machine, each with the pod agent as PID 1.

A pod lives in `state_dir/pods/<name>/`: `pod.json` (0600: the agent's secret, pids, GPUs and
annotations; never visible in any sandbox), the agent's log, and the workspace, package and run
directories bound into the sandbox. Pods survive a broker restart: a new instance over the same
state directory finds them through their records, and `list_pods` drops the records of dead ones.
GPUs are bound exclusively; without bubblewrap, pods run unisolated and say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
import secrets
import shutil
import signal
import stat
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from firepool_agent import proctree

from broker.agent_http import HttpAgentClient
from broker.backends import gpus as gpu_discovery
from broker.backends.sandboxing import (
    INFO_FD,
    SECRET_FD,
    PodDirs,
    SandboxSpec,
    agent_env,
    agent_package_dir,
    bwrap_argv,
    exposed_sources,
    fallback_argv,
    parse_binds,
    parse_network,
    probe_bwrap,
    python_of,
    python_prefixes,
    uses,
)
from broker.clock import Clock
from broker.errors import AgentError, BackendError
from broker.ports.backend import Device, PodInfo, PodRequest

log = logging.getLogger(__name__)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
START_TIMEOUT_S = 30.0
"""How long a new pod's agent may take to answer its first health check."""
HEALTH_TIMEOUT_S = 3.0
KILL_TIMEOUT_S = 10.0
_warned_unisolated = False


class LocalBackend:
    kind = "local"

    def __init__(self, state_dir: Path, clock: Clock, *, virtual_gpus: int | None = None, sandbox: str = "auto",
                 python_prefix: str = sys.prefix, sandbox_uid: int | None = None) -> None:
        if sandbox not in ("auto", "bwrap", "none"):
            raise ValueError(f"sandbox must be auto, bwrap or none, got {sandbox!r}")
        self.state_dir = Path(state_dir).resolve()
        self.clock = clock
        self.pods_dir = self.state_dir / "pods"
        self.pods_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.python = python_of(python_prefix)
        self.prefixes = python_prefixes(python_prefix)
        self.agent_dir = agent_package_dir()
        self.uid = (sandbox_uid if sandbox_uid is not None else 65534) if os.geteuid() == 0 else None
        self._gpus = {g.device.key: g for g in gpu_discovery.discover(virtual_gpus)}
        self.bwrap = shutil.which("bwrap")
        self.mode = self._choose_mode(sandbox)
        self._records: dict[str, dict[str, Any]] = {}
        self._starting: set[str] = set()
        self._clients: dict[str, HttpAgentClient] = {}
        self._dir_fds: dict[str, int] = {}
        self._children: set[int] = set()
        for path in sorted(self.pods_dir.glob("*/pod.json")):
            record = self._read(path)
            if record is not None:
                self._records[record["name"]] = record

    # -- setup ----------------------------------------------------------------------------------

    def _choose_mode(self, sandbox: str) -> str:
        global _warned_unisolated
        why = "sandbox=none was asked for"
        if sandbox != "none":
            why = probe_bwrap(self.bwrap, self.uid) or ""
            if not why:
                exposed = uses(exposed_sources(self._spec_template()), str(self.state_dir))
                if exposed is not None:
                    raise BackendError(f"the state directory {self.state_dir} would be visible inside every sandbox "
                                       f"(through {exposed}); choose one outside it")
                return "bwrap"
            if sandbox == "bwrap":
                raise BackendError(f"bubblewrap sandboxes are unavailable: {why}")
        if not _warned_unisolated:
            _warned_unisolated = True
            log.warning("local pods run UNISOLATED (%s): jobs share this host's processes, files and /dev/shm, "
                        "run as uid %d and can read the broker's state directory", why, os.geteuid())
        return "none"

    def _spec_template(self) -> SandboxSpec:
        return SandboxSpec(name="probe", dirs=PodDirs(self.pods_dir / "probe"), python=self.python,
                           prefixes=self.prefixes, agent_dir=self.agent_dir, cuda_visible_devices="")

    @property
    def isolated(self) -> bool:
        """True when pods are bubblewrap sandboxes; False in the unisolated fallback."""
        return self.mode == "bwrap"

    def devices(self) -> list[Device]:
        return [g.device for g in self._gpus.values()]

    # -- records --------------------------------------------------------------------------------

    def _dirs(self, name: str) -> PodDirs:
        return PodDirs(self.pods_dir / name)

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        try:
            record: dict[str, Any] = json.loads(path.read_text())
            return record
        except (OSError, ValueError):
            return None

    def _write(self, record: dict[str, Any]) -> None:
        """Replace the record atomically: a broker crash leaves the old or the new one, never half of one.

        No fsync: a record only has to outlive the broker, and after a host crash no pod survives.
        Synchronous (well under a millisecond), so concurrent writers of one record cannot interleave.
        """
        target = self._dirs(record["name"]).record
        temp = target.with_name(".pod.json.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(temp, target)

    def _info(self, record: Mapping[str, Any]) -> PodInfo:
        return PodInfo(name=record["name"], pool=record["pool"], gpus=tuple(record["gpus"]),
                       template=record["template"], created_at=record["created_at"], isolated=record["isolated"],
                       annotations=dict(record["annotations"]), endpoint=f"unix:{self._dirs(record['name']).socket}",
                       details={"mode": record["mode"], "uid": record["uid"], "agent_pid": record.get("agent_pid"),
                                "cuda_visible_devices": record["cuda_visible_devices"],
                                "root": str(self._dirs(record["name"]).root)})

    def _allocate(self, count: int, name: str) -> list[str]:
        """Exclusive GPUs for a pod; synchronous, so two concurrent creates never get the same one."""
        if count <= 0:
            return []
        used = {key for record in self._records.values() for key in record["gpus"]}
        free = [key for key in self._gpus if key not in used]
        if len(free) < count:
            raise BackendError(f"pod {name} needs {count} GPU(s), {len(free)} free of {len(self._gpus)}")
        return free[:count]

    # -- create ---------------------------------------------------------------------------------

    async def create(self, request: PodRequest) -> PodInfo:
        name = request.name
        if not NAME.match(name):
            raise BackendError(f"pod name {name!r} must match {NAME.pattern}")
        if name in self._records or self._dirs(name).root.exists():
            raise BackendError(f"pod {name} already exists")
        try:
            binds = parse_binds(request.pool.template.get("binds"))
            network = parse_network(request.pool.template.get("network"))
        except ValueError as exc:
            raise BackendError(f"pool {request.pool.name}: {exc}") from exc
        for bind in binds:
            if uses([bind.src], str(self.state_dir)) is not None:
                raise BackendError(f"pool {request.pool.name}: bind {bind.src} would expose the broker's state")
        keys = self._allocate(request.pool.gpus, name)
        chosen = [self._gpus[k] for k in keys]
        real = all(not g.virtual for g in chosen)
        # Real GPUs are named by UUID: only their device nodes exist in the sandbox, so indices would shift.
        cuda = ",".join(g.device.key if real else str(g.device.index) for g in chosen)
        record: dict[str, Any] = {
            "name": name, "pool": request.pool.name, "template": request.pool.template_hash,
            "created_at": self.clock.now(), "isolated": self.isolated, "mode": self.mode,
            "uid": self.uid if self.isolated and self.uid is not None else os.geteuid(),
            "gpus": keys, "cuda_visible_devices": cuda, "annotations": dict(request.annotations),
            "origin": str(request.origin), "secret": secrets.token_urlsafe(32),
        }
        self._records[name] = record  # devices are taken from here on
        self._starting.add(name)
        spec = SandboxSpec(name=name, dirs=self._dirs(name), python=self.python, prefixes=self.prefixes,
                           agent_dir=self.agent_dir, cuda_visible_devices=cuda, binds=binds, uid=self.uid,
                           network=network,
                           gpu_nodes=tuple(f"/dev/nvidia{g.minor}" for g in chosen if g.minor is not None))
        delay = float(request.pool.template.get("start_delay_s", 0.0) or 0.0)
        starting = asyncio.ensure_future(self._start(spec, record))
        sleeping = asyncio.ensure_future(self.clock.sleep(delay)) if delay > 0 else None
        try:
            await asyncio.gather(starting, *([sleeping] if sleeping else []))
        except BaseException as exc:
            for task in (starting, sleeping):
                if task is not None and not task.done():
                    task.cancel()
            await asyncio.shield(self._destroy(name))
            if isinstance(exc, BackendError) or not isinstance(exc, Exception):
                raise
            raise BackendError(f"creating pod {name} failed: {exc!r}") from exc
        finally:
            self._starting.discard(name)
        return self._info(record)

    async def _start(self, spec: SandboxSpec, record: dict[str, Any]) -> None:
        began = time.perf_counter()
        dirs = spec.dirs
        dirs.root.mkdir(mode=0o700)
        for path in (dirs.workspace, dirs.pkg, dirs.run, *([] if self.isolated else [dirs.tmp])):
            path.mkdir(mode=0o700)
            if self.isolated and self.uid is not None:
                os.chown(path, self.uid, self.uid)
        argv = bwrap_argv(self.bwrap or "bwrap", spec) if self.isolated else fallback_argv(spec)
        self._write(record)  # from here on a restarted broker finds (and can clean up) this pod
        pid, info_fd = self._spawn(argv, record["secret"], spec)
        record["launcher_pid"] = pid
        record["launcher_start"] = _starttime(pid)
        self._write(record)
        if info_fd is not None:
            record["agent_pid"] = await self._read_agent_pid(info_fd, pid)
        else:
            record["agent_pid"] = pid
        record["agent_start"] = _starttime(record["agent_pid"])
        self._write(record)
        await self._wait_healthy(spec.name, pid)
        log.info("pod %s up in %.0f ms (%s, GPUs %s)", spec.name, (time.perf_counter() - began) * 1000, self.mode,
                 record["cuda_visible_devices"] or "none")

    def _spawn(self, argv: list[str], secret: str, spec: SandboxSpec) -> tuple[int, int | None]:
        """Start the pod's process tree in its own session; the secret travels through a pipe only."""
        secret_r, secret_w = os.pipe()
        os.write(secret_w, secret.encode())
        os.close(secret_w)
        info_r, info_w = os.pipe() if self.isolated else (None, None)
        log_fd = os.open(spec.dirs.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        extra: list[int] = []
        try:
            # dup2 onto fixed numbers clears close-on-exec in the child only, so no other child of the
            # broker can inherit the pipes; a source already on a target number is moved away first.
            secret_src = _off(secret_r, (SECRET_FD, INFO_FD), extra)
            actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                       (os.POSIX_SPAWN_DUP2, log_fd, 1), (os.POSIX_SPAWN_DUP2, log_fd, 2),
                       (os.POSIX_SPAWN_DUP2, secret_src, SECRET_FD)]
            if info_w is not None:
                actions.append((os.POSIX_SPAWN_DUP2, _off(info_w, (SECRET_FD, INFO_FD), extra), INFO_FD))
            env = agent_env(spec, isolated=False) if not self.isolated else {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
            try:
                pid = os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True,
                                     setsigdef=(signal.SIGPIPE, signal.SIGXFSZ), setsigmask=())
            except OSError as exc:
                raise BackendError(f"cannot start pod {spec.name}: {exc}") from exc
            self._children.add(pid)
            return pid, info_r
        finally:
            for fd in (secret_r, info_w, log_fd, *extra):
                if fd is not None:
                    os.close(fd)

    async def _read_agent_pid(self, info_fd: int, launcher: int) -> int:
        """bwrap reports the sandbox's PID 1 as the host sees it: the pid that tears the sandbox down."""
        os.set_blocking(info_fd, False)
        data = b""
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                try:
                    chunk = os.read(info_fd, 4096)
                except BlockingIOError:
                    chunk = None
                if chunk:
                    data += chunk
                    with contextlib.suppress(ValueError):
                        return int(json.loads(data)["child-pid"])
                elif chunk == b"" or not self._launcher_alive(launcher) or time.monotonic() > deadline:
                    raise BackendError(f"bwrap did not start the sandbox: {self._log_tail(launcher)}")
                await asyncio.sleep(0.001)
        finally:
            os.close(info_fd)

    def _launcher_alive(self, pid: int) -> bool:
        if pid in self._children:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done == pid:
                self._children.discard(pid)
                return False
        return True

    def _log_tail(self, pid: int) -> str:
        for name, record in self._records.items():
            if record.get("launcher_pid") == pid:
                with contextlib.suppress(OSError):
                    return self._dirs(name).log.read_text(errors="replace")[-600:].strip() or "(no output)"
        return "(no output)"

    async def _wait_healthy(self, name: str, launcher: int) -> None:
        client = self.agent(name)
        deadline = time.monotonic() + START_TIMEOUT_S
        pause = 0.002
        while True:
            try:
                await client.health()
                return
            except AgentError as exc:
                if not self._launcher_alive(launcher):
                    raise BackendError(f"pod {name} exited while starting: {self._log_tail(launcher)}") from exc
                if time.monotonic() > deadline:
                    raise BackendError(f"pod {name}'s agent did not answer within {START_TIMEOUT_S:.0f} s") from exc
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 0.05)

    # -- delete ---------------------------------------------------------------------------------

    async def delete(self, name: str) -> None:
        if name in self._records or self._dirs(name).root.exists():
            await self._destroy(name)

    async def _destroy(self, name: str) -> None:
        """Kill the pod's processes, wait until they are gone, remove its directory, free its GPUs."""
        record = self._records.get(name) or self._read(self._dirs(name).record) or {"name": name}
        client = self._clients.pop(name, None)
        if client is not None:
            await client.close()
        fd = self._dir_fds.pop(name, None)
        if fd is not None:
            os.close(fd)
        await self._kill(record)
        await asyncio.to_thread(_remove_tree, self._dirs(name).root)
        self._records.pop(name, None)

    async def _kill(self, record: Mapping[str, Any]) -> None:
        agent = _same_process(record.get("agent_pid"), record.get("agent_start"))
        launcher = _same_process(record.get("launcher_pid"), record.get("launcher_start"))
        if agent is None and launcher is not None and record.get("mode") == "bwrap":
            # The broker died before it learnt the sandbox's pid: it is the launcher's child.
            for proc in proctree.descendants(launcher):
                _signal(proc.pid, signal.SIGKILL)
        if record.get("mode") == "none" and agent is not None:
            # Unisolated, the agent's jobs would outlive it: freeze it, kill its tree, then it.
            _signal(agent, signal.SIGSTOP)
            for _ in range(100):
                tree = [p for p in proctree.descendants(agent) if p.alive]
                if not tree:
                    break
                for proc in tree:
                    _signal(proc.pid, signal.SIGKILL)
        # SIGKILL to a PID namespace's init takes every process in the namespace with it.
        for pid in (agent, launcher):
            if pid is not None:
                _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_TIMEOUT_S
        for pid, start in ((agent, record.get("agent_start")), (launcher, record.get("launcher_start"))):
            while pid is not None and time.monotonic() < deadline:
                if pid in self._children and not self._launcher_alive(pid):
                    break
                if _same_process(pid, start) is None:
                    break
                await asyncio.sleep(0.005)
        if time.monotonic() >= deadline:
            log.error("pod %s: processes still alive %.0f s after SIGKILL", record["name"], KILL_TIMEOUT_S)

    # -- list, annotate, agents -----------------------------------------------------------------

    async def list_pods(self) -> list[PodInfo]:
        for path in self.pods_dir.glob("*/pod.json"):
            record = self._read(path)
            if record is not None and record["name"] not in self._records:
                self._records[record["name"]] = record
        names = [n for n in self._records if n not in self._starting]
        healthy = await asyncio.gather(*(self._healthy(n) for n in names))
        live = []
        for name, ok in zip(names, healthy, strict=True):
            record = self._records.get(name)
            if record is None:
                continue
            if ok:
                live.append(self._info(record))
            elif not self._alive(record):
                log.warning("pod %s is gone; dropping its record", name)
                await self._destroy(name)
            else:
                log.warning("pod %s is alive but its agent does not answer; deleting it", name)
                await self._destroy(name)
        return live

    def _alive(self, record: Mapping[str, Any]) -> bool:
        pid = _same_process(record.get("agent_pid"), record.get("agent_start"))
        launcher = record.get("launcher_pid")
        if launcher in self._children:
            self._launcher_alive(launcher)  # reap it if it exited
        return pid is not None

    async def _healthy(self, name: str) -> bool:
        record = self._records.get(name)
        if record is None or not self._alive(record):
            return False
        for _ in range(2):  # one retry: deleting a pod over one lost reply would be costly
            try:
                await asyncio.wait_for(self.agent(name).health(), HEALTH_TIMEOUT_S)
                return True
            except (AgentError, BackendError, TimeoutError):
                continue
        return False

    async def annotate(self, name: str, annotations: Mapping[str, str]) -> None:
        record = self._records.get(name)
        if record is None:
            raise BackendError(f"pod {name} is gone")
        record["annotations"] = {**record["annotations"], **annotations}
        self._write(record)

    def agent(self, name: str) -> HttpAgentClient:
        client = self._clients.get(name)
        if client is not None:
            return client
        record = self._records.get(name)
        if record is None or "secret" not in record:
            raise BackendError(f"pod {name} is gone")
        socket_path = str(self._dirs(name).socket)
        dial = socket_path
        if len(socket_path.encode()) > 100:
            # sun_path holds ~107 bytes; dial through an fd of the run directory instead.
            fd = self._dir_fds.get(name)
            if fd is None:
                fd = self._dir_fds[name] = os.open(self._dirs(name).run, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            dial = f"/proc/self/fd/{fd}/agent.sock"
        client = HttpAgentClient(f"unix:{socket_path}", record["secret"], pod=name, uds_path=dial)
        self._clients[name] = client
        return client

    async def close(self) -> None:
        """Close agent connections; pods keep running for the next broker."""
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()
        fds, self._dir_fds = self._dir_fds, {}
        for fd in fds.values():
            os.close(fd)


def _off(fd: int, taken: tuple[int, ...], extra: list[int]) -> int:
    while fd in taken:
        fd = os.dup(fd)
        extra.append(fd)
    return fd


def _starttime(pid: int | None) -> int | None:
    proc = proctree.read_proc(pid) if pid else None
    return proc.starttime if proc is not None else None


def _same_process(pid: int | None, start: int | None) -> int | None:
    """`pid` when it still names the process that had it at `start` and has not exited; else None."""
    if not pid:
        return None
    proc = proctree.read_proc(pid)
    if proc is None or not proc.alive or (start is not None and proc.starttime != start):
        return None
    return pid


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _remove_tree(root: Path) -> None:
    """Remove a pod directory even when a job left read-only or unreadable directories in it."""

    def unlock(function: Any, path: str, _exc_info: Any) -> None:
        parent = os.path.dirname(path)
        with contextlib.suppress(OSError):
            os.chmod(parent, stat.S_IRWXU)
        if os.path.isdir(path) and not os.path.islink(path):
            with contextlib.suppress(OSError):
                os.chmod(path, stat.S_IRWXU)
            shutil.rmtree(path, onerror=unlock)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    try:
        shutil.rmtree(root, onerror=unlock)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.error("could not remove %s: %s", root, exc)
