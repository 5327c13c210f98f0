"""Standby handover (DESIGN "Standby"), pinned on the virtual clock with the fake backend."""

from __future__ import annotations

from broker.api.metrics import registry_for, render
from broker.claiming.tracker import Claim, Lease, Tracker
from broker.clock import VirtualClock
from broker.errors import BackendError
from broker.jobs import JobState
from broker.pods import Origin, Pod, PodState
from broker.ports.agent import ResetRequest, ResetResult
from broker.ports.backend import FakeBackend, PodInfo
from broker.warmth.pooling import count
from broker.warmth.standby import exclusive_cards, plan_standbys
from tests.unit.harness import Harness, gpu_pool


def standbys(h: Harness) -> list[Pod]:
    return [p for p in h.cp.tracker.snapshot() if p.standby and p.state is not PodState.GONE]


async def harness(**pool: object) -> Harness:
    pool.setdefault("standbys_per_active", 1)
    h = Harness([gpu_pool(**pool)], backend=FakeBackend(VirtualClock(), gpus=2, memory_mb=143_771))
    h.backend.clock = h.clock
    return await h.start()


async def test_standbys_are_staged_on_the_active_pods_gpu_and_count_once() -> None:
    h = await harness(standbys_per_active=2)
    try:
        job = await h.run_job(pool="gpu", lease_tag="a")
        await h.run_for(1.0)
        active = h.cp.tracker.pods[job.pods[0]]
        staged = standbys(h)
        assert len(staged) == 2
        assert all(p.gpus == active.gpus and p.state is PodState.IDLE for p in staged)
        assert all(h.backend.pods[p.name].gpus == active.gpus for p in staged)  # pinned by the backend
        c = count(h.cp.tracker.snapshot(), h.cp.catalog.pools["gpu"], h.clock.now())
        assert (c.physical, c.standby, c.idle + c.held) == (1, 2, 1)
        assert h.cp.pools_view()[0]["standby"] == 2
        metrics = render(registry_for(h.cp)).decode()
        assert 'firepool_pods{pool="gpu",state="standby"} 2.0' in metrics
    finally:
        await h.stop()


async def test_a_job_takes_a_standby_only_when_no_owner_or_unheld_idle_pod_exists() -> None:
    h = await harness(max_count=1)
    try:
        alice = await h.run_job("alice", pool="gpu", lease_tag="a")
        await h.run_for(1.0)
        again = await h.run_job("alice", pool="gpu", lease_tag="a")
        assert h.paths(again) == ["warm"]  # the owner's idle pod beats the standby
        bob = await h.run_job("bob", pool="gpu", lease_tag="b")
        assert h.paths(bob) == ["standby"]  # alice's pod is held for her: bob gets the standby
        assert bob.pods != alice.pods
        assert "standby" in (bob.acquisition[0].reason or "")
        assert h.cp.tracker.pods[alice.pods[0]].state is PodState.IDLE  # still held for alice
    finally:
        await h.stop()


async def test_promotion_waits_until_the_previous_jobs_reset_is_verified() -> None:
    h = await harness(max_count=1, reuse_tag="retire")  # the paper's rule: a boundary-crossing pod retires
    try:
        first = await h.run_job("alice", pool="gpu", lease_tag="a")
        await h.run_for(1.0)
        old = first.pods[0]
        agent = h.backend.agents[old]
        real_reset = agent.reset
        verified_at: list[float] = []

        async def slow_reset(request: ResetRequest) -> ResetResult:
            await h.clock.sleep(2.0)  # killing and verifying the tree takes a while
            result = await real_reset(request)
            verified_at.append(h.clock.now())
            return result

        agent.reset = slow_reset  # type: ignore[method-assign]
        running = await h.submit("alice", pool="gpu", lease_tag="b", command=("sleep", "3"))
        await h.until(lambda: h.store.get(running.id).state is JobState.RUNNING)  # type: ignore[union-attr]
        handover = await h.submit("alice", pool="gpu", lease_tag="c")
        await h.run_for(1.0)
        claimed = h.cp.tracker.pods_of(handover.id)
        assert len(claimed) == 1 and claimed[0].path == "standby"
        assert claimed[0].state is PodState.ASSIGNED and claimed[0].standby  # waiting at the gate
        assert h.backend.agents[claimed[0].name].launches == []
        done = await h.finish(handover)
        assert done.state is JobState.SUCCEEDED and h.paths(done) == ["standby"]
        launched_at = done.attempts[-1].launched_at
        assert verified_at and launched_at is not None and launched_at >= verified_at[0]
        promoted = h.cp.tracker.pods.get(done.pods[0])
        assert promoted is None or not promoted.standby
        await h.run_for(1.0)
        assert old in h.backend.deleted  # the boundary-crossing pod retired off the critical path
        assert len(standbys(h)) == 1  # a fresh standby was staged into the open slot
    finally:
        await h.stop()


async def test_a_recycled_pod_with_a_standby_is_not_replaced_by_a_new_pod() -> None:
    h = await harness(max_count=2, reuse_tag="retire")
    try:
        await h.run_job("alice", pool="gpu", lease_tag="a")
        await h.run_for(1.0)
        created = len(h.backend.created)
        crossing = await h.run_job("alice", pool="gpu", lease_tag="b", command=("sleep", "2"))
        assert h.paths(crossing) == ["recycled"]
        assert len(h.backend.created) == created  # the standby covers the boundary
        handover = await h.run_job("alice", pool="gpu", lease_tag="c")
        assert h.paths(handover) == ["standby"]
    finally:
        await h.stop()


async def test_the_job_process_gets_the_full_cards_memory_limit_and_the_pod_spec_does_not() -> None:
    h = await harness()
    try:
        job = await h.run_job("alice", pool="gpu", lease_tag="a")
        launch = h.backend.agents[job.pods[0]].launches[0]
        assert launch.env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "143771m"
        await h.run_for(1.0)
        for pod in standbys(h):
            info = h.backend.pods[pod.name]
            assert not any(k.startswith("CUDA_DEVICE_MEMORY") for k in info.annotations)
        cpu_env = await h.submit("alice", pool="gpu", lease_tag="a", env={"CUDA_DEVICE_MEMORY_LIMIT_0": "1m"})
        assert "CUDA_DEVICE_MEMORY_LIMIT_0" in {d["name"] for d in cpu_env.dropped_env}
    finally:
        await h.stop()


def _tracker_with_group() -> tuple[Tracker, Pod, Pod]:
    tracker = Tracker({"gpu": gpu_pool(standbys_per_active=1)})
    active = Pod("a", "gpu", ("g0",), state=PodState.IDLE)
    standby = Pod("s", "gpu", ("g0",), state=PodState.IDLE, origin=Origin.STANDBY)
    standby.standby = True
    tracker.add(active)
    tracker.add(standby)
    assert tracker.unverified_cards() == {"g0"}  # added idle, as recovery does: fenced
    tracker.verify_cards(["g0"])
    return tracker, active, standby


def test_an_unclean_reset_keeps_the_gate_closed_until_the_pod_is_deleted() -> None:
    tracker, active, standby = _tracker_with_group()
    first = tracker.claim(Claim("j1", "alice", "gpu", tag="a"), 0.0)
    assert isinstance(first, Lease) and first.pods == (active,) and tracker.start("j1")
    second = tracker.claim(Claim("j2", "alice", "gpu", tag="b"), 1.0)
    assert isinstance(second, Lease) and second.pods == (standby,)
    assert not tracker.start("j2")  # the card still runs j1
    tracker.begin_reset("j1", ("alice", "default", "a"))
    assert not tracker.start("j2")
    tracker.finish_reset("a", False, 2.0, 60.0)  # processes not verified gone
    assert not tracker.start("j2")
    tracker.remove("a")  # the backend deleted the pod and everything in it
    assert tracker.start("j2") and not standby.standby and standby.state is PodState.RUNNING


def test_a_clean_reset_promotes_the_claimed_standby() -> None:
    tracker, active, standby = _tracker_with_group()
    assert isinstance(tracker.claim(Claim("j1", "alice", "gpu", tag="a"), 0.0), Lease) and tracker.start("j1")
    assert isinstance(tracker.claim(Claim("j2", "bob", "gpu", tag="b"), 1.0), Lease)
    tracker.begin_reset("j1", ("alice", "default", "a"))
    assert not tracker.start("j2")
    assert tracker.finish_reset("a", True, 2.0, 60.0)  # held for alice, off the critical path
    assert tracker.start("j2") and not standby.standby
    # alice's held pod shares the card: it waits at the gate until bob's job is done.
    again = tracker.claim(Claim("j3", "alice", "gpu", tag="a"), 3.0)
    assert not isinstance(again, Lease)


def test_a_gang_never_takes_two_pods_of_one_card() -> None:
    tracker, active, standby = _tracker_with_group()
    other = Pod("b", "gpu", ("g1",), state=PodState.IDLE)
    tracker.add(other)
    lease = tracker.claim(Claim("gang", "alice", "gpu", tag="a", pods=2), 0.0)
    assert isinstance(lease, Lease)
    assert {p.gpus for p in lease.pods} == {("g0",), ("g1",)}
    assert standby not in lease.pods


def test_standby_plan_fills_open_slots_and_retires_lonely_or_excess_standbys() -> None:
    spec = gpu_pool(standbys_per_active=2, idle_timeout=60.0)
    active = Pod("a", "gpu", ("g0",), state=PodState.RUNNING)
    mine = Pod("s1", "gpu", ("g0",), state=PodState.IDLE, created_at=0.0)
    mine.standby = True
    assert plan_standbys(spec, [active, mine], 10.0).create == (("g0",),)
    lonely = Pod("s2", "gpu", ("g1",), state=PodState.IDLE, created_at=0.0)
    lonely.standby = True
    staged = plan_standbys(spec, [active, mine, lonely], 30.0)
    assert staged.retire == ()  # a card whose active left keeps its standby for the keep-alive
    assert plan_standbys(spec, [active, mine, lonely], 61.0).retire == ("s2",)
    off = gpu_pool(standbys_per_active=0)
    assert set(plan_standbys(off, [active, mine, lonely], 1.0).retire) == {"s1", "s2"}


def test_a_card_held_only_by_a_single_use_pod_gets_no_standby() -> None:
    spec = gpu_pool(standbys_per_active=1)
    single = Pod("a", "gpu", ("g0",), state=PodState.RUNNING, origin=Origin.SINGLE_USE)
    assert plan_standbys(spec, [single], 10.0).create == ()
    warm = Pod("b", "gpu", ("g1",), state=PodState.RUNNING)
    assert plan_standbys(spec, [single, warm], 10.0).create == (("g1",),)


def test_a_standby_on_a_free_or_resetting_card_is_taken_before_one_behind_a_running_job() -> None:
    tracker = Tracker({"gpu": gpu_pool(standbys_per_active=1)})
    pods = {}
    for name, card in (("a0", "g0"), ("a1", "g1"), ("s0", "g0"), ("s1", "g1")):
        pods[name] = Pod(name, "gpu", (card,), state=PodState.IDLE,
                         origin=Origin.STANDBY if name.startswith("s") else Origin.WARM)
        pods[name].standby = name.startswith("s")
        tracker.add(pods[name])
    tracker.verify_cards(["g0", "g1"])
    for job, caller in (("j0", "alice"), ("j1", "bob")):
        lease = tracker.claim(Claim(job, caller, "gpu", tag="t"), 0.0)
        assert isinstance(lease, Lease) and tracker.start(job)
    ending = tracker.pods_of("j1")[0]
    tracker.begin_reset("j1", ("bob", "default", "t"))  # bob's job ended: its card is resetting
    handover = tracker.claim(Claim("j2", "carol", "gpu", tag="t"), 1.0)
    assert isinstance(handover, Lease) and handover.pods[0].standby
    assert handover.pods[0].gpus == ending.gpus  # not the standby behind alice's running job


def test_a_standby_is_not_taken_on_a_card_whose_claimed_job_has_not_started_yet() -> None:
    """Two claims in one dispatch round: the first job takes card g0 at launch, so the second caller's standby
    comes from g1 instead of queueing at g0's gate behind it while g1 sits unused."""
    tracker = Tracker({"gpu": gpu_pool(standbys_per_active=1)})
    for name, card in (("a0", "g0"), ("s0", "g0"), ("s1", "g1")):  # g1's active pod has retired
        pod = Pod(name, "gpu", (card,), state=PodState.IDLE, origin=Origin.STANDBY if name[0] == "s" else Origin.WARM)
        pod.standby = name[0] == "s"
        tracker.add(pod)
    tracker.verify_cards(["g0", "g1"])
    first = tracker.claim(Claim("j0", "alice", "gpu", tag="t"), 0.0)
    assert isinstance(first, Lease) and first.pods[0].name == "a0"  # claimed, not launched: g0's gate is open
    second = tracker.claim(Claim("j1", "bob", "gpu", tag="t"), 0.0)
    assert isinstance(second, Lease) and second.pods[0].name == "s1"
    assert tracker.start("j0") and tracker.start("j1")  # both run at once, one card each


def test_a_caller_crossing_its_session_boundary_takes_the_standby_on_its_own_card_not_anothers() -> None:
    """Bob is between steps on g1 (his pod held for him), alice's job ended on g0 and her next job has a new
    tag: her standby comes from g0, the card she leaves, so bob's next step does not queue behind her."""
    tracker = Tracker({"gpu": gpu_pool(standbys_per_active=1, reuse_tag="retire")})
    for name, card in (("a1", "g1"), ("a0", "g0"), ("s1", "g1"), ("s0", "g0")):  # newest fresh pod first
        pod = Pod(name, "gpu", (card,), state=PodState.IDLE, origin=Origin.STANDBY if name[0] == "s" else Origin.WARM)
        pod.standby = name[0] == "s"
        tracker.add(pod)
    tracker.verify_cards(["g0", "g1"])
    for job, caller, want in (("j0", "alice", "a0"), ("j1", "bob", "a1")):
        lease = tracker.claim(Claim(job, caller, "gpu", tag="t1"), 0.0)
        assert isinstance(lease, Lease) and lease.pods[0].name == want and tracker.start(job)
        tracker.release(job, (caller, "default", "t1"), 1.0, hold_seconds=60.0)
    once = tracker.claim(Claim("j2", "alice", "gpu", tag="t2"), 2.0)  # runs once on her old pod, which retires
    assert isinstance(once, Lease) and once.pods[0].name == "a0" and tracker.start("j2")
    tracker.release("j2", ("alice", "default", "t2"), 3.0, hold_seconds=60.0)
    handover = tracker.claim(Claim("j3", "alice", "gpu", tag="t3"), 4.0)
    assert isinstance(handover, Lease) and handover.pods[0].name == "s0"


async def test_after_a_restart_standbys_are_promoted_only_once_a_sweep_verified_their_card() -> None:
    h = await harness(max_count=1)
    await h.run_job("alice", pool="gpu", lease_tag="a")
    await h.run_for(1.0)
    await h.stop()  # the broker goes away; pods and store survive
    real_list = h.backend.list_pods
    sweeps_fail = True

    async def list_pods():  # noqa: ANN202 - wraps the fake's method
        if sweeps_fail and restarted.cp.recovery is not None:
            raise BackendError("usage report unavailable")
        return await real_list()

    h.backend.list_pods = list_pods  # type: ignore[method-assign]
    restarted = Harness([gpu_pool(standbys_per_active=1, max_count=1)], backend=h.backend, store=h.store,
                        clock=h.clock)
    await restarted.start()
    try:
        assert len(standbys(restarted)) == 1 and restarted.cp.tracker.unverified_cards()
        bob = await restarted.submit("bob", pool="gpu", lease_tag="b")
        await restarted.run_for(3.0)
        assert restarted.store.get(bob.id).state is JobState.QUEUED  # type: ignore[union-attr]
        sweeps_fail = False
        done = await restarted.finish(bob)
        assert restarted.paths(done) == ["standby"]
        assert not restarted.cp.tracker.unverified_cards()
    finally:
        await restarted.stop()


def test_a_card_shared_with_another_pool_is_not_exclusive() -> None:
    def info(name: str, pool: str, *gpus: str) -> PodInfo:
        return PodInfo(name=name, pool=pool, gpus=gpus, template="t", created_at=0.0, isolated=True)

    report = [info("a", "gpu", "g0"), info("s", "gpu", "g0"), info("b", "gpu", "g1"), info("x", "other", "g1")]
    assert exclusive_cards(report) == {"g0"}
