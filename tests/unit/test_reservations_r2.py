"""R2: reservations in a total order, jobs take only from reservations ranked below them, aging per failed
fill, and an alert (an event, and /v1/pools) when a reservation cannot fill within `reservation_alert_after`."""

from __future__ import annotations

import pytest

from broker.claiming.reserving import Reservation, age_and_alert, failed_fills
from broker.claiming.tracker import Claim, Lease, Shortfall, Tracker
from broker.pods import Pod, PodState
from broker.pools import PoolSpec, parse_pool
from tests.unit.harness import Harness, cpu_pool


def _tracker(**knobs: object) -> Tracker:
    return Tracker({"p": PoolSpec(name="p", max_count=8, **knobs)})  # type: ignore[arg-type]


def _idle(t: Tracker, name: str) -> None:
    t.add(Pod(name, "p", state=PodState.IDLE))


GANGS = [  # (job id, order = (-priority, submit time, id))
    ("g-hi", (-5, 9.0, "g-hi")), ("g-a", (0, 1.0, "g-a")), ("g-b", (0, 2.0, "g-b")), ("g-lo", (3, 0.5, "g-lo"))]


@pytest.mark.parametrize(("order", "may_take"), [
    ((-9, 50.0, "x"), {"g-hi", "g-a", "g-b", "g-lo"}),  # ranked above all: takes from any
    ((-5, 9.5, "x"), {"g-a", "g-b", "g-lo"}),           # same priority as g-hi, submitted later: below g-hi
    ((0, 1.5, "x"), {"g-b", "g-lo"}),                   # between g-a and g-b by submit time
    ((0, 2.0, "a"), {"g-b", "g-lo"}),                   # ties on submit time break on id
    ((3, 0.1, "x"), {"g-lo"}),                          # the lowest priority, but submitted before g-lo
    ((3, 0.9, "x"), set()),                             # below every reservation
])
def test_a_job_takes_gpus_only_from_reservations_ranked_below_it(order: tuple[int, float, str],
                                                                 may_take: set[str]) -> None:
    took = set()
    for gang, _ in GANGS:
        t = _tracker()  # the gang waits for 2 pods and holds 1: may the job take it?
        t.reserve_gang(Reservation(gang, "bob", "p", 2, dict(GANGS)[gang], 0.0))
        _idle(t, "pod")
        if isinstance(t.claim(Claim("job", "alice", "p", order=order), 0.0), Lease):
            took.add(gang)
    assert took == may_take


def test_reservations_keep_the_total_order_priority_submit_id() -> None:
    t = _tracker()
    for name, rank in reversed(GANGS):
        t.reserve_gang(Reservation(name, "bob", "p", 2, rank, 0.0))
    assert [r.job_id for r, _ in t.reservations("p")] == ["g-hi", "g-a", "g-b", "g-lo"]


@pytest.mark.parametrize(("waited", "fills"), [(0.0, 0), (59.9, 0), (60.0, 1), (185.0, 3)])
def test_a_failed_fill_is_each_reserve_gangs_after_a_reservation_stays_short(waited: float, fills: int) -> None:
    spec = PoolSpec(name="p", reserve_gangs_after=60.0)
    assert failed_fills(spec, Reservation("g", "bob", "p", 2, (0, 0.0, "g"), 100.0), 100.0 + waited) == fills


def test_aging_per_failed_fill_lets_a_low_priority_gang_climb_past_a_newer_higher_one() -> None:
    t = _tracker(reserve_gangs_after=60.0, reservation_alert_after=None)
    t.reserve_gang(Reservation("old-low", "bob", "p", 4, (0, 0.0, "old-low"), 0.0))
    t.reserve_gang(Reservation("new-high", "carol", "p", 4, (-2, 10.0, "new-high"), 130.0))
    spec = t.pool("p")
    assert spec is not None
    age_and_alert(t, spec, 130.0, None)  # old-low failed twice: priority 0 -> 2, ties with new-high, earlier submit
    assert [r.job_id for r, _ in t.reservations("p")] == ["old-low", "new-high"]
    assert [r.aged for r, _ in t.reservations("p")] == [2, 0]
    # A 1-pod job at priority 1 ranks above old-low before aging, below it after: it may no longer take its pods.
    _idle(t, "x")
    assert isinstance(t.claim(Claim("j", "alice", "p", order=(-1, 50.0, "j")), 130.0), Shortfall)


def test_an_overdue_reservation_alerts_once() -> None:
    t = _tracker(reservation_alert_after=100.0)
    t.reserve_gang(Reservation("g", "bob", "p", 4, (0, 0.0, "g"), 0.0))
    _idle(t, "a")
    spec = t.pool("p")
    assert spec is not None
    alerts: list[tuple[str, int, str]] = []
    for now in (50.0, 100.0, 150.0):
        age_and_alert(t, spec, now, lambda r, held, why: alerts.append((r.job_id, held, why)))
    assert len(alerts) == 1 and alerts[0][:2] == ("g", 1)
    assert "holds 1 of 4 pods" in alerts[0][2] and "capacity" in alerts[0][2]


async def test_a_gang_that_cannot_fill_raises_a_capacity_event_visible_in_pools() -> None:
    pool = cpu_pool(max_count=2, reserve_gangs_after=1.0, reservation_alert_after=5.0)
    h = await Harness([pool]).start()
    try:
        blocker = await h.submit("alice", lease_tag="long", command=("sleep", "60"))
        gang = await h.submit("bob", lease_tag="gang", pods=2, command=("sleep", "1"))
        await h.run_for(12.0)
        events = [e for e in h.store.list_events() if e.kind == "reservation.alert"]
        assert [e.subject for e in events] == [gang.id] and events[0].caller == "bob"
        view = next(v for v in h.cp.pools_view() if v["name"] == "cpu")
        assert [a["job"] for a in view["capacity_alerts"]] == [gang.id]
        assert view["reservations"][0]["aged"] >= 5
        assert blocker.id not in {a["job"] for a in view["capacity_alerts"]}
    finally:
        await h.stop()


def test_the_alert_delay_is_a_checked_pool_knob_defaulting_to_four_hours() -> None:
    assert parse_pool({"name": "p"}).reservation_alert_after == 14400.0
    assert parse_pool({"name": "p", "reservation_alert_after": None}).reservation_alert_after is None


async def test_holds_a_reservation_breaks_are_events_for_their_owner() -> None:
    pool = cpu_pool(max_count=8, step=8, caller_hold_seconds=300.0, reserve_gangs_after=5.0)
    h = await Harness([pool], start_delay=1.0).start()
    try:
        holder = await h.run_job("alice", pods=3, command=("sleep", "10"))
        await h.run_job("bob", pods=2, lease_tag="own", command=("sleep", "1"))
        gang = await h.submit("bob", pods=8, lease_tag="gang", command=("sleep", "1"))
        await h.finish(gang, timeout=30.0)
        broken = [e for e in h.store.list_events() if e.kind == "hold.broken"]
        assert {e.subject for e in broken} == set(holder.pods)  # alice's; bob's own pods joined his gang
        assert all(e.caller == "alice" and e.detail["for"] == "reservation" for e in broken)
    finally:
        await h.stop()
