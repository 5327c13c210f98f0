"""The tracker under contention: one lock, no double claims, quotas hold, indexes stay consistent."""

from __future__ import annotations

import threading

from broker.claiming.tracker import REASON_SESSION_RESETTING, Claim, Lease, Shortfall, Tracker
from broker.pods import Origin, Pod, PodState
from broker.pools import CallerLimits, PoolSpec

POOL = PoolSpec(name="p", gpus=1, max_count=10_000)


def _tracker(n: int, limits: dict[str, CallerLimits] | None = None) -> Tracker:
    t = Tracker({"p": POOL}, limits)
    for i in range(n):
        t.add(Pod(f"p{i}", "p", state=PodState.STARTING, origin=Origin.WARM))
        t.ready(f"p{i}", 0.0, (f"gpu{i}",))
    return t


def test_32_threads_never_claim_one_pod_twice() -> None:
    t = _tracker(64)
    owners: dict[str, str] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        for i in range(400):
            job = f"w{w}-{i}"
            got = t.claim(Claim(job, f"c{w % 5}", "p", tag=str(w), pods=1 + (i % 3)), 0.0)
            if isinstance(got, Shortfall):
                continue
            with lock:
                for pod in got.pods:
                    if pod.name in owners:
                        errors.append(f"{pod.name} claimed by {job} while {owners[pod.name]} holds it")
                    owners[pod.name] = job
            if not t.start(job):
                errors.append(f"{job} could not start on its own pods")
            with lock:
                for pod in got.pods:
                    del owners[pod.name]
            t.release(job, (f"c{w % 5}", "default", str(w)), 0.0, 0.0)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(32)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    # nothing is left mid-lease
    assert {p.state for p in t.snapshot()} <= {PodState.IDLE, PodState.RETIRING}
    assert all(t.usage(f"c{i}") == (0, 0) for i in range(5))


def test_a_gang_takes_all_or_nothing() -> None:
    t = _tracker(3)
    assert isinstance(t.claim(Claim("a", "alice", "p", pods=2), 0.0), Lease)
    short = t.claim(Claim("g", "bob", "p", pods=2), 0.0)
    assert isinstance(short, Shortfall) and short.missing == 1
    assert sum(p.state is PodState.IDLE for p in t.snapshot()) == 1


def test_caller_limits_are_checked_in_the_claim() -> None:
    t = _tracker(8, {"alice": CallerLimits(max_gpus=2), "default": CallerLimits(max_pods=1)})
    assert isinstance(t.claim(Claim("a1", "alice", "p", pods=2), 0.0), Lease)
    assert t.claim(Claim("a2", "alice", "p"), 0.0) == Shortfall("caller quota", 1)
    assert isinstance(t.claim(Claim("b1", "bob", "p"), 0.0), Lease)
    assert t.claim(Claim("b2", "bob", "p"), 0.0) == Shortfall("caller quota", 1)
    t.unclaim("a1", 0.0)
    assert isinstance(t.claim(Claim("a2", "alice", "p"), 0.0), Lease)


def test_held_pods_serve_only_their_owner_and_at_the_ceiling_a_new_session_takes_over_and_keeps_the_pod() -> None:
    t = Tracker({"p": PoolSpec(name="p", gpus=1, max_count=1)})
    t.add(Pod("p0", "p", state=PodState.STARTING, origin=Origin.WARM))
    t.ready("p0", 0.0, ("gpu0",))
    lease = t.claim(Claim("j1", "alice", "p", tag="s1", since=1.0), 1.0)  # the pod was ready first
    assert isinstance(lease, Lease) and lease.pods[0].path == "warm"
    t.start("j1")
    t.release("j1", ("alice", "default", "s1"), 1.0, 60.0)
    assert t.claim(Claim("b", "bob", "p"), 2.0) == Shortfall("no idle pod", 1)
    again = t.claim(Claim("j2", "alice", "p", tag="s2"), 2.0)
    assert isinstance(again, Lease) and again.pods[0].path == "recycled" and not again.pods[0].retire
    t.start("j2")
    t.begin_reset("j2", ("alice", "default", "s2"))
    assert t.finish_reset(again.pods[0].name, True, 3.0, 60.0) is True
    assert again.pods[0].state is PodState.IDLE and again.pods[0].key == ("alice", "default", "s2")
    back = t.claim(Claim("j3", "alice", "p", tag="s1", recycle=False), 4.0)
    assert isinstance(back, Lease) and back.pods[0].path == "recycled"
    assert (back.pods[0].reason or "").startswith("session s1's pod was taken by your session s2 at the pool ceiling")


def test_the_gate_blocks_a_second_pod_on_a_busy_gpu() -> None:
    t = Tracker({"p": POOL})
    for name in ("a", "b"):
        t.add(Pod(name, "p", state=PodState.STARTING))
        t.ready(name, 0.0, ("gpu0",))
    first = t.claim(Claim("j1", "alice", "p"), 0.0)
    assert isinstance(first, Lease) and t.start("j1")
    assert t.claim(Claim("j2", "bob", "p"), 0.0) == Shortfall("no idle pod", 1)
    t.begin_reset("j1", ("alice", "default", ""))
    assert t.claim(Claim("j2", "bob", "p"), 0.0) == Shortfall("no idle pod", 1)  # not verified yet
    t.finish_reset(first.pods[0].name, True, 1.0, 60.0)
    assert isinstance(t.claim(Claim("j2", "bob", "p"), 1.0), Lease)


def test_a_session_waits_for_its_resetting_pod_instead_of_taking_another() -> None:
    t = _tracker(2)
    key = ("alice", "default", "conv")
    first = t.claim(Claim("j1", "alice", "p", tag="conv"), 0.0)
    assert isinstance(first, Lease) and t.start("j1")
    [pod] = t.begin_reset("j1", key)
    waiting = t.claim(Claim("j2", "alice", "p", tag="conv"), 1.0)
    assert isinstance(waiting, Shortfall) and waiting.reason == REASON_SESSION_RESETTING
    other = t.claim(Claim("j3", "alice", "p", tag="other-conv"), 1.0)
    assert isinstance(other, Lease) and other.pods[0].name != pod.name  # only that session waits
    assert t.finish_reset(pod.name, True, 2.0, 60.0)
    again = t.claim(Claim("j2", "alice", "p", tag="conv"), 2.0)
    assert isinstance(again, Lease) and again.pods[0].name == pod.name


def test_a_failed_reset_stops_the_session_waiting() -> None:
    t = _tracker(2)
    first = t.claim(Claim("j1", "alice", "p", tag="conv"), 0.0)
    assert isinstance(first, Lease) and t.start("j1")
    [pod] = t.begin_reset("j1", ("alice", "default", "conv"))
    assert not t.finish_reset(pod.name, False, 1.0, 60.0)
    got = t.claim(Claim("j2", "alice", "p", tag="conv"), 1.0)
    assert isinstance(got, Lease) and got.pods[0].name != pod.name
