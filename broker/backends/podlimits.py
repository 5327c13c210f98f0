"""Applying a pool's limits to one local pod: its capped disk and cgroup before start, their removal after.

`PodLimiter` is built once per backend (it detects the host's cgroups and loop-mount support and says
loudly what is off), then `apply` runs before a pod's sandbox starts and `release` after its
processes are gone. The pod joins its cgroup through a shell that writes its own pid to the
cgroup's `cgroup.procs` files and then execs bwrap: nothing of the pod ever runs outside it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from broker.backends import cgroups
from broker.backends.limits import host_memory
from broker.backends.sandboxing import PodDirs, SandboxSpec
from broker.backends.volumes import disk_capping, make_disk, unmount_disk
from broker.podtemplate import Limits

log = logging.getLogger(__name__)

JOIN_SCRIPT = 'for f do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done; shift; exec "$@"'
"""sh -c JOIN_SCRIPT firepool-join PROCS... -- ARGV: join every cgroup named, then become ARGV."""
SHOWN = ("memory", "pids", "unified")
"""Controllers whose counters the agent reads (OOM kills, refused forks)."""


class PodLimiter:
    def __init__(self, state_dir: Path, host: cgroups.CgroupHost | None = None) -> None:
        self.state_dir = state_dir
        self.cgroups = host if host is not None else cgroups.detect()
        self.disk_off = disk_capping()
        total = host_memory()
        self.default_memory = total // 2 if total is not None else None
        """A pod's memory cap when its template names none: one pod never takes the host's RAM."""
        if self.cgroups.enabled:
            log.info("pod limits: %s", self.cgroups.reason)
        else:
            log.warning("pods run WITHOUT memory, pids and CPU limits: %s", self.cgroups.reason)
        if self.disk_off:
            log.warning("pod disks are NOT capped (workspace_size is ignored): %s", self.disk_off)

    @property
    def info(self) -> dict[str, Any]:
        """How pod limits are enforced on this host (for health views)."""
        return {**self.cgroups.describe(), "disk": "ext4 image" if self.disk_off is None else "off",
                "disk_reason": self.disk_off or ""}

    def cgroup_for(self, pod: str) -> str:
        """The name of the pod's cgroup (made by `apply`), or "off" without cgroup limits on this host."""
        return cgroups.cgroup_name(pod, self.state_dir) if self.cgroups.enabled else "off"

    def apply(self, spec: SandboxSpec, record: dict[str, Any], limits: Limits,
              uid: int | None) -> tuple[SandboxSpec, list[str]]:
        """Make the pod's disk and cgroup (OSError when that fails); returns the spec that shows the cgroup
        to the agent and the command prefix that starts the pod inside it. Notes both in `record`."""
        began = time.perf_counter()
        make_disk(spec.dirs, None if self.disk_off else limits.workspace_size, uid, self.state_dir / "disks")
        name = self.cgroup_for(spec.name)
        cgroup = cgroups.create(self.cgroups, name, limits)
        record["limits"] = {**dataclasses.asdict(limits), "cgroup": name if cgroup is not None else "off"}
        if cgroup is not None:  # the exact directories: a later broker may run in another cgroup
            record["cgroup_dirs"] = {c: str(d) for c, d in cgroup.dirs.items()}
        record["limits_ms"] = round((time.perf_counter() - began) * 1000, 1)
        if cgroup is None:
            return spec, []
        shown = tuple((c, str(d)) for c, d in cgroup.dirs.items() if c in SHOWN)
        return (dataclasses.replace(spec, limit_dirs=shown),
                ["/bin/sh", "-c", JOIN_SCRIPT, "firepool-join", *map(str, cgroup.procs_files), "--"])

    def release(self, dirs: PodDirs, record: Mapping[str, Any]) -> None:
        """Unmount the pod's disk and remove its cgroup (its processes are gone by now); logs what stays."""
        cgroup = cgroups.from_record(self.cgroups, record)
        stray = cgroups.kill_members(cgroup) if cgroup is not None else 0
        if stray:
            log.warning("pod %s: %d process(es) outside its known tree killed through its cgroup", dirs.root.name,
                        stray)
        try:
            unmount_disk(dirs)
        except OSError as exc:
            log.error("pod %s: %s", dirs.root.name, exc)
        if cgroup is not None and not cgroups.remove(cgroup):
            log.error("pod %s: cgroup %s not removed", dirs.root.name, sorted(map(str, cgroup.dirs.values())))
