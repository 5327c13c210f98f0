"""Identity epochs (design R5): a pod that answers with another epoch than the one work was bound under
is not trusted — its hold is dropped, its attempt re-queued, and the pod is never reused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from broker.health import decisions
from broker.health.epochs import EPOCH_ANNOTATION, Epoch, Verdict, judge, recorded_epoch
from broker.jobs import AttemptState, ErrorClass, JobState
from broker.pods import PodState
from firepool_agent.incarnation import next_incarnation
from tests.unit.harness import Harness, cpu_pool


@pytest.mark.parametrize(("recorded", "reported", "verdict"), [
    (Epoch("", 3), Epoch("", 3), Verdict.TRUSTED),
    (Epoch("", 3), Epoch("", 4), Verdict.CHANGED),            # the agent restarted
    (Epoch("uid-a", 1), Epoch("uid-b", 1), Verdict.CHANGED),  # same name, another pod object
    (Epoch("uid-a", 1), Epoch("uid-a", 1), Verdict.TRUSTED),
    (Epoch("uid-a", None), Epoch("uid-a", 7), Verdict.TRUSTED),  # only the identity is recorded
    (None, Epoch("", 1), Verdict.UNKNOWN),                    # first contact: nothing recorded
    (Epoch("", 1), Epoch("", None), Verdict.UNKNOWN),         # the agent cannot say
    (Epoch("", None), Epoch("", None), Verdict.UNKNOWN),
    (Epoch("uid-a", None), Epoch("", 2), Verdict.UNKNOWN),    # no part known on both sides
])
def test_the_epoch_rule(recorded: Epoch | None, reported: Epoch | None, verdict: Verdict) -> None:
    assert judge(recorded, reported) is verdict


def test_an_epoch_survives_its_annotation_and_the_binding_record_wins_over_the_backends() -> None:
    epoch = Epoch("uid-a", 4)
    assert Epoch.parse(str(epoch)) == epoch and Epoch.parse(str(Epoch("", 2))) == Epoch("", 2)
    assert Epoch.parse("") is None and Epoch.parse("garbage") is None
    assert recorded_epoch({"incarnation": 1}, {EPOCH_ANNOTATION: "#5"}) == Epoch("", 5)
    assert recorded_epoch({"incarnation": 1}, {}) == Epoch("", 1)
    assert recorded_epoch({}, {}) is None


def test_the_incarnation_counter_only_grows_and_survives_a_torn_file(tmp_path: Path) -> None:
    path = tmp_path / "state" / "pod-1.incarnation"
    assert [next_incarnation(path) for _ in range(3)] == [1, 2, 3]
    assert path.read_text().strip() == "3"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary left behind
    path.write_text("not a number")  # a hand-edited or damaged file starts over rather than failing the pod
    assert next_incarnation(path) == 1


async def _restart(h: Harness, max_count: int = 1) -> Harness:
    await h.stop()
    again = h.restarted([cpu_pool(max_count=max_count, step=max_count)])
    return await again.start()


async def test_a_running_attempt_on_a_pod_whose_agent_restarted_is_requeued_and_the_pod_not_reused() -> None:
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    job = await h.submit(command=("sleep", "100"))
    await h.until(lambda: h.store.get(job.id).state is JobState.RUNNING)  # type: ignore[union-attr]
    await h.run_for(0.5)
    pod = h.store.get(job.id).pods[0]  # type: ignore[union-attr]
    h.backend.agents[pod].incarnation = 2  # same pod name, another agent: what was bound to it is gone

    again = await _restart(h)
    try:
        report = again.cp.recovery
        assert report is not None and report.requeued == [job.id] and report.untrusted == {pod: "changed"}
        assert pod in again.backend.deleted and pod not in again.cp.tracker.pods
        row = again.store.get(job.id)
        assert row is not None and row.attempts[0].state is AttemptState.LOST and row.retries == 0
        done = await again.finish(row, timeout=300.0)
        assert done.state is JobState.SUCCEEDED and done.pods != (pod,)  # ran again, elsewhere
    finally:
        await again.stop()


async def test_a_hold_on_a_pod_replaced_under_the_same_name_is_dropped_and_the_pod_deleted() -> None:
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    done = await h.run_job(command=("exit", "0"), lease_tag="t")
    pod = done.pods[0]
    await h.run_for(0.5)
    assert h.cp.tracker.pods[pod].held(h.clock.now())
    # Another pod object under the same name: a new UID (the backend's identity) and a fresh agent.
    info = h.backend.pods[pod]
    h.backend.pods[pod] = dataclasses.replace(info, details={**info.details, "pod_uid": "uid-new"},
                                              annotations={**info.annotations, EPOCH_ANNOTATION: "uid-old#1"})

    again = await _restart(h)
    try:
        assert again.cp.recovery is not None and again.cp.recovery.holds_restored == 0
        assert again.cp.recovery.untrusted == {pod: "changed"} and pod in again.backend.deleted
        nxt = await again.run_job(command=("exit", "0"), lease_tag="t")
        assert nxt.pods != (pod,) and again.paths(nxt) != ["warm"]
    finally:
        await again.stop()


async def test_a_held_pod_with_no_recorded_epoch_loses_its_hold_but_is_reset_and_kept() -> None:
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    done = await h.run_job(command=("exit", "0"), lease_tag="t")
    pod = done.pods[0]
    await h.run_for(0.5)
    info = h.backend.pods[pod]
    h.backend.pods[pod] = dataclasses.replace(info, details={},  # a pod from before epochs: first contact
                                              annotations={**info.annotations, EPOCH_ANNOTATION: ""})

    again = await _restart(h)
    try:
        assert again.cp.recovery is not None and again.cp.recovery.untrusted == {pod: "unknown"}
        kept = again.cp.tracker.pods[pod]
        assert kept.state is PodState.IDLE and kept.caller is None and not kept.held(again.clock.now())
        assert again.backend.agents[pod].resets  # reset with proof before it is trusted again
    finally:
        await again.stop()


async def test_an_unchanged_epoch_keeps_the_hold_and_reattaches_the_attempt() -> None:
    h = await Harness([cpu_pool(max_count=2, step=2)]).start()
    held = await h.run_job(command=("exit", "0"), lease_tag="held")
    running = await h.submit("bob", command=("sleep", "5"))
    await h.until(lambda: h.store.get(running.id).state is JobState.RUNNING)  # type: ignore[union-attr]
    await h.run_for(0.5)
    assert held.pods != h.store.get(running.id).pods  # type: ignore[union-attr]
    again = await _restart(h, max_count=2)
    try:
        report = again.cp.recovery
        assert report is not None and report.untrusted == {} and report.reattached == [running.id]
        assert report.holds_restored == 1 and again.cp.tracker.pods[held.pods[0]].held(again.clock.now())
        final = await again.finish(running)
        assert final.state is JobState.SUCCEEDED and final.error_class is None
        assert ErrorClass.POD_LOST not in {a.error_class for a in final.attempts}
    finally:
        await again.stop()


async def test_an_agent_that_restarts_under_its_pod_name_while_the_broker_runs_loses_its_pod() -> None:
    h = await Harness([cpu_pool(max_count=2, step=1)]).start()
    try:
        job = await h.submit(command=("sleep", "5"), lease_tag="t")
        await h.until(lambda: h.store.get(job.id).state is JobState.RUNNING)  # type: ignore[union-attr]
        pod = h.store.get(job.id).pods[0]  # type: ignore[union-attr]
        assert h.cp.tracker.pods[pod].epoch == "#1"
        h.backend.agents[pod].incarnation = 2  # answers the reset, but it is another agent
        await h.finish(job)
        await h.run_for(1.0)
        assert pod in h.backend.deleted and pod not in h.cp.tracker.pods  # no hold on it, never reused
        assert any(d.kind == "epoch_invalidated" and d.subject == f"pod/{pod}" for d in decisions.RECENT)
        nxt = await h.run_job(command=("exit", "0"), lease_tag="t")
        assert nxt.pods != (pod,)
    finally:
        await h.stop()
