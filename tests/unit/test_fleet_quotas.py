"""Team quotas with borrowing (design §7): who runs in quota, who borrows, who waits, and the catalog's checks."""

from __future__ import annotations

import pytest

from broker.claiming.tracker import Claim, Lease, Shortfall, Tracker
from broker.fleet.quotas import CallerQuota, Kind, OrgQuota, QuotasSpec, QuotaTree, QuotaUse, TeamQuota
from broker.pods import Pod, PodState
from broker.pools import CatalogError, PoolSpec, parse_catalog


def _spec(**teams: TeamQuota) -> QuotasSpec:
    return QuotasSpec(orgs={"acme": OrgQuota(teams=teams)})


SPEC = _spec(nlp=TeamQuota(guaranteed_gpus=4, callers={"alice": CallerQuota(guaranteed_gpus=2), "bob": CallerQuota()}),
             rl=TeamQuota(guaranteed_gpus=4, max_gpus=6, callers={"carol": CallerQuota()}))


def _use(tree: QuotaTree, *held: tuple[str, int, bool]) -> QuotaUse:
    use = QuotaUse()
    for caller, gpus, borrowed in held:
        path = tree.path(caller)
        assert path is not None
        use.add(path, gpus, borrowed)
    return use


@pytest.mark.parametrize(("held", "caller", "gpus", "preemptible", "kind", "why"), [
    ((), "alice", 2, False, Kind.IN_QUOTA, ""),
    ((), "alice", 3, False, Kind.REFUSED, "caller 'alice' holds 0 of its 2"),  # her share of the team's guarantee
    ((), "alice", 3, True, Kind.BORROWED, ""),
    ((("bob", 4, False),), "alice", 1, False, Kind.REFUSED, "team 'acme/nlp' holds 4 of its 4"),
    ((("bob", 4, False),), "alice", 1, True, Kind.BORROWED, ""),  # rl's 4 unused GPUs are lendable
    ((("bob", 4, False), ("alice", 4, True)), "bob", 1, True, Kind.REFUSED, "lend only 0"),
    ((("carol", 4, False),), "bob", 4, False, Kind.IN_QUOTA, ""),
    ((("bob", 4, False),), "carol", 4, False, Kind.IN_QUOTA, ""),  # a guarantee is never lent away from its owner
    ((("carol", 4, False),), "carol", 2, True, Kind.BORROWED, ""),
    ((("carol", 4, False), ("carol", 2, True)), "carol", 1, True, Kind.REFUSED, "max_gpus 6"),
    ((), "mallory", 64, False, Kind.OUTSIDE, ""),  # in no team: only caller_limits apply
])
def test_a_job_runs_in_quota_borrows_or_waits(held: tuple[tuple[str, int, bool], ...], caller: str, gpus: int,
                                              preemptible: bool, kind: Kind, why: str) -> None:
    tree = QuotaTree(SPEC)
    verdict = tree.classify(caller, gpus, preemptible, _use(tree, *held))
    assert verdict.kind is kind
    assert why in verdict.reason


def test_a_team_that_preempted_for_its_guarantee_stops_lending_it() -> None:
    tree = QuotaTree(SPEC)
    use = _use(tree, ("bob", 4, False))
    assert tree.lendable(use, "team:acme/nlp") == 4
    use.reclaiming["team:acme/rl"] = 4
    assert tree.classify("alice", 1, True, use).kind is Kind.REFUSED


def test_the_tracker_records_borrowed_leases_and_gives_quota_back_at_release() -> None:
    pool = PoolSpec(name="g", gpus=1, accelerator="x", max_count=8)
    t = Tracker({"g": pool}, quotas=SPEC)
    for i in range(8):
        t.add(Pod(f"p{i}", "g", (f"gpu{i}",), state=PodState.IDLE))
    inq = t.claim(Claim("j1", "bob", "g", tag="a", pods=4), 0.0)
    over = t.claim(Claim("j2", "bob", "g", tag="b", pods=1), 0.0)
    borrowed = t.claim(Claim("j3", "bob", "g", tag="c", pods=2, preemptible=True), 0.0)
    assert isinstance(inq, Lease) and not inq.borrowed
    assert isinstance(over, Shortfall) and over.reason.startswith("team quota")
    assert isinstance(borrowed, Lease) and borrowed.borrowed
    assert t.quota_view() == {"in_quota": {"team:acme/nlp": 4}, "borrowed": {"team:acme/nlp": 2}}
    t.release("j3", ("bob", "default", "c"), 1.0, 60.0)
    assert t.quota_view()["borrowed"] == {"team:acme/nlp": 0}


def test_the_quota_tree_is_a_checked_catalog_section() -> None:
    base = {"pools": [{"name": "g", "gpus": 1}]}
    good = parse_catalog({**base, "quotas": {"orgs": {"acme": {"guaranteed_gpus": 8, "teams": {
        "nlp": {"guaranteed_gpus": 4, "callers": {"alice": {"guaranteed_gpus": 2}, "bob": {}}}}}},
        "preemption_grace_s": 5, "min_runtime_before_preempt": 0.5,
        "preemption_budget": {"warn_pct": 5, "limit_pct": 20}}}, "pools.yaml")
    assert good.quotas is not None and good.quotas.orgs["acme"].teams["nlp"].guaranteed_gpus == 4
    assert good.quotas.preemption_grace_s == 5
    assert parse_catalog(base).quotas is None
    for bad, message in [
        ({"orgs": {"a": {"teams": {"t": {"guaranted_gpus": 1}}}}}, "quotas.orgs.a.teams.t.guaranted_gpus: unknown key"),
        ({"orgs": {"a": {"teams": {"t": {"guaranteed_gpus": -1}}}}}, "must not be negative"),
        ({"orgs": {"a": {"teams": {"t": {"guaranteed_gpus": "4"}}}}}, "must be an integer"),
        ({"orgs": {"a": {"guaranteed_gpus": 2, "teams": {"t": {"guaranteed_gpus": 4}}}}},
         "quotas.orgs.a: its teams guarantee 4 GPUs, more than the org's guaranteed_gpus 2"),
        ({"orgs": {"a": {"teams": {"t": {"guaranteed_gpus": 1, "callers": {"x": {"guaranteed_gpus": 2}}}}}}},
         "its callers guarantee 2 GPUs"),
        ({"orgs": {"a": {"teams": {"t": {"callers": {"x": {}}}, "u": {"callers": {"x": {}}}}}}},
         "caller 'x' is already in team 'a/t'"),
        ({"orgs": {"a": {"teams": {"t": {"guaranteed_gpus": 4, "max_gpus": 2}}}}}, "max_gpus 2 is below"),
        ({"preemption_budget": {"warn_pct": 30, "limit_pct": 20}}, "warn_pct 30 is above limit_pct 20"),
        ({"preemption_budget": {"limit_pct": 120}}, "limit_pct"),
    ]:
        with pytest.raises(CatalogError, match="^pools.yaml: .*") as caught:
            parse_catalog({**base, "quotas": bad}, "pools.yaml")
        assert message in str(caught.value), str(caught.value)


@pytest.mark.parametrize(("caller", "gpus", "preemptible", "why"), [
    ("alice", 2, False, None),
    ("alice", 3, False, "exceed caller 'alice''s guarantee of 2; only a preemptible job may borrow"),
    ("alice", 6, True, None),  # her 2 plus rl's 4, on an idle cluster
    ("alice", 7, True, "plus every other team's (4)"),
    ("carol", 7, True, "exceed team 'acme/rl''s max_gpus 6"),
    ("mallory", 100, False, None),
])
def test_a_job_that_could_never_run_under_its_quota_is_refused_at_submit(caller: str, gpus: int, preemptible: bool,
                                                                         why: str | None) -> None:
    got = QuotaTree(SPEC).never_fits(caller, gpus, preemptible)
    assert got == why if why is None else why in (got or "")


async def test_submit_refuses_a_gang_bigger_than_its_guarantee_unless_preemptible() -> None:
    from broker.errors import Unschedulable
    from broker.jobs import JobSpec
    from tests.unit.harness import Harness, gpu_pool

    h = await Harness([gpu_pool(max_count=8, step=8)], gpus=8, quotas=SPEC).start()
    try:
        with pytest.raises(Unschedulable, match="team quota: 4 GPUs exceed caller 'alice'"):
            await h.cp.submit("alice", JobSpec(pool="gpu", command=("true",), pods=4))
        job, _ = await h.cp.submit("alice", JobSpec(pool="gpu", command=("true",), pods=4,
                                                    extra={"preemptible": True}))
        assert job.spec.pods == 4
    finally:
        await h.stop()


def test_a_reloaded_quota_tree_recounts_running_leases_and_a_removed_team_loses_its_guarantee() -> None:
    pool = PoolSpec(name="g", gpus=1, accelerator="x", max_count=8)
    t = Tracker({"g": pool}, quotas=SPEC)
    for i in range(8):
        t.add(Pod(f"p{i}", "g", (f"gpu{i}",), state=PodState.IDLE))
    running = t.claim(Claim("j1", "alice", "g", tag="a", pods=2), 0.0)
    assert isinstance(running, Lease) and not running.borrowed
    assert t.quota_verdict("alice", 1, False).kind is Kind.REFUSED  # type: ignore[union-attr] - her share is 2

    wider = _spec(nlp=TeamQuota(guaranteed_gpus=6, callers={"alice": CallerQuota(guaranteed_gpus=4)}))
    t.set_quotas(wider)  # the running job keeps its GPUs, counted under the new tree
    assert t.quota_view()["in_quota"] == {"team:acme/nlp": 2, "caller:alice": 2}
    assert t.quota_verdict("alice", 2, False).kind is Kind.IN_QUOTA  # type: ignore[union-attr]

    t.set_quotas(_spec(rl=TeamQuota(guaranteed_gpus=4, callers={"carol": CallerQuota()})))  # nlp removed
    assert t.quota_view()["in_quota"] == {} and t.quota_verdict("alice", 8, False).kind is Kind.OUTSIDE  # type: ignore[union-attr]
    t.release("j1", ("alice", "default", "a"), 1.0, 60.0)  # given back under the tree it is counted in now
    assert t.quota_view()["in_quota"] == {}
    t.set_quotas(None)
    assert t.quota_verdict("carol", 8, False) is None


async def test_a_catalog_reload_swaps_the_tree_for_admission_and_preemption() -> None:
    import dataclasses

    from broker.errors import Unschedulable
    from tests.unit.harness import Harness, gpu_pool

    h = await Harness([gpu_pool(max_count=4, step=1)], gpus=4, quotas=SPEC).start()
    try:
        with pytest.raises(Unschedulable, match="guarantee of 2"):
            await h.submit("alice", pool="gpu", pods=3, command=("true",))
        assert h.cp.dispatcher.preempter is not None
        wider = _spec(nlp=TeamQuota(guaranteed_gpus=4, callers={"alice": CallerQuota(guaranteed_gpus=4)}))
        h.cp.reload_catalog(dataclasses.replace(h.catalog, quotas=wider))
        done = await h.run_job("alice", pool="gpu", pods=3, command=("true",))
        assert done.state.value == "SUCCEEDED" and h.cp.catalog.quotas == wider
        h.cp.reload_catalog(dataclasses.replace(h.catalog, quotas=None))
        assert h.cp.dispatcher.preempter is None and h.cp.quota_tree is None
    finally:
        await h.stop()
