"""Per-pod cgroups: which hierarchy this host has, a pod's cgroup directories, its limits and its removal.

cgroup v2 (one unified tree): pods live under a `firepool` subtree with memory, pids and cpu enabled in
its `cgroup.subtree_control`; cgroup v1: one `firepool` directory per controller (memory, pids, cpu).
The subtree goes under the broker's own cgroup when that is writable (a delegated slice), or beside
it (v2), else under the hierarchy's root. A host with neither gets `CgroupHost.off`: pods start without limits, loudly.
Paths and values are plain functions of a root directory, so tests lay out a fake /sys/fs/cgroup.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.podtemplate import Limits

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
SUBTREE = "firepool"
V1_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
REMOVE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class CgroupHost:
    """Where this broker's pod cgroups go: version 2, 1, or 0 (limits off, `reason` says why)."""

    version: int
    bases: dict[str, Path] = field(default_factory=dict)
    """v2: {"unified": subtree}; v1: {controller: subtree} for each writable controller."""
    reason: str = ""

    @property
    def enabled(self) -> bool:
        return self.version in (1, 2) and bool(self.bases)

    def describe(self) -> dict[str, object]:
        """What /healthz-style backend info shows about resource limits."""
        return {"cgroup": f"v{self.version}" if self.enabled else "off",
                "controllers": sorted(self.bases) if self.version == 1 else ["cpu", "memory", "pids"]
                if self.enabled else [], "reason": self.reason}


def own_paths(proc_self_cgroup: str) -> dict[str, str]:
    """The broker's cgroup per controller ("unified" for v2) from the text of /proc/self/cgroup."""
    found: dict[str, str] = {}
    for line in proc_self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            found["unified"] = path
        for name in controllers.split(","):
            if name:
                found[name] = path
    return found


def _writable_subtree(candidates: list[Path]) -> Path | None:
    for base in candidates:
        try:
            base.mkdir(exist_ok=True)
        except OSError:
            continue
        if os.access(base / "cgroup.procs", os.W_OK) or os.access(base, os.W_OK):
            return base
    return None


def _v1_mount(root: Path, controller: str) -> Path | None:
    """The v1 mount of `controller` (it may be shared, e.g. `cpu,cpuacct`)."""
    direct = root / controller
    if (direct / "cgroup.procs").exists():
        return direct
    with contextlib.suppress(OSError):
        for entry in sorted(root.iterdir()):
            if controller in entry.name.split(",") and (entry / "cgroup.procs").exists():
                return entry
    return None


def _enable_v2(base: Path) -> bool:
    """Turn on memory, pids and cpu for the pods under `base` (and in its parent, for `base` itself)."""
    for directory in (base.parent, base):
        try:
            (directory / "cgroup.subtree_control").write_text("+memory +pids +cpu")
        except OSError as exc:
            log.debug("cannot enable controllers in %s: %s", directory, exc)
            return False
    return True


def detect(root: Path = CGROUP_ROOT, proc_self_cgroup: str | None = None) -> CgroupHost:
    """Find a writable cgroup hierarchy for pods; never raises (limits then are off)."""
    if proc_self_cgroup is None:
        try:
            proc_self_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            proc_self_cgroup = ""
    own = own_paths(proc_self_cgroup)
    if (root / "cgroup.controllers").exists():
        here = root / own.get("unified", "/").lstrip("/")
        # Under the broker's own cgroup, else beside it (v2 forbids controllers in a cgroup with processes:
        # a delegated service runs the broker in a leaf such as `firepool.service/broker`), else the root.
        beside = [here.parent / SUBTREE] if here != root else []
        for candidate in dict.fromkeys([here / SUBTREE, *beside, root / SUBTREE]):
            base = _writable_subtree([candidate])
            if base is not None and _enable_v2(base):
                return CgroupHost(2, {"unified": base}, f"cgroup v2 at {base}")
            if base is not None:
                with contextlib.suppress(OSError):
                    base.rmdir()  # no pods can go there: leave nothing behind
        return CgroupHost(0, {}, f"cgroup v2 at {root} is not writable here (needs a delegated subtree)")
    bases: dict[str, Path] = {}
    for controller in V1_CONTROLLERS:
        mount = _v1_mount(root, controller)
        if mount is None:
            continue
        here = mount / own.get(controller, "/").lstrip("/")
        base = _writable_subtree(list(dict.fromkeys([here / SUBTREE, mount / SUBTREE])))
        if base is not None:
            bases[controller] = base
    if "memory" in bases and "pids" in bases:
        return CgroupHost(1, bases, f"cgroup v1 ({', '.join(sorted(bases))}) under {bases['memory'].parent}")
    return CgroupHost(0, {}, f"no writable cgroup v2 or v1 memory+pids hierarchy under {root}")


def cgroup_name(pod: str, state_dir: Path) -> str:
    """A pod's cgroup name: two brokers (two state dirs) on one host never share one."""
    return f"{pod}.{hashlib.sha256(str(state_dir).encode()).hexdigest()[:8]}"


def settings(limits: Limits, version: int) -> list[tuple[str, str, str]]:
    """(controller, file, value) to write, in order; v1 sets memory before memory+swap (memsw >= memory)."""
    out: list[tuple[str, str, str]] = []
    if version == 2:
        if limits.memory is not None:
            out += [("unified", "memory.max", str(limits.memory)), ("unified", "memory.swap.max", "0")]
        if limits.pids is not None:
            out.append(("unified", "pids.max", str(limits.pids)))
        if limits.cpus is not None:
            out.append(("unified", "cpu.max", f"{round(limits.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}"))
        return out
    if limits.memory is not None:
        out += [("memory", "memory.limit_in_bytes", str(limits.memory)),
                ("memory", "memory.memsw.limit_in_bytes", str(limits.memory))]
    if limits.pids is not None:
        out.append(("pids", "pids.max", str(limits.pids)))
    if limits.cpus is not None:
        out += [("cpu", "cpu.cfs_period_us", str(CPU_PERIOD_US)),
                ("cpu", "cpu.cfs_quota_us", str(round(limits.cpus * CPU_PERIOD_US)))]
    return out


@dataclass(frozen=True)
class PodCgroup:
    """One pod's cgroup directories (one per v1 controller, or the one v2 directory)."""

    dirs: dict[str, Path]

    @property
    def procs_files(self) -> list[Path]:
        """The `cgroup.procs` files a process writes its pid to, to join the pod's cgroup(s)."""
        return [d / "cgroup.procs" for d in self.dirs.values()]

    def join(self, pid: int) -> None:
        for procs in self.procs_files:
            procs.write_text(str(pid))


def create(host: CgroupHost, name: str, limits: Limits) -> PodCgroup | None:
    """Make the pod's cgroup(s) and write its limits; None when limits are off."""
    if not host.enabled:
        return None
    dirs = {controller: base / name for controller, base in host.bases.items()}
    for directory in dirs.values():
        directory.mkdir(exist_ok=True)
    cgroup = PodCgroup(dirs)
    try:
        for controller, filename, value in settings(limits, host.version):
            target = dirs.get(controller)
            if target is None:
                continue
            if controller == "memory" and filename.startswith("memory.memsw") and not (target / filename).exists():
                continue  # no swap accounting on this kernel: memory.limit_in_bytes alone bounds RAM
            (target / filename).write_text(value)
    except OSError:
        remove(cgroup, timeout_s=0.0)
        raise
    return cgroup


def kill_members(cgroup: PodCgroup, timeout_s: float = REMOVE_TIMEOUT_S) -> int:
    """SIGKILL every process still in the pod's cgroup(s) until none is left (or `timeout_s` passed); returns
    how many were found. A backstop at deletion: a sandbox's process the pod's known pids missed (bwrap forked
    it while the broker stopped that very start) is still in the pod's cgroup, and would outlive the pod."""
    found: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while True:
        members: set[int] = set()
        for procs in cgroup.procs_files:
            with contextlib.suppress(OSError, ValueError):
                members.update(int(line) for line in procs.read_text().split())
        if not members or time.monotonic() >= deadline:
            return len(found)
        found |= members
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def remove(cgroup: PodCgroup, timeout_s: float = REMOVE_TIMEOUT_S) -> bool:
    """rmdir the pod's cgroup(s); waits while exiting processes still hold them (EBUSY). True when gone."""
    deadline = time.monotonic() + timeout_s
    pending = list(cgroup.dirs.values())
    while pending:
        left = []
        for directory in pending:
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    log.warning("cannot remove cgroup %s: %s", directory, exc)
                    return False
                left.append(directory)
        pending = left
        if pending:
            if time.monotonic() >= deadline:
                log.warning("cgroup(s) %s still busy after %.1f s", [str(p) for p in pending], timeout_s)
                return False
            time.sleep(0.01)
    return True


def from_record(host: CgroupHost, record: Mapping[str, Any]) -> PodCgroup | None:
    """The cgroup a pod's record names: its `cgroup_dirs`, else its name laid out on this host."""
    dirs = record.get("cgroup_dirs")
    if isinstance(dirs, Mapping) and dirs:
        return PodCgroup({str(c): Path(str(d)) for c, d in dirs.items()})
    limits = record.get("limits")
    name = limits.get("cgroup", "off") if isinstance(limits, Mapping) else "off"
    if not host.enabled or not isinstance(name, str) or name == "off":
        return None
    return PodCgroup({controller: base / name for controller, base in host.bases.items()})


def counter(text: str, key: str) -> int:
    """The value of `key` in a flat-keyed cgroup file (memory.events, memory.oom_control, pids.events)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0
