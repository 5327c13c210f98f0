"""The broker's side of a kernel job's connection info: fetched from the job's agent when its owner asks.

A kernel job's connection info (the address and ports a caller dials, the HMAC key, the CurveZMQ keys) is
a secret of the job's owner: whoever holds it can run code in the kernel. It never travels through the
job's log. The pod's agent keeps it for the running attempt (its kernel reports it over a private pipe);
`KernelConnections.connection` asks that agent for it on demand, so nothing is stored by the broker, no
database column holds a key, and a restarted broker serves a kernel that kept running. The caller check
happens above (`broker.api.access`): this module is handed a job its caller may read.

This is where a broker-side kernel channel will plug in (a later issue routes kernel channels through
the broker's websocket): the one place that learns a live kernel's keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from broker.clock import Clock
from broker.errors import FirepoolError, KernelEnded, KernelNotReady, NotAKernel, NotFound
from broker.jobs import Job
from broker.pods import Pod
from broker.ports.agent import AgentClient

RECHECK_S = 0.25
"""While a kernel job is queued or its agent cannot answer, how often the wait looks again."""
AGENT_WAIT_S = 30.0
"""One long-poll of the agent at most; a longer wait asks again."""


class Jobs(Protocol):
    async def get(self, job_id: str) -> Job | None: ...

    async def wait_change(self, job_id: str, timeout: float) -> None: ...


class Leases(Protocol):
    def pods_of(self, job_id: str) -> tuple[Pod, ...]: ...


class Agents(Protocol):
    def agent(self, name: str) -> AgentClient: ...


class KernelConnections:
    def __init__(self, *, clock: Clock, jobs: Jobs, launched: Mapping[str, str], leases: Leases,
                 agents: Agents) -> None:
        self.clock = clock
        self.jobs = jobs
        self.launched = launched
        """Job id -> the attempt running now (the executor's map)."""
        self.leases = leases
        self.agents = agents

    async def connection(self, job: Job, wait_s: float = 0.0) -> dict[str, Any]:
        """The kernel's connection info once it is up; KernelNotReady after `wait_s` if it is not yet,
        KernelEnded once the job ended, NotAKernel for a job without a kernel."""
        if not job.spec.extra.get("kernel"):
            raise NotAKernel(f"job {job.id} is not a kernel job (submit it with kernel: true)", {"job": job.id})
        deadline = self.clock.now() + max(0.0, wait_s)
        while True:
            if job.terminal:
                raise KernelEnded(f"kernel job {job.id} ended ({job.state.value}): its kernel is gone",
                                  {"job": job.id, "state": job.state.value})
            left = deadline - self.clock.now()
            info = await self._ask(job.id, max(0.0, min(left, AGENT_WAIT_S)))
            if info is not None:
                return info
            left = deadline - self.clock.now()
            if left <= 0:
                raise KernelNotReady(f"kernel job {job.id} has no kernel up yet ({job.state.value}); "
                                     "ask again, or with wait_s", {"job": job.id, "state": job.state.value})
            await self.jobs.wait_change(job.id, min(left, RECHECK_S))
            found = await self.jobs.get(job.id)
            if found is None:
                raise NotFound(f"no job {job.id!r}", {"job": job.id})
            job = found

    async def _ask(self, job_id: str, wait_s: float) -> dict[str, Any] | None:
        """The running attempt's connection info from its rank-0 agent, or None (not up, or not answering)."""
        attempt = self.launched.get(job_id)
        pods = self.leases.pods_of(job_id)
        if attempt is None or not pods:
            return None
        try:
            report = await self.agents.agent(pods[0].name).kernel(attempt, wait_s)
        except FirepoolError:
            return None  # a pod being replaced or an agent restarting: the next look may find it
        return dict(report.connection) if report.running and report.connection is not None else None
