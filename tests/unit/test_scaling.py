"""The scaler as App. A.5 defines it: one table of pool states over the paper's regimes and edge cases."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from broker.pods import Origin, Pod, PodState
from broker.pools import PoolSpec
from broker.warmth.holds import holds_to_break
from broker.warmth.pooling import count, plan

NOW = 1000.0

SERVERLESS = PoolSpec(name="p", min_count=0, max_idle_count=0, max_count=8, idle_timeout=60.0, step=8)
STATIC = PoolSpec(name="p", min_count=4, max_idle_count=4, max_count=4, idle_timeout=None, step=8)
TTL_POOL = PoolSpec(name="p", min_count=1, max_idle_count=2, max_count=6, idle_timeout=60.0, step=8)
STANDBY_POOL = PoolSpec(name="p", gpus=1, min_count=0, max_idle_count=2, max_count=3, idle_timeout=60.0,
                        standbys_per_active=1, step=8)


@dataclass
class P:
    """A pod in a table row: state plus the few fields that matter."""

    state: PodState
    used: bool = False
    caller: str | None = None
    hold_left: float = 0.0
    idle_for: float = 0.0
    origin: Origin = Origin.WARM
    stale: bool = False
    gpus: tuple[str, ...] = ()
    age: float = 3600.0
    extra: dict[str, object] = field(default_factory=dict)


def _build(spec: PoolSpec, rows: list[P]) -> list[Pod]:
    pods = []
    for i, r in enumerate(rows):
        pod = Pod(f"p{i}", spec.name, r.gpus, state=r.state, origin=r.origin,
                  template="old" if r.stale else spec.template_hash, created_at=NOW - r.age)
        pod.used = r.used
        pod.standby = r.origin is Origin.STANDBY and r.state in (PodState.STARTING, PodState.IDLE)
        if r.caller is not None:
            pod.caller = r.caller
            pod.key = (r.caller, "default", "")
        pod.hold_until = NOW + r.hold_left if r.used else 0.0
        pod.idle_since = NOW - r.idle_for
        pods.append(pod)
    return pods


def held(caller: str, **kw: object) -> P:
    return P(PodState.IDLE, used=True, caller=caller, hold_left=30.0, **kw)  # type: ignore[arg-type]


def fresh(idle_for: float = 0.0, **kw: object) -> P:
    return P(PodState.IDLE, idle_for=idle_for, **kw)  # type: ignore[arg-type]


CASES: list[tuple[str, PoolSpec, list[P], int, dict[str, int], Callable[..., bool]]] = [
    # (name, spec, pods, queued pods, queued by caller, check(plan, counts))
    ("serverless: nothing at zero demand", SERVERLESS, [], 0, {},
     lambda p, c: p.create == 0 and p.retire == ()),
    ("serverless: queued demand creates pods", SERVERLESS, [], 3, {"a": 3},
     lambda p, c: p.create == 3 and "demand" in p.reason),
    ("serverless: warm pods inside keep-alive stay", SERVERLESS, [fresh(30.0), fresh(59.0)], 0, {},
     lambda p, c: p.retire == ()),
    ("serverless: every pod past keep-alive retires (idle cap 0)", SERVERLESS, [fresh(61.0), fresh(90.0)], 0, {},
     lambda p, c: sorted(p.retire) == ["p0", "p1"]),
    ("static: the floor is created at zero demand", STATIC, [], 0, {},
     lambda p, c: p.create == 4 and "floor" in p.reason),
    ("static: no keep-alive, pods are kept forever", STATIC, [fresh(10**6)] * 4, 0, {},
     lambda p, c: p.create == 0 and p.retire == ()),
    ("static: demand past the ceiling creates nothing", STATIC, [P(PodState.RUNNING)] * 4, 5, {"a": 5},
     lambda p, c: p.create == 0 and "ceiling" in p.reason),
    ("single-use pods occupy the ceiling but not the floor",
     dataclasses.replace(TTL_POOL, min_count=2, max_count=3),
     [P(PodState.RUNNING, origin=Origin.SINGLE_USE)] * 2, 0, {},
     lambda p, c: c.physical == 2 and c.single_use == 2 and p.create == 1 and "floor" in p.reason),
    ("single-use pods are never supply for warm demand", TTL_POOL,
     [P(PodState.IDLE, origin=Origin.SINGLE_USE)], 1, {"a": 1},
     lambda p, c: p.create == 1 and c.eligible == 0),
    ("starting pods are supply: no second wave", TTL_POOL, [P(PodState.STARTING)] * 2, 2, {"a": 2},
     lambda p, c: p.create == 0),
    ("held pods count toward the ceiling but are not supply for others",
     dataclasses.replace(TTL_POOL, max_count=3), [held("bob"), held("bob"), held("carol")], 1, {"alice": 1},
     lambda p, c: p.create == 0 and c.physical == 3 and c.eligible == 0 and "ceiling" in p.reason),
    ("held pods count toward the floor", dataclasses.replace(TTL_POOL, min_count=2), [held("bob"), held("bob")],
     0, {}, lambda p, c: p.create == 0),
    ("a held pod matched by its owner's queued job is idle for that owner", TTL_POOL,
     [held("alice"), held("bob")], 1, {"alice": 1},
     lambda p, c: p.create == 0 and c.held_matched == 1 and c.eligible == 1),
    ("an owner's held pods are supply only up to its own queued pods", TTL_POOL,
     [held("alice"), held("alice"), held("alice")], 1, {"alice": 1},
     lambda p, c: c.held_matched == 1 and p.create == 0),
    ("expired holds retire even below the idle cap", TTL_POOL,
     [P(PodState.IDLE, used=True, caller="bob", hold_left=-1.0), P(PodState.RUNNING)], 0, {},
     lambda p, c: p.retire == ("p0",)),
    ("stale pods occupy capacity but are not supply", dataclasses.replace(TTL_POOL, max_count=3),
     [fresh(stale=True), fresh(stale=True)], 2, {"a": 2},
     lambda p, c: c.stale == 2 and c.physical == 2 and c.eligible == 0 and p.create == 1),
    ("standby groups count once: standbys are neither physical nor supply", STANDBY_POOL,
     [P(PodState.RUNNING, gpus=("g0",)), P(PodState.IDLE, origin=Origin.STANDBY, gpus=("g0",)),
      P(PodState.RUNNING, gpus=("g1",)), P(PodState.IDLE, origin=Origin.STANDBY, gpus=("g1",))], 1, {"a": 1},
     lambda p, c: c.physical == 2 and c.standby == 2 and p.create == 1),
    ("a promoted standby and the old pod on its GPU are one group", STANDBY_POOL,
     [P(PodState.RUNNING, origin=Origin.STANDBY, gpus=("g0",)), held("bob", gpus=("g0",))], 0, {},
     lambda p, c: c.physical == 1 and c.running == 1 and c.held == 0),
    ("a standby whose active pod is gone still holds its GPU: the group counts through it", STANDBY_POOL,
     [P(PodState.IDLE, origin=Origin.STANDBY, gpus=("g0",)), P(PodState.STARTING, origin=Origin.STANDBY)], 0, {},
     lambda p, c: c.physical == 1 and c.standby == 1),
    ("standby grouping is only for standby pools: pods pinned to one GPU count apiece", TTL_POOL,
     [P(PodState.RUNNING, gpus=("g0",)), P(PodState.IDLE, used=True, caller="a", hold_left=5.0, gpus=("g0",))],
     0, {}, lambda p, c: c.physical == 2 and c.held == 1),
    ("a busy pod retiring at release is not replaced when a standby waits on its card", STANDBY_POOL,
     [P(PodState.RUNNING, gpus=("g0",), extra={"retire": True}), P(PodState.IDLE, origin=Origin.STANDBY,
                                                                   gpus=("g0",))], 0, {},
     lambda p, c: c.replacing == 0 and p.create == 0),
    ("scale-down keeps the idle cap", TTL_POOL, [fresh(100.0)] * 4, 0, {},
     lambda p, c: len(p.retire) == 2),
    ("scale-down never goes below the floor", dataclasses.replace(TTL_POOL, min_count=3, max_idle_count=0),
     [fresh(100.0)] * 4, 0, {}, lambda p, c: len(p.retire) == 1),
    ("scale-down keeps idle pods queued demand is about to take", dataclasses.replace(TTL_POOL, max_idle_count=0),
     [fresh(100.0)] * 3 + [P(PodState.RUNNING)], 2, {"a": 2},
     lambda p, c: p.create == 0 and len(p.retire) == 1),
    ("the idle cap is bounded by ceiling − (physical − idle) after a lowered ceiling",
     dataclasses.replace(TTL_POOL, max_count=3, max_idle_count=4, min_count=0),
     [fresh(100.0)] * 2 + [P(PodState.RUNNING)] * 2, 0, {},
     lambda p, c: len(p.retire) == 1),
    ("step caps creations per pass", dataclasses.replace(SERVERLESS, step=2), [], 5, {"a": 5},
     lambda p, c: p.create == 2),
    ("a busy pod crossing a session boundary is replaced while it runs", TTL_POOL,
     [P(PodState.RUNNING, extra={"retire": True})], 0, {},
     lambda p, c: c.replacing == 1 and p.create == 1),
]


@pytest.mark.parametrize("name, spec, rows, demand, queued_by, check", CASES, ids=[c[0] for c in CASES])
def test_scaler_table(name: str, spec: PoolSpec, rows: list[P], demand: int, queued_by: dict[str, int],
                      check: Callable[..., bool]) -> None:
    pods = _build(spec, rows)
    for pod, row in zip(pods, rows, strict=True):
        for k, v in row.extra.items():
            setattr(pod, k, v)
    counts = count(pods, spec, NOW, queued_by)
    p = plan(spec, pods, counts, demand, NOW)
    assert check(p, counts), (p, counts)


@pytest.mark.parametrize("headroom, expected", [(None, 4), (2, 2), (0, 0)])
def test_headroom_from_the_budget_caps_creation(headroom: int | None, expected: int) -> None:
    pods: list[Pod] = []
    p = plan(SERVERLESS, pods, count(pods, SERVERLESS, NOW), 4, NOW, headroom)
    assert p.create == expected
    if headroom == 0:
        assert "budget" in p.reason


def test_the_floor_leaves_the_room_queued_single_use_jobs_need() -> None:
    spec = dataclasses.replace(STATIC, min_count=4, max_count=4)
    pods = _build(spec, [fresh()] * 2)
    assert plan(spec, pods, count(pods, spec, NOW), 0, NOW).create == 2
    assert plan(spec, pods, count(pods, spec, NOW), 0, NOW, single_use=1).create == 1
    assert plan(spec, pods, count(pods, spec, NOW), 0, NOW, single_use=2).create == 0
    busy = _build(spec, [P(PodState.RUNNING)] * 2)
    assert plan(spec, busy, count(busy, spec, NOW), 2, NOW, single_use=2).create == 2  # queued warm jobs come first


def test_held_pods_give_way_beyond_what_their_owners_queued_jobs_can_take() -> None:
    spec = dataclasses.replace(TTL_POOL, max_count=5)
    pods = _build(spec, [held("alice"), held("alice"), held("alice"), held("bob"), fresh(5.0)])
    # alice's one queued warm pod spares one of her holds (the newest); bob has nothing queued
    broken = holds_to_break(pods, 5, {"alice": 1}, NOW)
    assert sum(p.caller == "alice" for p in broken) == 2 and sum(p.caller == "bob" for p in broken) == 1
    # a never-used idle pod gives way only beyond the queued warm demand (a single-use job cannot take it)
    assert "p4" in {p.name for p in holds_to_break(pods, 5, {"alice": 1}, NOW, warm_demand=0)}
    assert "p4" not in {p.name for p in holds_to_break(pods, 5, {"alice": 1}, NOW, warm_demand=1)}
    # pods younger than the tenure keep their holds
    young = _build(spec, [held("bob", age=10.0)])
    assert holds_to_break(young, 1, {}, NOW) == []
