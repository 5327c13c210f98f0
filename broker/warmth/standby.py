"""Zero-VRAM standby pods: GPU groups, and the staging plan that keeps standbys on each active GPU.

A group is the set of pods bound to one physical GPU (set): its active pod(s) and up to
`standbys_per_active` standbys pinned to the same card. A standby runs only the pod agent (no CUDA
context, no memory); the tracker hands it to a job when no same-owner or unheld idle pod exists and
promotes it at the per-GPU gate once the previous job's processes are verified gone. A group counts
as ONE physical GPU in every count, ceiling and budget (broker.warmth.scaling counts it through one member).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from broker.pods import Origin, Pod, PodState
from broker.pools import PoolSpec
from broker.ports.backend import PodInfo

GroupKey = tuple[str, ...]
"""The device keys a group's pods are bound to (a GPU UUID, or several for multi-GPU pods)."""

_LIVE = frozenset({PodState.STARTING, PodState.IDLE, PodState.ASSIGNED, PodState.RUNNING, PodState.RESETTING})
_UNCLAIMED = frozenset({PodState.STARTING, PodState.IDLE})


def group_key(pod: Pod) -> GroupKey:
    """The physical capacity a pod occupies: its devices, or the pod itself when it has none (yet)."""
    return pod.gpus if pod.gpus else (pod.name,)


@dataclass
class Group:
    """One card's pods, split by role."""

    key: GroupKey
    actives: list[Pod] = field(default_factory=list)
    """Live non-standby pods, and standbys already claimed by a job (they are being promoted)."""
    standbys: list[Pod] = field(default_factory=list)
    """Unclaimed standbys, starting or idle."""


def groups(pods: Iterable[Pod]) -> dict[GroupKey, Group]:
    """GPU groups of one pool's pods (pods without devices belong to none)."""
    out: dict[GroupKey, Group] = {}
    for pod in pods:
        if not pod.gpus or pod.state not in _LIVE:
            continue
        group = out.get(pod.gpus)
        if group is None:
            group = out[pod.gpus] = Group(pod.gpus)
        if pod.standby and pod.state in _UNCLAIMED:
            group.standbys.append(pod)
        else:
            group.actives.append(pod)
    return out


@dataclass(frozen=True)
class StandbyPlan:
    create: tuple[GroupKey, ...] = ()
    """One entry per standby to create, pinned to that group's devices."""
    retire: tuple[str, ...] = ()
    """Idle standbys to retire: over the per-card count, or alone on a card past the keep-alive."""


def plan_standbys(spec: PoolSpec, pods: Iterable[Pod], now: float) -> StandbyPlan:
    """Stage standbys into open slots of every card that has an active pod; retire unwanted ones.

    A card whose active pod is gone or retiring keeps its idle standbys for the pool's keep-alive:
    the next job that finds no idle pod claims one (the handover) without waiting for a new pod.
    A card held only by single-use or custom-image pods gets no standbys: no job of theirs can take one, and a
    standby left behind when the pod is deleted would hold the card for a keep-alive that such jobs wait out
    (at the ceiling, the standbys of a card with no active pod give way to them: broker.warmth.holds).
    """
    want = spec.standbys_per_active if spec.gpus > 0 else 0
    create: list[GroupKey] = []
    retire: list[str] = []
    for group in groups(pods).values():
        idle = sorted((p for p in group.standbys if p.state is PodState.IDLE), key=lambda p: p.idle_since)
        if want > 0 and any(p.origin is not Origin.SINGLE_USE and not p.image for p in group.actives):
            create.extend([group.key] * max(0, want - len(group.standbys)))
            excess = len(group.standbys) - want
            if excess > 0:
                retire.extend(p.name for p in idle[-excess:])
        elif want <= 0:
            retire.extend(p.name for p in idle)
        else:
            retire.extend(p.name for p in idle if now - p.idle_since >= spec.keep_alive)
    return StandbyPlan(tuple(create), tuple(retire))


def exclusive_cards(infos: Iterable[PodInfo]) -> set[str]:
    """Cards the backend reports shared by the pods of one pool only (a Firepool group, nothing else).

    The sweep that re-enables promotions after a restart; a card missing from the report is not in the
    result, so it stays fenced.
    """
    pools_on: dict[str, set[str]] = {}
    for info in infos:
        for key in info.gpus:
            pools_on.setdefault(key, set()).add(info.pool)
        for key in info.details.get("foreign", ()):  # a share held outside Firepool (the backend's sweep)
            pools_on.setdefault(key, set()).add("")
    return {key for key, pools in pools_on.items() if len(pools) == 1}
