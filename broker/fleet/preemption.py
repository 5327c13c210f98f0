"""Who yields (design §7) and the preemption budget (R6): pure decisions over running jobs.

Victims come in this order, and never from below the line:

    1. borrowed, at the lowest priority any borrowed job has, newest first   (LIFO: least work lost)
    2. the other borrowed jobs, lowest priority first, newest first
    3. preemptible jobs within quota, of lower priority than the job that preempts, lowest first, newest first
    --- never below this line ---
    in-quota jobs that are not preemptible, jobs outside quotas that are not preemptible,
    kernel (Jupyter / MCP session) jobs, and any job younger than `min_runtime_before_preempt`

A preemption happens whole or not at all: if the victims available cannot free the GPUs asked for,
nothing is preempted (destroying work that does not place the job helps nobody). The cost of a victim
is its GPUs × its runtime so far, in GPU-seconds: the progress at risk when it has not checkpointed.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

AGING_BONUS = 1
"""Priority a job gains per preemption (its `preempt_count`) and a reservation per failed fill."""
WINDOW_S = 3600.0
"""The preemption budget's window: rates are per hour."""


@dataclass(frozen=True, slots=True)
class Running:
    """What the decision needs to know about one running job."""

    job_id: str
    caller: str
    gpus: int
    priority: int
    started_at: float
    borrowed: bool
    preemptible: bool
    session: bool = False
    """A kernel or MCP session job: never preempted (its state lives in memory, not in a checkpoint)."""


def tier(r: Running) -> int | None:
    """2 for borrowed (tier 1 is picked among these), 3 for preemptible within quota, None below the line."""
    if r.session:
        return None
    if r.borrowed:
        return 2
    if r.preemptible:
        return 3
    return None


def order(candidates: Iterable[Running], *, priority: int, now: float, min_runtime_s: float) -> list[Running]:
    """Every job that may yield to a job of `priority`, in the order they yield."""
    eligible = [r for r in candidates if tier(r) is not None and now - r.started_at >= min_runtime_s]
    borrowed = [r for r in eligible if r.borrowed]
    lowest = min((r.priority for r in borrowed), default=None)
    first = sorted((r for r in borrowed if r.priority == lowest), key=lambda r: (-r.started_at, r.job_id))
    second = sorted((r for r in borrowed if r.priority != lowest), key=lambda r: (r.priority, -r.started_at, r.job_id))
    third = sorted((r for r in eligible if not r.borrowed and r.priority < priority),
                   key=lambda r: (r.priority, -r.started_at, r.job_id))
    return first + second + third


def cost(victims: Iterable[Running], now: float) -> float:
    """GPU-seconds of progress at risk: each victim's GPUs × how long it has run."""
    return sum(r.gpus * max(0.0, now - r.started_at) for r in victims)


def choose(candidates: Iterable[Running], need_gpus: int, *, priority: int, now: float,
           min_runtime_s: float) -> list[Running]:
    """The fewest victims, in yield order, that free `need_gpus`; [] when even all of them would not."""
    if need_gpus <= 0:
        return []
    picked: list[Running] = []
    freed = 0
    for r in order(candidates, priority=priority, now=now, min_runtime_s=min_runtime_s):
        picked.append(r)
        freed += r.gpus
        if freed >= need_gpus:
            return picked
    return []


class Tier(enum.StrEnum):
    """R6's response to the preemption rate."""

    FREE = "free"
    """Below warn_pct: preempt, no alarm."""
    WARN = "warn"
    """warn_pct up to limit_pct: preempt, and say so (an event)."""
    FLOOR = "floor"
    """limit_pct and above: only guaranteed jobs preempt; others queue, with an event naming what would go."""


def tier_for(rate_pct: float, warn_pct: float, limit_pct: float) -> Tier:
    if rate_pct >= limit_pct:
        return Tier.FLOOR
    if rate_pct >= warn_pct:
        return Tier.WARN
    return Tier.FREE


class Budget:
    """GPU-seconds preempted over the trailing hour, as a share of what the running fleet runs in an hour.

    rate = (cost of preemptions in the last hour + the proposed one) / (GPUs running now × 3600 s).
    """

    def __init__(self, warn_pct: float, limit_pct: float, window_s: float = WINDOW_S) -> None:
        self.warn_pct = warn_pct
        self.limit_pct = limit_pct
        self.window_s = window_s
        self._spent: deque[tuple[float, float]] = deque()

    def _trim(self, now: float) -> None:
        while self._spent and self._spent[0][0] <= now - self.window_s:
            self._spent.popleft()

    def rate_pct(self, now: float, running_gpus: int, proposed_gpu_s: float = 0.0) -> float:
        self._trim(now)
        spent = sum(c for _, c in self._spent) + proposed_gpu_s
        if spent <= 0:
            return 0.0
        if running_gpus <= 0:
            return 100.0
        return 100.0 * spent / (running_gpus * self.window_s)

    def tier(self, now: float, running_gpus: int, proposed_gpu_s: float) -> Tier:
        return tier_for(self.rate_pct(now, running_gpus, proposed_gpu_s), self.warn_pct, self.limit_pct)

    def spend(self, now: float, gpu_s: float) -> None:
        self._spent.append((now, gpu_s))


@dataclass(frozen=True, slots=True)
class Decision:
    victims: tuple[Running, ...]
    cost_gpu_s: float
    tier: Tier
    rate_pct: float
    go: bool
    """False: the budget holds this preemption back (FLOOR tier, a job above the floor)."""


def decide(budget: Budget, candidates: Sequence[Running], need_gpus: int, *, priority: int, guaranteed: bool,
           now: float, min_runtime_s: float, running_gpus: int) -> Decision | None:
    """Victims for a job that cannot be placed, and whether the budget lets it preempt; None: no victims."""
    victims = choose(candidates, need_gpus, priority=priority, now=now, min_runtime_s=min_runtime_s)
    if not victims:
        return None
    lost = cost(victims, now)
    rate = budget.rate_pct(now, running_gpus, lost)
    t = tier_for(rate, budget.warn_pct, budget.limit_pct)
    return Decision(tuple(victims), lost, t, rate, go=t is not Tier.FLOOR or guaranteed)
