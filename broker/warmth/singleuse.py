"""Single-use pods: created for one queued job, never reused, never left behind.

A single-use job takes only pods made for it (`reserved_for` its id). What a job still needs is derived
from the pods reserved for it that are starting or idle, never kept as a parallel count, so a failed
create or a retired pod is simply made again. A pod made for a job that is no longer waiting (cancelled,
failed, placed on other pods) is an orphan: no other job may ever take it, so it retires at once.

A custom image's pod (broker.images) is made for one job the same way: a mutable tag's is single-use; a
digest-pinned one's (`Origin.CUSTOM_IMAGE`) then serves its caller's jobs of that image, so it is an orphan
only while no job has used it.

A gang confined to one node or domain (broker.claiming.setsearch) that no pods in place could serve gets a
whole set made for it the same way, on one node (`Origin.DEMAND`, reserved for it): its pods are plain
pool pods once the gang runs, and if it leaves first they join the pool unused instead of retiring.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from broker.pods import Origin, Pod, PodState

_WAITING = (PodState.STARTING, PodState.IDLE)


def _made_for(pod: Pod) -> bool:
    return (pod.origin is Origin.SINGLE_USE or (pod.origin is Origin.CUSTOM_IMAGE and not pod.used)) \
        and pod.state in _WAITING


def wanted(jobs: Mapping[str, tuple[str, int]], pool: str, pods: Iterable[Pod]) -> list[tuple[str, int]]:
    """(job id, pods still to create) for the pool's unplaced single-use jobs, in dispatch order."""
    have = Counter(p.reserved_for for p in pods if _made_for(p))
    return [(job_id, n - have[job_id]) for job_id, (where, n) in jobs.items() if where == pool and n > have[job_id]]


def gang_hints(gangs: Iterable[tuple[str, int]], pods: Iterable[Pod], create: int) -> list[tuple[str, int]]:
    """(gang, world size) for each of `create` demand pods: the waiting gangs in dispatch order, each until
    it has its size in never-used starting or idle pods made for it; the rest get no hint."""
    have = Counter(p.gang for p in pods if p.gang and not p.used and p.state in _WAITING)
    out: list[tuple[str, int]] = []
    for job_id, size in gangs:
        out += [(job_id, size)] * max(0, size - have[job_id])
        if len(out) >= create:
            break
    return out[:create]


def orphans(pods: Iterable[Pod], waiting: Callable[[str], bool]) -> list[Pod]:
    """Starting or idle single-use pods whose job no longer waits for them (`waiting(job id)` is False)."""
    return [p for p in pods if _made_for(p) and (p.reserved_for is None or not waiting(p.reserved_for))]


def _made_for_set(pod: Pod) -> bool:
    return pod.origin is Origin.DEMAND and pod.reserved_for is not None and not pod.used and pod.state in _WAITING


def wanted_sets(sets: Mapping[str, tuple[str, int]], pool: str, pods: Iterable[Pod]) -> list[tuple[str, int]]:
    """(job id, pods still to create) for the pool's confined gangs waiting for a set, in dispatch order."""
    have = Counter(p.reserved_for for p in pods if _made_for_set(p))
    return [(job_id, n - have[job_id]) for job_id, (where, n) in sets.items() if where == pool and n > have[job_id]]


def made_on(pods: Iterable[Pod], job_id: str) -> list[str]:
    """The nodes of the pods already made for a job (starting or idle): the rest of its set joins them."""
    return [p.node for p in pods if p.reserved_for == job_id and not p.used and p.state in _WAITING and p.node]


def scattered(pods: Iterable[Pod], job_id: str) -> list[Pod]:
    """The pods made for a node-confined job that are not on the node holding most of them (a backend or a
    cluster scheduler placed its set apart): no node holds the set with them, and pods made for it are counted
    as its set, so while they stay reserved nothing more is made and the job waits until their keep-alive."""
    made = [p for p in pods if p.reserved_for == job_id and not p.used and p.state in _WAITING and p.node]
    on = Counter(p.node for p in made)
    if len(on) < 2:
        return []
    keep = max(sorted(on), key=on.__getitem__)
    return [p for p in made if p.node != keep]


def set_orphans(pods: Iterable[Pod], waiting: Callable[[str], bool]) -> list[Pod]:
    """Starting or idle pods made for a confined gang that no longer waits for them: they join the pool."""
    return [p for p in pods if _made_for_set(p) and not waiting(p.reserved_for or "")]
