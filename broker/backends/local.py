"""`LocalBackend`: pods as bubblewrap sandboxes on this machine, each with the pod agent as PID 1.

A pod lives in `state_dir/pods/<name>/`: `pod.json` (0600: the agent's secret, GPUs, annotations and
`pid`, the agent's host pid, whose SIGKILL ends the whole pod; never visible in any sandbox), the agent's log, and the workspace, package and run
directories bound into the sandbox. Pods survive a broker restart: a new instance over the same
state directory finds them through their records, and `list_pods` drops the records of dead ones.
GPUs are bound exclusively. Without working bubblewrap the backend refuses to start; pods run
unisolated only when asked (`sandbox="none"`, `firepool serve --unisolated`), and say so.

Starting a pod is `localstart`, its caller's kept caches `localkept`. Each pod gets the limits of its pool's template (limits.py): a cgroup (cgroups.py) that bwrap joins
before it execs, so the agent and every job start inside it; sized /tmp and /dev/shm; and a capped
disk (volumes.py). A host without writable cgroups or loop mounts runs pods without those limits and
says so in the log and in `limits_info`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from broker.backends import networking
from broker.backends.hostgpus import HostGpus
from broker.backends.localkept import KeptCacheAgent, KeptCaches
from broker.backends.localstart import PodStarting
from broker.backends.podlimits import PodLimiter
from broker.backends.podnets import NETWORK_POLICY, PodNetworks, stale_template
from broker.backends.podprocs import PodProcesses, remove_tree, same_process
from broker.backends.sandboxing import (
    PodDirs,
    SandboxSpec,
    agent_package_dir,
    exposed_sources,
    probe_bwrap,
    python_of,
    python_prefixes,
    uses,
)
from broker.backends.startdelay import VenueDelays
from broker.backends.volumes import tree_bytes, volume_binds
from broker.clock import Clock
from broker.errors import AgentError, BackendError
from broker.fencing import Term
from broker.fleet.nodes import Node
from broker.health.gpuhealth import GpuHealth
from broker.podtemplate import parse_binds, parse_limits, parse_network
from broker.pools import PoolSpec
from broker.ports.backend import Device, PodInfo, PodRequest
from broker.running.agent_http import HttpAgentClient
from broker.running.topology import Rendezvous

log = logging.getLogger(__name__)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
HEALTH_TIMEOUT_S = 3.0
KILL_TIMEOUT_S = 10.0
_warned_unisolated = False


def agent_kernels(pool: PoolSpec) -> str:
    """The agent's `--kernels` mode for a pool: `auto` is `learned` (the broker tells it; broker.running.kernelwarm)."""
    return "learned" if pool.kernels == "auto" else pool.kernels


class LocalBackend(PodStarting, KeptCaches):
    kind = "local"

    def __init__(self, state_dir: Path, clock: Clock, *, virtual_gpus: int | None = None, sandbox: str = "auto",
                 python_prefix: str = sys.prefix, sandbox_uid: int | None = None,
                 gpus_per_node: int | None = None, term: Term | None = None,
                 orphan_after_s: float | None = None) -> None:
        """`term`: the broker's (`broker.fencing`), named by every request to a pod's agent. `orphan_after_s`: how
        long a pod's agent lives on with no broker speaking to it (None: the agent's default, 300 s; 0: for ever)."""
        if sandbox not in ("auto", "bwrap", "none"):  # auto is bwrap: nothing falls back to unisolated silently
            raise ValueError(f"sandbox must be auto, bwrap or none, got {sandbox!r}")
        self.state_dir = Path(state_dir).resolve()
        self.term = term
        self.orphan_after_s = orphan_after_s
        self.clock = clock
        self.pods_dir = self.state_dir / "pods"
        self.pods_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.ledger_dir = self.state_dir / "ledger"
        """Each pod's record of the attempts it started (`firepool_agent.ledger`); kept after the pod."""
        self.ledger_dir.mkdir(exist_ok=True, mode=0o700)
        self.python = python_of(python_prefix)
        self.prefixes = python_prefixes(python_prefix)
        self.agent_dir = agent_package_dir()
        self.uid = (sandbox_uid if sandbox_uid is not None else 65534) if os.geteuid() == 0 else None
        self.gpus = HostGpus(virtual_gpus, gpus_per_node)
        self.bwrap = shutil.which("bwrap")
        self.mode = self._choose_mode(sandbox)
        self.limiter = PodLimiter(self.state_dir)
        self._records: dict[str, dict[str, Any]] = {}
        self.nets = PodNetworks(self._records, self._write, isolated=self.isolated, root=self.uid is not None)
        self._starting: set[str] = set()
        self._creates: dict[str, asyncio.Task[Any]] = {}
        """The create in flight of each starting pod: `close` ends those still running."""
        self._abandoned: dict[str, asyncio.Future[None]] = {}
        """The destruction of each half-made pod whose create failed or was cancelled (a broker stopping)."""
        self.venue_delays = VenueDelays()
        """A pool's `template.venue_delay`: a modelled cold start added to each real start (startdelay.py)."""
        self._clients: dict[str, HttpAgentClient] = {}
        self._dir_fds: dict[str, int] = {}
        self.procs = PodProcesses()
        self.reread()

    async def stand_by(self) -> None:
        """A standby broker's view of the state dir's pods, kept warm for the moment it leads (docs/ha.md): the
        records re-read, the clients of pods that are gone closed, and one connection open to each agent (a
        health read, under term 0 while standing by: it changes nothing and is no broker's contact)."""
        self.reread()
        for name in [n for n in self._clients if n not in self._records]:
            await self._clients.pop(name).close()
            fd = self._dir_fds.pop(name, None)
            if fd is not None:
                os.close(fd)

        async def touch(name: str) -> None:
            try:
                await asyncio.wait_for(self.agent(name).health(), HEALTH_TIMEOUT_S)
            except (AgentError, BackendError, TimeoutError):
                pass  # starting, ending, or not ours to judge: the leader decides about pods

        await asyncio.gather(*(touch(n) for n in list(self._records)))

    def reread(self) -> None:
        """Load the pod records of the state dir: at start, and again when this broker takes the lead from
        another broker of the same state dir (docs/ha.md), whose pods it then adopts."""
        self._records.clear()
        for path in sorted(self.pods_dir.glob("*/pod.json")):
            record = self._read(path)
            if record is not None:
                self._records[record["name"]] = record

    # -- setup ----------------------------------------------------------------------------------

    def _choose_mode(self, sandbox: str) -> str:
        """`bwrap` when a sandbox starts here; BackendError when it does not, unless `none` (--unisolated) was asked."""
        global _warned_unisolated
        if sandbox != "none":
            why = probe_bwrap(self.bwrap, self.uid)
            if why is not None:
                raise BackendError(f"bubblewrap sandboxes do not work here ({why}): install bubblewrap "
                                   "(apt-get install bubblewrap), or run jobs without isolation with --unisolated")
            exposed = uses(exposed_sources(self._spec_template()), str(self.state_dir))
            if exposed is not None:
                raise BackendError(f"the state directory {self.state_dir} would be visible inside every sandbox "
                                   f"(through {exposed}); choose one outside it")
            return "bwrap"
        if not _warned_unisolated:
            _warned_unisolated = True
            log.warning("UNISOLATED (--unisolated): local pods are plain processes; jobs share this host's "
                        "processes, network, files and /dev/shm, run as uid %d and can read the broker's state "
                        "directory", os.geteuid())
        return "none"

    @property
    def limits_info(self) -> dict[str, Any]:
        """How pod limits are enforced on this host (for health views)."""
        return self.limiter.info

    def check_networks(self, pools: Mapping[str, PoolSpec]) -> None:
        """At start: warn for each `host` pool; BackendError for a bad `network`, a missing stack (podnets), or
        a bwrap that cannot make network namespaces here while pools need them."""
        self.nets.check_catalog(pools)
        own = sorted(n for n, p in pools.items() if parse_network(p.template.get("network")) != "host")
        if own and self.isolated:
            why = probe_bwrap(self.bwrap, self.uid, own_network=True)
            if why is not None:
                raise BackendError(f"pools {', '.join(own)} need network namespaces, which bubblewrap cannot make "
                                   f"here ({why}); give them network: host")

    def _spec_template(self) -> SandboxSpec:
        return SandboxSpec(name="probe", dirs=PodDirs(self.pods_dir / "probe"), python=self.python,
                           prefixes=self.prefixes, agent_dir=self.agent_dir, cuda_visible_devices="")

    @property
    def isolated(self) -> bool:
        """True when pods are bubblewrap sandboxes; False when run --unisolated."""
        return self.mode == "bwrap"

    def devices(self) -> list[Device]:
        return self.gpus.devices()

    def nodes(self) -> list[Node]:
        """Virtual nodes (`--virtual-nodes`) split this host's GPUs; real GPUs make one node, this host."""
        return list(self.gpus.nodes)

    async def gpu_health(self, keys: Sequence[str]) -> dict[str, GpuHealth]:
        """NVML's health of these real GPUs (broker.health.gpuhealth); virtual ones are left out."""
        return await self.gpus.health(keys)

    # -- records --------------------------------------------------------------------------------

    def _dirs(self, name: str) -> PodDirs:
        return PodDirs(self.pods_dir / name)

    def workspace_bytes(self, name: str, max_entries: int = 100_000) -> int | None:
        """Bytes of the files in a pod's workspace (the dashboard's Sessions page); None without one.

        Blocking (a directory walk, at most `max_entries` entries, links not followed): call it on a thread.
        """
        return tree_bytes(self._dirs(name).workspace, max_entries)

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
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(record).encode())  # one write: json.dump writes a chunk per token
        os.replace(temp, target)

    def _info(self, record: Mapping[str, Any]) -> PodInfo:
        return PodInfo(name=record["name"], pool=record["pool"], gpus=tuple(record["gpus"]),
                       template=stale_template(record), created_at=record["created_at"], isolated=record["isolated"],
                       annotations=dict(record["annotations"]), endpoint=f"unix:{self._dirs(record['name']).socket}",
                       details={"mode": record["mode"], "network": record.get("network", "host"),
                                "uid": record["uid"], "agent_pid": record.get("pid"),
                                "cuda_visible_devices": record["cuda_visible_devices"],
                                "incarnation": record.get("incarnation"),
                                "root": str(self._dirs(record["name"]).root),
                                "limits": record.get("limits", {}),
                                "venue_delay_s": record.get("venue_delay_s", 0.0)},
                       node=record.get("node") or self.gpus.node(record["gpus"]))

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
            volumes = volume_binds(self.state_dir, request.pool, self._dirs(name), binds)
            limits = parse_limits(request.pool.template, request.pool.cpus, self.limiter.default_memory)
            # every pod starting now, this one included, contends for the node (paper Table 1: 8 at once)
            modelled = self.venue_delays.draw(request.pool.name, request.pool.template, len(self._starting) + 1)
        except ValueError as exc:
            raise BackendError(f"pool {request.pool.name}: {exc}") from exc
        for bind in binds:
            if uses([bind.src], str(self.state_dir)) is not None:
                raise BackendError(f"pool {request.pool.name}: bind {bind.src} would expose the broker's state")
        records = self._records.values()
        keys = self.gpus.pin(records, request.gpus, request.pool.name, name) if request.gpus else \
            self.gpus.allocate(records, request.pool.gpus, name, request.node, request.avoid)
        chosen = [self.gpus.gpus[k] for k in keys]
        real = all(not g.virtual for g in chosen)
        # Real GPUs are named by UUID: only their device nodes exist in the sandbox, so indices would shift.
        cuda = ",".join(g.device.key if real else str(g.device.index) for g in chosen)
        record: dict[str, Any] = {
            "name": name, "pool": request.pool.name, "template": request.pool.template_hash,
            "created_at": self.clock.now(), "isolated": self.isolated, "mode": self.mode,
            "uid": self.uid if self.isolated and self.uid is not None else os.geteuid(),
            "gpus": keys, "cuda_visible_devices": cuda, "annotations": dict(request.annotations),
            "origin": str(request.origin), "secret": secrets.token_urlsafe(32),
            "network": network if self.isolated else "host",
            "kernels": agent_kernels(request.pool), "network_policy": NETWORK_POLICY,
            "limits": {"cgroup": "off"}, "venue_delay_s": modelled,
            "node": self.gpus.node(keys),
            "keeps": bool(request.pool.keep_paths),
        }
        self._records[name] = record  # devices are taken from here on
        self._starting.add(name)
        current = asyncio.current_task()
        if current is not None:
            self._creates[name] = current
        spec = SandboxSpec(name=name, dirs=self._dirs(name), python=self.python, prefixes=self.prefixes,
                           agent_dir=self.agent_dir, cuda_visible_devices=cuda, binds=binds + volumes, uid=self.uid,
                           network=network, tmp_size=limits.tmp_size, shm_size=limits.shm_size,
                           gpu_nodes=tuple(f"/dev/nvidia{g.minor}" for g in chosen if g.minor is not None))
        delay = float(request.pool.template.get("start_delay_s", 0.0) or 0.0) + modelled
        starting = asyncio.ensure_future(self._start(spec, record, limits))
        sleeping = asyncio.ensure_future(self.clock.sleep(delay)) if delay > 0 else None
        try:
            await asyncio.gather(starting, *([sleeping] if sleeping else []))
        except BaseException as exc:
            for task in (starting, sleeping):
                if task is not None and not task.done():
                    task.cancel()
            await asyncio.shield(self._abandon(name, starting))
            if isinstance(exc, BackendError) or not isinstance(exc, Exception):
                raise
            raise BackendError(f"creating pod {name} failed: {exc!r}") from exc
        finally:
            self._starting.discard(name)
            self._creates.pop(name, None)
        return self._info(record)

    # -- delete ---------------------------------------------------------------------------------

    async def delete(self, name: str) -> None:
        ending = self._abandoned.get(name)
        if ending is not None:  # a failed create is destroying it already
            await asyncio.shield(ending)
        elif name in self._records or self._dirs(name).root.exists():
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
        if not await self.procs.kill(record, KILL_TIMEOUT_S):
            log.error("pod %s: processes still alive %.0f s after SIGKILL", name, KILL_TIMEOUT_S)
        else:
            await self.kept_out(name, record)  # nothing of the pod runs: its kept content goes to its caller
        await asyncio.to_thread(self.limiter.release, self._dirs(name), record)
        # Its exit-fd ends it with the sandbox already; this covers a helper left by a half-made pod.
        await asyncio.to_thread(self.nets.detach, record)
        await asyncio.to_thread(remove_tree, self._dirs(name).root)
        self._records.pop(name, None)
        late = self._clients.pop(name, None)  # made by a call while the pod was being destroyed
        if late is not None:
            await late.close()

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
        launcher = record.get("launcher_pid")
        if launcher:
            self.procs.exited(launcher)  # reaps it when it is our child and gone
        return same_process(record.get("pid"), record.get("pid_start")) is not None

    async def _healthy(self, name: str) -> bool:
        record = self._records.get(name)
        if record is None or not self._alive(record):
            return False
        if not self.nets.helper_alive(record):
            log.warning("pod %s lost its network helper (%s); deleting it", name, networking.STACK)
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
                try:
                    fd = os.open(self._dirs(name).run, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                except FileNotFoundError:  # as a socket not there yet is: a pod still starting (or gone)
                    raise AgentError(f"agent of pod {name} unreachable: its run directory is not there") from None
                self._dir_fds[name] = fd
            dial = f"/proc/self/fd/{fd}/agent.sock"
        client = KeptCacheAgent(self, f"unix:{socket_path}", record["secret"], pod=name, uds_path=dial,
                                term=self.term)
        self._clients[name] = client
        return client

    def rendezvous(self, coordinator: str, world: int, members: Sequence[str] = ()) -> Rendezvous:
        return self.nets.rendezvous(coordinator, world, members)

    async def close(self) -> None:
        """End the pods still starting (nobody will ever use them) and close agent connections; pods that
        started keep running for the next broker."""
        await self.end_starts()
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()
        fds, self._dir_fds = self._dir_fds, {}
        for fd in fds.values():
            os.close(fd)
