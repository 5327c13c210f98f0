"""A control plane over the in-memory store, fake backend and virtual clock, driven tick by tick."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from broker.clock import VirtualClock
from broker.control import ControlPlane, Tuning
from broker.errors import StoreError
from broker.fleet.quotas import QuotasSpec
from broker.jobs import Job, JobSpec, JobState
from broker.pools import CallerLimits, Catalog, PoolSpec, QuarantineSettings
from broker.ports.backend import FakeBackend
from broker.ports.capacity import CapacitySource
from broker.ports.logs import MemoryLogStore
from broker.ports.quarantine import MemoryQuarantineStore, QuarantineStore
from broker.ports.store import MemoryJobStore
from broker.running.packages import PackageStore


class Harness:
    def __init__(self, pools: list[PoolSpec], *, gpus: int = 0, start_delay: float = 0.0,
                 limits: dict[str, CallerLimits] | None = None, store: MemoryJobStore | None = None,
                 backend: FakeBackend | None = None, clock: VirtualClock | None = None,
                 budgets: dict[str, float] | None = None, capacity: CapacitySource | None = None,
                 packages: PackageStore | None = None, quotas: QuotasSpec | None = None,
                 quarantine: QuarantineStore | None = None,
                 quarantine_settings: QuarantineSettings | None = None) -> None:
        self.clock = clock or VirtualClock()
        self.store = store or MemoryJobStore()
        self.backend = backend or FakeBackend(self.clock, gpus=gpus, start_delay=start_delay)
        self.logs = MemoryLogStore(self.clock.now)
        self.catalog = Catalog(pools={p.name: p for p in pools}, caller_limits=limits or {}, budgets=budgets or {},
                               quotas=quotas, quarantine=quarantine_settings or QuarantineSettings())
        self.quarantine = quarantine or MemoryQuarantineStore()
        self.cp = ControlPlane(clock=self.clock, store=self.store, backend=self.backend, logs=self.logs,
                               catalog=self.catalog, tuning=Tuning(dispatch_tick_s=3.0, reconcile_tick_s=1.0, reconcile_min_gap_s=0.0),
                               capacity=capacity, packages=packages, quarantine=self.quarantine)

    def restarted(self, pools: list[PoolSpec], **settings: Any) -> Harness:
        """A broker made anew over what survives a restart: this one's backend, store, clock and quarantine."""
        return Harness(pools, backend=self.backend, store=self.store, clock=self.clock, quarantine=self.quarantine,
                       **settings)

    async def start(self) -> Harness:
        await self.cp.start()
        await self.spin()
        return self

    async def stop(self) -> None:
        await self.cp.tasks.stop()

    async def spin(self, rounds: int = 30) -> None:
        """Let every ready task run (no time passes)."""
        for _ in range(rounds):
            await asyncio.sleep(0)

    async def run_for(self, seconds: float, step: float = 0.05) -> None:
        """Advance virtual time in small steps, letting tasks run at each."""
        end = self.clock.now() + seconds
        while self.clock.now() < end - 1e-9:
            await self.spin()
            self.clock.advance(min(step, end - self.clock.now()))
        await self.spin()

    async def until(self, cond: Callable[[], bool], timeout: float = 60.0, step: float = 0.05) -> None:
        end = self.clock.now() + timeout
        while not cond():
            if self.clock.now() >= end:
                raise AssertionError(f"condition not reached within {timeout} s of virtual time")
            await self.run_for(step, step)

    async def submit(self, caller: str = "alice", **fields: object) -> Job:
        fields.setdefault("pool", "cpu")
        fields.setdefault("command", ("sleep", "1"))
        fields["command"] = tuple(fields["command"])  # type: ignore[arg-type]
        job, _ = await self.cp.submit(caller, JobSpec(**fields))  # type: ignore[arg-type]
        await self.spin()
        return job

    async def finish(self, job: Job, timeout: float = 60.0) -> Job:
        """Run until the job is terminal; returns its final row."""
        await self.until(lambda: (self.store.get(job.id) or job).terminal, timeout)
        await self.spin()
        final = self.store.get(job.id)
        assert final is not None
        return final

    async def run_job(self, caller: str = "alice", **fields: object) -> Job:
        return await self.finish(await self.submit(caller, **fields))

    def lose_first_insert_answer(self) -> list[str]:
        """The store's next insert lands but its answer is lost (a database restarting): it raises StoreError.
        Returns the ids of every insert from now on."""
        real, inserted = self.store.insert, []

        def insert(job: Job) -> Job:
            inserted.append(job.id)
            stored = real(job)
            if len(inserted) == 1:
                raise StoreError("injected: lost connection after the commit")
            return stored

        self.store.insert = insert  # type: ignore[method-assign]
        return inserted

    def lose_first_commit_answer(self, of: Callable[[Job], bool] = lambda job: True) -> list[int]:
        """The first commit from now on that writes a job `of` accepts lands but its answer is lost: it raises
        StoreError. Returns the sizes of the commits whose answers were lost (one at most)."""
        real, lost = self.store.commit, []

        def commit(writes: Sequence[tuple[Job, int]]) -> list[bool]:
            won = real(writes)
            if not lost and any(of(job) for job, _ in writes):
                lost.append(len(writes))
                raise StoreError("injected: lost connection after the commit")
            return won

        self.store.commit = commit  # type: ignore[method-assign]
        return lost

    async def queued_for_the_pod(self) -> Job:
        """A `true` job of alice's session "t" that waits in the queue for the pool's one pod (busy with a 1 s job
        then), so a dispatcher pass claims it and commits the claim: a submit that finds the pod idle is claimed
        at once and stored bound instead (`Dispatcher.insert_bound`). For a pool of one pod."""
        await self.run_job(lease_tag="t")
        await self.submit(lease_tag="t", command=("sleep", "1"))
        job = await self.submit(lease_tag="t", command=("true",))
        assert (self.store.get(job.id) or job).state is JobState.QUEUED
        return job

    def paths(self, job: Job) -> list[str]:
        return [a.path for a in job.acquisition]


def cpu_pool(**overrides: object) -> PoolSpec:
    values: dict[str, object] = {"name": "cpu", "max_count": 4, "max_idle_count": 4, "idle_timeout": 300.0,
                                 "caller_hold_seconds": 60.0, "step": 4}
    values.update(overrides)
    return PoolSpec(**values)  # type: ignore[arg-type]


def gpu_pool(**overrides: object) -> PoolSpec:
    values: dict[str, object] = {"name": "gpu", "gpus": 1, "accelerator": "fake-gpu", "max_count": 2,
                                 "idle_timeout": 300.0, "caller_hold_seconds": 60.0, "step": 2}
    values.update(overrides)
    return PoolSpec(**values)  # type: ignore[arg-type]


def failing_once(real: Callable[..., Any]) -> Callable[..., Any]:
    """`real`, except that its first call raises (a bug on a path the broker must survive)."""
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise ValueError("a bug in the verdict")
        return real(*args, **kwargs)

    return wrapper
