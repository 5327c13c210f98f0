"""What one dispatch pass gathers: the demand it reports to the pool controller, and the shapes of like jobs.

A pass walks the whole queue. In a deep queue of like jobs (a fan-out of a thousand rollouts) every job after
the first that took nothing would take nothing too: nothing a pass does frees a pod. So jobs of one `shape`
share the first one's claim and are tallied together, and a pass costs a claim per shape, not per job.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from broker.jobs import Job


@dataclass
class Tally:
    """The queue's demand as one pass saw it (the arguments of `PoolController.report_demand`)."""

    demand: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    single_use: dict[str, tuple[str, int]] = field(default_factory=dict)
    queued_by: defaultdict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    over_quota: defaultdict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    images: dict[str, tuple[str, bool]] = field(default_factory=dict)
    gangs: defaultdict[str, list[tuple[str, int]]] = field(default_factory=lambda: defaultdict(list))
    sets: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Gangs confined to one node or domain: the controller makes each a whole set there (job -> pool, pods)."""
    where: dict[str, str] = field(default_factory=dict)
    """job -> `node` | `domain` for every confined gang above and confined single-use set."""
    owners: dict[str, tuple[tuple[str, str, str], bool]] = field(default_factory=dict)
    """job -> (session, recycle) of each of those sets: its caller's held pods beside which the rest is made."""
    takers: defaultdict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    """pool -> caller -> pods of queued jobs that take the caller's held pods only at the ceiling (takeovers)."""

    @staticmethod
    def add(counts: defaultdict[str, dict[str, int]], pool: str, caller: str, pods: int) -> None:
        by = counts[pool]
        by[caller] = by.get(caller, 0) + pods


Shape = tuple[object, ...]


def shape(job: Job) -> Shape | None:
    """What a one-pod job's claim depends on besides its place in the queue; None where the claim is the job's
    own (a gang's reservation, a single-use or custom-image pod made for it)."""
    spec = job.spec
    if spec.pods != 1 or spec.own_pods or spec.image:
        return None
    return (job.caller, spec.pool, spec.queue, spec.lease_tag, spec.recycle, spec.timeout_s, job.priority,
            spec.topology, bool(spec.extra.get("preemptible")))
