"""Node boot epochs (design R5): a node that rebooted or was replaced under its name voids every pod bound
under its old epoch — holds dropped, the attempt re-queued without spending a retry, the pod never reused —
while the broker runs and across a restart."""

from __future__ import annotations

import pytest

from broker.fleet.nodes import Node
from broker.health import decisions
from broker.health.epochs import Epoch, Verdict, judge, recorded_epoch, reported_epoch
from broker.health.nodeepochs import NodeChange, NodeEpochs, voided
from broker.jobs import AttemptState, ErrorClass, JobState
from tests.unit.harness import Harness, gpu_pool

NODE = "fake-node-0"


@pytest.mark.parametrize(
    ("recorded", "reported", "verdict"),
    [
        (Epoch("uid-a", 1, "boot-0"), Epoch("uid-a", 1, "boot-0"), Verdict.TRUSTED),
        (
            Epoch("uid-a", 1, "boot-0"),
            Epoch("uid-a", 1, "boot-1"),
            Verdict.CHANGED,
        ),  # the pod survived a reboot
        (Epoch("", None, "boot-0"), Epoch("", None, "boot-1"), Verdict.CHANGED),
        (Epoch("", 1, "boot-0"), Epoch("", 1, ""), Verdict.TRUSTED),  # the node says nothing now: pod parts
        (Epoch("", None, "boot-0"), Epoch("", 2, ""), Verdict.UNKNOWN),  # no part known on both sides
        (None, Epoch("", None, "boot-0"), Verdict.UNKNOWN),  # first contact
    ],
)
def test_the_epoch_rule_compares_the_nodes_boot_epoch_when_both_sides_know_it(
    recorded: Epoch | None, reported: Epoch, verdict: Verdict
) -> None:
    assert judge(recorded, reported) is verdict


def test_a_pods_epoch_carries_its_nodes_boot_epoch_and_older_annotations_still_parse() -> None:
    epoch = Epoch("uid-a", 3, "0c5e-boot")
    assert str(epoch) == "uid-a#3@0c5e-boot" and Epoch.parse(str(epoch)) == epoch
    assert Epoch.parse("uid-a#3") == Epoch("uid-a", 3)  # written before node epochs: no node part
    assert Epoch.parse("#@b") == Epoch("", None, "b")
    assert recorded_epoch({"incarnation": 1, "started_node_epoch": "b0", "node_epoch": "b1"}, {}) == Epoch("", 1, "b0")
    assert reported_epoch({"pod_uid": "u", "node_epoch": "b1"}, 2) == Epoch("u", 2, "b1")


def test_first_contact_records_a_node_and_a_new_boot_epoch_is_a_change() -> None:
    table = NodeEpochs()
    assert table.observe([Node("n0", ("g0",), boot_epoch="b0"), Node("n1", ("g1",))]) == []
    assert table.observe([Node("n0", ("g0",), boot_epoch="b0")]) == []
    assert table.observe([Node("n0", ("g0",), boot_epoch="b1")]) == [NodeChange("n0", "b0", "b1")]
    assert table.current("n0") == "b1" and table.current("n1") == ""  # a node without an epoch is not judged


def test_which_pods_a_change_voids() -> None:
    current = {"n0": "b1"}
    assert voided("#1@b0", "n0", current, ())  # bound under the old epoch
    assert not voided("#1@b1", "n0", current, ())
    assert voided("", "n0", current, ("n0",))  # nothing recorded, on a node that just changed
    assert not voided("#1", "n0", current, ())  # no node part, no change seen: its own epoch decides
    assert not voided("#1@b0", "", current, ())  # a CPU pod on no node


async def _held_gpu_pod(h: Harness) -> str:
    done = await h.run_job(pool="gpu", command=("exit", "0"), lease_tag="t")
    await h.run_for(0.5)
    pod = done.pods[0]
    assert h.cp.tracker.pods[pod].held(h.clock.now()) and h.cp.tracker.pods[pod].epoch == "#1@boot-0"
    return pod


async def test_a_held_pod_on_a_rebooted_node_loses_its_hold_and_is_deleted_while_the_broker_runs() -> None:
    h = await Harness([gpu_pool(max_count=2, step=1)], gpus=2).start()
    try:
        pod = await _held_gpu_pod(h)
        h.backend.reboot(NODE, "boot-1")
        await h.run_for(h.cp.tuning.node_check_s + 0.5)  # the node-epoch loop reads the nodes
        assert pod in h.backend.deleted and pod not in h.cp.tracker.pods
        assert any(
            d.kind == "epoch_invalidated" and d.subject == f"node/{NODE}" and pod in d.detail["pods"]
            for d in decisions.RECENT
        )
        nxt = await h.run_job(pool="gpu", command=("exit", "0"), lease_tag="t")
        assert nxt.pods != (pod,) and h.cp.tracker.pods[nxt.pods[0]].epoch == "#1@boot-1"
    finally:
        await h.stop()


async def test_a_running_attempt_on_a_rebooted_node_is_requeued_without_spending_a_retry() -> None:
    h = await Harness([gpu_pool(max_count=2, step=1)], gpus=2).start()
    try:
        job = await h.submit(pool="gpu", command=("sleep", "100"), max_retries=0)
        await h.until(lambda: h.store.get(job.id).state is JobState.RUNNING)  # type: ignore[union-attr]
        pod = h.store.get(job.id).pods[0]  # type: ignore[union-attr]
        h.backend.reboot(NODE, "boot-1")  # the pod object and its agent stay: only the node's epoch tells
        await h.until(
            lambda: (
                h.store.get(job.id).state is not JobState.RUNNING  # type: ignore[union-attr]
                or h.store.get(job.id).pods != (pod,)
            ),
            timeout=60.0,
        )  # type: ignore[union-attr]
        row = h.store.get(job.id)
        assert row is not None and row.attempts[0].state is AttemptState.LOST
        assert row.attempts[0].error_class == ErrorClass.POD_LOST and row.retries == 0
        done = await h.finish(row, timeout=300.0)
        assert done.state is JobState.SUCCEEDED and done.pods != (pod,) and done.retries == 0
        assert pod in h.backend.deleted
    finally:
        await h.stop()


async def test_a_reboot_during_a_broker_outage_voids_the_held_pod_at_recovery() -> None:
    h = await Harness([gpu_pool(max_count=2, step=1)], gpus=2).start()
    pod = await _held_gpu_pod(h)
    await h.stop()
    h.backend.reboot(NODE, "boot-1")
    again = h.restarted([gpu_pool(max_count=2, step=1)])
    await again.start()
    try:
        report = again.cp.recovery
        assert report is not None and report.untrusted == {pod: "changed"} and report.holds_restored == 0
        assert pod in again.backend.deleted and pod not in again.cp.tracker.pods
    finally:
        await again.stop()
