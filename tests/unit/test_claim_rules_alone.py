"""Each claim rule works over the tracker's state alone: no Tracker, no other rule module needed to test it."""

from __future__ import annotations

from broker.claiming.releasing import Releasing
from broker.claiming.reserving import Reservation
from broker.claiming.searching import Search
from broker.claiming.tracking import REASON_NO_SESSION_POD, Claim, Lease, Shortfall, TrackerState
from broker.pods import Origin, Path, Pod, PodState
from broker.pools import PoolSpec

POOL = "p"


def _state(*pods: Pod) -> TrackerState:
    state = TrackerState({POOL: PoolSpec(name=POOL, gpus=1, max_count=100)})
    for pod in pods:
        state.pods[pod.name] = pod
        state.index_idle(pod)
    return state


def _idle(name: str, gpu: str, key: tuple[str, str, str] | None = None) -> Pod:
    pod = Pod(name, POOL, state=PodState.IDLE, origin=Origin.WARM, gpus=(gpu,))
    if key is not None:
        pod.key, pod.caller = key, key[0]
    return pod


def test_search_over_a_bare_state_takes_the_session_pod_warm_before_a_never_used_one() -> None:
    state = _state(_idle("fresh", "g0"), _idle("mine", "g1", ("alice", "default", "s1")))
    bucket = state.buckets[POOL]
    picked = Search(state).pick(bucket, Claim("j1", "alice", POOL, "default", "s1"))
    assert [(pod.name, path) for pod, path, _ in picked] == [("mine", Path.WARM)]
    other = Search(state).pick(bucket, Claim("j2", "bob", POOL, "default", "s9", since=1.0))  # idle before it came
    assert [(pod.name, reason) for pod, _, reason in other] == [("fresh", REASON_NO_SESSION_POD)]


def test_search_over_a_bare_state_falls_short_when_a_card_is_gated_by_another_pod() -> None:
    state = _state(_idle("only", "g0"))
    state.gate["g0"] = "someone-else"
    short = Search(state).pick(state.buckets[POOL], Claim("j1", "alice", POOL))
    assert isinstance(short, Shortfall) and short.missing == 1


def test_releasing_retires_a_released_pod_when_the_gang_rule_it_is_given_wants_the_room() -> None:
    pod = Pod("p0", POOL, state=PodState.RUNNING, origin=Origin.WARM, gpus=("g0",))
    state = _state()
    state.pods[pod.name] = pod
    wanted: list[str] = []

    def makes_room(p: Pod) -> bool:
        wanted.append(p.name)
        return True

    releasing = Releasing(state, makes_room)
    state.gangs[POOL] = [Reservation("gang", "bob", POOL, 2, (0, 0.0, "gang"), 0.0)]  # a gang waits: the rule is asked
    state.usage["alice"] = [1, 1]
    state.leases["j1"] = Lease("j1", "alice", (pod,), 1)
    releasing.release("j1", ("alice", "default", "s1"), 1.0, 60.0)
    assert wanted == ["p0"] and pod.state is PodState.RETIRING
    assert state.usage["alice"] == [0, 0]
