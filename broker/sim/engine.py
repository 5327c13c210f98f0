"""The discrete-event engine: Firepool's own control plane in virtual time against a simulated backend.

A `Simulation` wires the real `ControlPlane` (tracker, job book, dispatcher, executor, pool controller
with its scaler, holds and standby planner) over the in-memory job store, the in-memory log store and
a `SimBackend` whose costs come from a venue model, all on one `VirtualClock`. Nothing of the broker is
re-implemented here: the engine only decides when time moves.

The loop: run every ready task until none is left (the event loop's ready queue is empty), then jump
the clock to the earliest sleeper's deadline, which wakes it; repeat until the workload's driver
returns. Store and log calls the control plane sends to a worker thread run inline, so no real thread
can race virtual time; job ids and pod names come from counters, so a run is a function of its seed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import broker.claiming.admission as admission
import broker.warmth.creating as creating
from broker.clock import VirtualClock
from broker.control import ControlPlane, Tuning
from broker.jobs import Job, JobSpec
from broker.pools import CallerLimits, Catalog, PoolSpec
from broker.ports.logs import MemoryLogStore
from broker.ports.store import MemoryJobStore
from broker.sim.backend import Costs, SimBackend

T = TypeVar("T")

SIM_TUNING = Tuning(dispatch_tick_s=3.0, reconcile_tick_s=30.0, capacity_poll_s=10.0, kill_grace_s=5.0,
                    agent_heartbeat_s=0.0)  # simulated pods never orphan: no heartbeat to model
"""The production loop timings (paper App. A.5: reconcile every 30 s; dispatch event-driven, 3 s fallback)."""

EPOCH = 1_800_000_000.0
"""Virtual time zero of every run."""


class SimulationStalled(RuntimeError):
    """The driver waits on something no sleeper will ever wake (a deadlock in the workload or broker)."""


class _InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs what the control plane hands a worker thread at once, on the event loop's thread."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed back to the awaiting coroutine, as a thread would
            future.set_exception(exc)
        return future


_NAMES_LOCK = threading.Lock()
_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


class _CountingSecrets:
    """Pod-name suffixes from a counter instead of the OS's random bytes."""

    def __init__(self) -> None:
        self.n = 0

    def token_hex(self, nbytes: int = 32) -> str:
        self.n += 1
        return f"{self.n:0{2 * nbytes}x}"


@contextlib.contextmanager
def counted_names() -> Iterator[None]:
    """Job ids and pod names from counters for the duration of a run (they are random in the broker)."""
    counter = iter(range(1, 1 << 40))

    def job_id(now: float | None = None) -> str:
        value = ((int((now or 0.0) * 1000) & ((1 << 48) - 1)) << 40) | next(counter)
        chars = []
        for _ in range(18):
            chars.append(_ALPHABET[value & 31])
            value >>= 5
        return "j" + "".join(reversed(chars))

    patches: list[tuple[Any, str, object]] = [(admission, "new_job_id", job_id), (creating, "secrets", _CountingSecrets())]
    with _NAMES_LOCK:
        saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
        for module, name, value in patches:
            setattr(module, name, value)
        try:
            yield
        finally:
            for module, name, value in saved:
                setattr(module, name, value)


@dataclass(frozen=True)
class JobRecord:
    """What a finished job's row says about its start, in seconds from the run's start."""

    id: str
    caller: str
    tag: str
    pool: str
    state: str
    path: str
    submitted: float
    claimed: float | None
    handed_off: float | None
    first: float | None
    finished: float | None
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def start_latency(self) -> float | None:
        """Submit -> first instruction (paper Table 5, Fig. 4)."""
        return None if self.first is None else self.first - self.submitted

    @property
    def queue_wait(self) -> float | None:
        """Submit -> handed off to the agent: queueing, claim and a standby's promotion (Table 6's wait)."""
        return None if self.handed_off is None else self.handed_off - self.submitted


@dataclass
class RunResult:
    """One simulated run: every job, the capacity held and how many pods were made."""

    jobs: list[JobRecord]
    began: float
    """When the workload started (the driver's `sim.mark()`), seconds from virtual time zero."""
    ended: float
    held: float
    """Processor-seconds held by every pod between `began` and `ended`."""
    pods_created: int
    peak_starting: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def makespan(self) -> float:
        """First submission to last completion."""
        subs = [j.submitted for j in self.jobs]
        ends = [j.finished for j in self.jobs if j.finished is not None]
        return (max(ends) - min(subs)) if subs and ends else 0.0

    def latencies(self) -> list[float]:
        return [lat for j in self.jobs if (lat := j.start_latency) is not None]


class Simulation:
    """One run: the real control plane over a simulated backend on a virtual clock."""

    def __init__(self, *, pools: Sequence[PoolSpec], costs: Costs, seed: int, gpus: int = 0,
                 budgets: Mapping[str, float] | None = None, limits: Mapping[str, CallerLimits] | None = None,
                 tuning: Tuning = SIM_TUNING, tick_dispatch: bool = False, tick_reconcile: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = VirtualClock(EPOCH)
        self.store = MemoryJobStore()
        self.backend = SimBackend(self.clock, costs, random.Random(self.rng.getrandbits(64)), gpus=gpus)
        self.catalog = Catalog(pools={p.name: p for p in pools}, caller_limits=dict(limits or {}),
                               budgets=dict(budgets or {}))
        self.cp = ControlPlane(clock=self.clock, store=self.store, backend=self.backend, logs=MemoryLogStore(self.clock.now),
                               catalog=self.catalog, tuning=tuning)
        if tick_dispatch:
            # The earlier dispatcher the paper's Reuse Off columns ran (Table 5 caption, App. C.4): no event
            # wakes it, only its 3 s tick. Only the wake-ups are cut; the dispatch pass is the real one.
            self.cp.dispatcher.wake = _no_wake
            self.cp.executor.wake_dispatcher = _no_wake
        if tick_reconcile:
            # The pool controller as the paper describes it: it scales "on every reconcile pass (30 s by default)"
            # (§7, App. A.5). Our controller also wakes on every demand report, pod ready and pod deletion; only
            # those wake-ups are cut: its own schedule (the 30 s pass, keep-alive and hold expiries) stays.
            self.cp.controller.wake = self.cp.controller.nudge = _no_wake
        self.began = 0.0
        self.labels: dict[str, dict[str, str]] = {}

    # ------------------------------------------------------------- what drivers call

    def now(self) -> float:
        """Seconds since virtual time zero."""
        return self.clock.now() - EPOCH

    def mark(self) -> None:
        """The workload starts now: held capacity is counted from here."""
        self.began = self.now()

    async def sleep(self, seconds: float) -> None:
        await self.clock.sleep(seconds)

    async def submit(self, caller: str, spec: JobSpec, **labels: str) -> Job:
        job, _ = await self.cp.submit(caller, spec)
        if labels:
            self.labels[job.id] = dict(labels)
        return job

    async def finish(self, job: Job) -> Job:
        """Wait (in virtual time) until the job is terminal."""
        return await self.cp.wait(job.caller, job.id, 1e9)

    async def run_job(self, caller: str, spec: JobSpec, **labels: str) -> Job:
        return await self.finish(await self.submit(caller, spec, **labels))

    # ------------------------------------------------------------- the engine

    def run(self, driver: Callable[[Simulation], Awaitable[None]], *, horizon_s: float = 7 * 86_400.0) -> RunResult:
        """Start the control plane, run `driver` to its end in virtual time, and collect the result."""
        with counted_names():
            return asyncio.run(self._main(driver, horizon_s))

    async def _main(self, driver: Callable[[Simulation], Awaitable[None]], horizon_s: float) -> RunResult:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(_InlineExecutor(max_workers=1))
        await self.cp.start()
        main = asyncio.ensure_future(driver(self))
        try:
            while not main.done():
                await _quiesce(loop)
                if main.done():
                    break
                deadline = self.clock.next_deadline()
                if deadline is None:
                    raise SimulationStalled(f"nothing left to wake at t={self.now():.1f} s")
                if deadline - EPOCH > horizon_s:
                    raise SimulationStalled(f"the workload runs past the {horizon_s:.0f} s horizon")
                self.clock.advance_to(deadline)
            main.result()
            return self._result()
        finally:
            if not main.done():
                main.cancel()
            await self.cp.tasks.stop()

    def _result(self) -> RunResult:
        jobs = []
        for job in sorted(self.store.list_jobs(limit=1_000_000), key=lambda j: (j.timings.get("submitted_at", 0), j.id)):
            jobs.append(_record(job, self.labels.get(job.id, {})))
        ended = max((j.finished for j in jobs if j.finished is not None), default=self.now())
        return RunResult(jobs=jobs, began=self.began, ended=ended,
                         held=self.backend.held_processor_seconds(ended + EPOCH, self.began + EPOCH),
                         pods_created=self.backend.pods_created(), peak_starting=self.backend.peak_starting)


def _no_wake() -> None:
    return None


async def _quiesce(loop: asyncio.AbstractEventLoop, limit: int = 1_000_000) -> None:
    """Yield until no task is ready to run: every coroutine waits on the clock or on an event."""
    ready = getattr(loop, "_ready", None)
    for _ in range(limit):
        await asyncio.sleep(0)
        if not ready:
            return
    raise SimulationStalled("tasks kept waking each other without time passing")


def _rel(value: float | None) -> float | None:
    return None if value is None else value - EPOCH


def _record(job: Job, labels: Mapping[str, str]) -> JobRecord:
    t = job.timings
    path = job.acquisition[0].path if job.acquisition else ""
    return JobRecord(id=job.id, caller=job.caller, tag=job.spec.lease_tag, pool=job.spec.pool, state=str(job.state),
                     path=path, submitted=t.get("submitted_at", EPOCH) - EPOCH, claimed=_rel(t.get("claimed_at")),
                     handed_off=_rel(t.get("handed_off_at")),
                     first=_rel(t.get("first_instruction_at")), finished=_rel(t.get("finished_at")), labels=labels)
