"""Preemption, the acting half: when a job within its team's quota cannot be placed, make room for it.

The dispatcher calls `consider` for each queued job whose claim fell short of capacity (not of quota).
Who yields is broker.fleet.preemption's pure decision (design §7) under the preemption budget's tiers
(R6); this module checks that the pool really has no room coming (idle, starting, retiring pods and
room under the ceiling count as coming, and so do victims already leaving), then acts: each victim's
pods retire at release (their room comes back as fresh pods for the waiting job: pods never change
callers), the executor sends SIGTERM and the agent SIGKILLs after `preemption_grace_s`, and every
decision is an event (broker.events) with its cost in GPU-seconds. Victims come from the waiting
job's own pool.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from broker.claiming.tracker import Tracker
from broker.clock import Clock
from broker.events import EventLog
from broker.fleet.preemption import Budget, Running, Tier, decide
from broker.fleet.quotas import Kind, QuotasSpec
from broker.jobs import Job, JobState
from broker.pods import PodState
from broker.tasks import Supervisor

log = logging.getLogger("firepool.preempting")

Preempt = Callable[[str, str, float], Coroutine[Any, Any, bool]]
"""executor.preempt(job id, why, grace seconds)."""


def preemptible(job: Job) -> bool:
    return bool(job.spec.extra.get("preemptible"))


class Preempter:
    def __init__(self, *, clock: Clock, tracker: Tracker, quotas: QuotasSpec, events: EventLog | None,
                 tasks: Supervisor, preempt: Preempt) -> None:
        self.clock = clock
        self.tracker = tracker
        self.quotas = quotas
        self.events = events
        self.tasks = tasks
        self.preempt = preempt
        b = quotas.preemption_budget
        self.budget = Budget(b.warn_pct, b.limit_pct)
        self.leaving: dict[str, tuple[str, int]] = {}
        """Victims asked to stop: job id -> (pool, pods), counted as room coming until their job ends."""
        self._throttled: set[str] = set()
        """Jobs told (by an event) that the budget holds their preemption back; told once each."""
        self.preempted = 0

    def prune(self, live: Mapping[str, Job]) -> None:
        """Forget victims that have ended (their room came back) and throttled jobs that left the queue."""
        for job_id in [j for j in self.leaving if (job := live.get(j)) is None or job.state is not JobState.RUNNING]:
            del self.leaving[job_id]
        self._throttled &= set(live)

    def consider(self, job: Job, live: Mapping[str, Job], now: float) -> bool:
        """Preempt for `job` if it is within its quota and its pool has no room coming; True if it did."""
        spec = self.tracker.pool(job.spec.pool)
        if spec is None or spec.gpus <= 0:
            return False
        gpus = job.spec.pods * spec.gpus
        verdict = self.tracker.quota_verdict(job.caller, gpus, preemptible(job))
        if verdict is None or verdict.kind is not Kind.IN_QUOTA:
            return False  # outside quotas, borrowed or over quota: such jobs never make others yield
        missing = job.spec.pods - self._coming(job.spec.pool, spec.max_count)
        if missing <= 0:
            return False
        candidates, running_gpus = self._candidates(job.spec.pool, live)
        guaranteed = not preemptible(job)
        d = decide(self.budget, candidates, missing * spec.gpus, priority=job.priority, guaranteed=guaranteed,
                   now=now, min_runtime_s=self.quotas.min_runtime_before_preempt, running_gpus=running_gpus)
        if d is None:
            return False
        if not d.go:
            if job.id not in self._throttled and self.events is not None:
                self._throttled.add(job.id)
                self.events.emit("preemption.throttled", job.id,
                                 f"preemption budget at {d.rate_pct:.1f}%/h (limit {self.budget.limit_pct:g}%): "
                                 f"a preemptible job above the floor queues; it would preempt {len(d.victims)} "
                                 f"jobs ({sum(v.gpus for v in d.victims)} GPUs)",
                                 d.cost_gpu_s, job.caller,
                                 {"would_preempt": [v.job_id for v in d.victims], "rate_pct": round(d.rate_pct, 2),
                                  "actions": ["raise preemption_budget.limit_pct", "accept the wait"]})
            return False
        if d.tier is Tier.WARN and self.events is not None:
            self.events.emit("preemption.warn", job.id,
                             f"preemption rate {d.rate_pct:.1f}%/h is past warn_pct {self.budget.warn_pct:g}%",
                             d.cost_gpu_s, None, {"victims": [v.job_id for v in d.victims]})
        self.tracker.reclaim(job.id, job.caller, gpus)
        for v in d.victims:
            self._act(v, job, now)
        self.budget.spend(now, d.cost_gpu_s)
        return True

    def _act(self, victim: Running, job: Job, now: float) -> None:
        why = ("preempted for a job within its team's guarantee: "
               + ("ran on borrowed quota" if victim.borrowed else "preemptible within quota, lower priority"))
        pods = self.tracker.pods_of(victim.job_id)
        for pod in pods:
            self.tracker.retire_at_release(pod.name)
        self.leaving[victim.job_id] = (job.spec.pool, len(pods))
        self.preempted += 1
        grace = self.quotas.preemption_grace_s
        lost = victim.gpus * max(0.0, now - victim.started_at)
        if self.events is not None:
            self.events.emit("preemption", victim.job_id, why, lost, victim.caller,
                             {"for_job": job.id, "for_caller": job.caller, "gpus": victim.gpus,
                              "borrowed": victim.borrowed, "priority": victim.priority, "grace_s": grace,
                              "ran_s": round(now - victim.started_at, 3)})
        log.info("preempting %s (%d GPUs, %.0f GPU-s at risk) for %s", victim.job_id, victim.gpus, lost, job.id)
        self.tasks.spawn(f"preempt {victim.job_id}", self.preempt(victim.job_id, why, grace))

    def _coming(self, pool: str, ceiling: int) -> int:
        """Pods that are or will soon be free for a new claim in `pool`: not busy, leaving, or room under the ceiling."""
        physical = 0
        free = 0
        for pod in self.tracker.snapshot():
            if pod.pool != pool or pod.state is PodState.GONE or pod.standby:
                continue
            physical += 1
            if pod.state in (PodState.IDLE, PodState.STARTING, PodState.RETIRING, PodState.RESETTING):
                free += 1
        free += sum(n for p, n in self.leaving.values() if p == pool)
        return free + max(0, ceiling - physical)

    def _candidates(self, pool: str, live: Mapping[str, Job]) -> tuple[list[Running], int]:
        out: list[Running] = []
        running_gpus = 0
        for lease in self.tracker.leases():
            running_gpus += lease.gpus
            if not lease.pods or lease.pods[0].pool != pool or lease.job_id in self.leaving:
                continue
            job = live.get(lease.job_id)
            if job is None or job.state is not JobState.RUNNING:
                continue
            started = job.timings.get("committed_at")
            if started is None:
                continue
            out.append(Running(job.id, job.caller, lease.gpus, job.priority, started, lease.borrowed,
                               preemptible(job), session=bool(job.spec.extra.get("kernel"))))
        return out, running_gpus
