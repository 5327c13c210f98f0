"""The network side of local pods: the catalog's modes, the user-mode stack of isolated pods, gang links
and where a job's ranks meet (docs/networking.md).

`LocalBackend` owns the pod records; this works on them (`records`, and `write` to persist one).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from broker.backends import ganglinks, networking
from broker.backends.netports import DEFAULT_MASTER_PORT, FreePorts
from broker.backends.podprocs import same_process
from broker.backends.sandboxing import SandboxSpec
from broker.errors import BackendError
from broker.podtemplate import parse_network
from broker.pools import PoolSpec
from broker.running.topology import Rendezvous

log = logging.getLogger("broker.backends.local")

NETWORK_POLICY = 4
"""Records carry it from the version whose sandboxes keep the agent's run dir on the capped disk and see a
minimal /etc (3: isolated pods forward their kernel ports; 2: isolated by default, kernels unreachable;
before: the host's network). An older pod reads as stale, and the rollout replaces it."""

Record = dict[str, Any]


def stale_template(record: Mapping[str, Any]) -> str:
    """The pod's template hash; a pod made before isolated networks, or before their kernel ports were
    forwarded, reads as stale, so the rollout replaces it (its template may not name a network, and that
    meant the host's then; its kernels could not be reached)."""
    template = str(record["template"])
    return template if record.get("network_policy") == NETWORK_POLICY else f"{template}+older-network"


def kernel_env(record: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """What a kernel job on this pod needs to bind the ports forwarded from the host (none: none forwarded)."""
    ports = record.get("kernel_ports")
    if not ports:
        return ()
    return ((networking.KERNEL_PORTS_ENV, networking.encode_ports({int(g): int(h) for g, h in ports.items()})),)


class PodNetworks:
    def __init__(self, records: dict[str, Record], write: Callable[[Record], None], *, isolated: bool,
                 root: bool) -> None:
        self.records = records
        self.write = write
        self.isolated = isolated
        """Pods are sandboxes (False: unisolated plain processes, which share the host's network)."""
        self.root = root
        """The broker runs as root: it can plug links into the pods' namespaces."""
        self._free_ports = FreePorts()

    def check_catalog(self, pools: Mapping[str, PoolSpec]) -> None:
        """At start: warn for each pool that shares the host's network; BackendError for a bad `network`, or
        when isolated pools need slirp4netns and it is missing (pods would fail one by one otherwise)."""
        modes = {}
        for name, pool in pools.items():
            try:
                modes[name] = parse_network(pool.template.get("network"))
            except ValueError as exc:
                raise BackendError(f"pool {name}: {exc}") from exc
        if not self.isolated:
            return  # the unisolated warning says it all: every pod shares the host
        for name, mode in sorted(modes.items()):
            if mode == "host":
                log.warning("pool %s: network: host -- its jobs share this host's network and reach every service "
                            "on its 127.0.0.1 (the job store, the broker); isolated is the default", name)
        isolated = sorted(n for n, m in modes.items() if m == "isolated")
        if isolated and networking.stack_path() is None:
            raise BackendError(f"pools {', '.join(isolated)} have isolated networks but {networking.install_hint()}")

    # -- the user-mode stack ----------------------------------------------------------------------

    async def attach(self, spec: SandboxSpec, record: Record, agent_pid: int | None) -> float:
        """Plug the user-mode stack into an isolated pod's namespace (after the agent answers: see networking)
        and forward the host ports its kernels will bind (`kernel_ports`: guest -> host, kept in the record
        for a restarted broker); the pod is not handed out before this returns, so no job runs without its
        network. Returns the ms spent."""
        if spec.network != "isolated":
            return 0.0
        if agent_pid is None:
            raise BackendError(f"pod {spec.name}: no sandbox pid to attach a network to")
        began = time.perf_counter()
        # Every isolated pod, `kernels: cold` too: cold only means no pre-started kernel, kernel jobs still run.
        api = networking.api_dir()
        try:
            helper, start = await networking.attach(agent_pid, spec.dirs.net_log, api / "api.sock")
            record["net_pid"], record["net_start"] = helper, start
            self.write(record)
            ports = await asyncio.to_thread(networking.forward, api / "api.sock", networking.KERNEL_GUEST_PORTS)
        finally:
            shutil.rmtree(api, ignore_errors=True)  # no forward is added after this one
        record["kernel_ports"] = {str(guest): host for guest, host in ports.items()}
        self.write(record)
        return (time.perf_counter() - began) * 1000

    @staticmethod
    def detach(record: Mapping[str, Any]) -> None:
        """Its exit-fd ends the helper with the sandbox already; this covers a helper left by a half-made pod."""
        networking.detach(record.get("net_pid"), record.get("net_start"))

    @staticmethod
    def helper_alive(record: Mapping[str, Any]) -> bool:
        """False when an isolated pod's helper is gone (the pod has no network left)."""
        return not record.get("net_pid") or same_process(record["net_pid"], record.get("net_start")) is not None

    # -- where ranks meet -------------------------------------------------------------------------

    def rendezvous(self, coordinator: str, world: int, members: Sequence[str] = ()) -> Rendezvous:
        """On `network: host` rank 0 listens on 127.0.0.1 at a port free on this host. Pods with a network of
        their own (`isolated`, the default, or `none`) get a gang link (ganglinks): one segment joining the
        job's namespaces only, rank 0 at 10.213.0.1; that needs a root broker. Before any launch, the pods'
        links from an earlier gang are cut."""
        record = self.records.get(coordinator)
        if record is None:
            raise BackendError(f"pod {coordinator} is gone")
        pods = list(members) or [coordinator]
        self._unlink(pods)
        network = record.get("network", "host")  # records from before pools had isolated networks shared the host's
        if network == "host":
            try:
                return Rendezvous("127.0.0.1", self._free_ports.take())
            except OSError as exc:
                raise BackendError(f"no free port for the rendezvous of a job on {coordinator}: {exc}") from exc
        if world <= 1:  # its own loopback: every port is free
            return Rendezvous("127.0.0.1", DEFAULT_MASTER_PORT, kernel_env=kernel_env(record))
        if not self.root:
            raise BackendError(f"pool {record['pool']} gives pods a private network (template network: {network}) "
                               f"and only a root broker can link the {world} ranks of a gang; use network: host")
        if len(pods) != world:
            raise BackendError(f"a gang of {world} ranks needs its {world} pods named, got {len(pods)}")
        pids = []
        for name in pods:
            member = self.records.get(name)
            pid = same_process(member.get("pid"), member.get("pid_start")) if member else None
            if member is None or pid is None:
                raise BackendError(f"pod {name} is gone")
            pids.append(pid)
        began = time.perf_counter()
        for name in pods:  # marked first: a half-made link is cut before these pods' next job
            self.records[name]["gang_link"] = True
            self.write(self.records[name])
        ganglinks.link(pids, secrets.token_hex(4))
        log.info("gang link of %s made in %.0f ms", ", ".join(pods), (time.perf_counter() - began) * 1000)
        return Rendezvous(ganglinks.address(0), DEFAULT_MASTER_PORT, ganglinks.env())

    def _unlink(self, pods: Sequence[str]) -> None:
        """Cut the links an earlier gang left on these pods (they sat idle since, with no process running)."""
        for name in pods:
            record = self.records.get(name)
            if record is None or not record.get("gang_link"):
                continue
            pid = same_process(record.get("pid"), record.get("pid_start"))
            if pid is not None:
                ganglinks.unlink(pid)
            record["gang_link"] = False
            self.write(record)
