"""HAMi annotations: reading the card an active pod got, the node register, and the exclusivity sweep."""

from __future__ import annotations

from typing import Any

from broker.backends.kubernetes import hami

A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
NODE = {"metadata": {"annotations": {hami.NODE_REGISTER: f"{A},10,81920,100,NVIDIA-H100,0,true:{B},10,81920,100,"
                                                         "NVIDIA-H100,0,true:"}}}


def share(pool: str | None, uuid: str) -> dict[str, Any]:
    labels = {"firepool.io/pool": pool} if pool else {}
    return {"metadata": {"labels": labels, "annotations": {hami.ALLOCATED: f"{uuid},NVIDIA,1,0:;"}}}


def test_allocated_uuid_is_read_from_the_active_pods_annotation() -> None:
    assert hami.allocated_uuids({hami.ALLOCATED: f"{A},NVIDIA,81920,100:;"}) == (A,)
    assert hami.allocated_uuids({hami.ALLOCATED: f"{A},NVIDIA,1,0:{B},NVIDIA,1,0:;"}) == (A, B)
    assert hami.allocated_uuids({}) == ()


def test_card_shared_only_by_the_group_is_exclusive() -> None:
    assert hami.exclusive(A, NODE, [share("h100", A), share("h100", A), share("other", B)], "h100")


def test_card_with_a_foreign_share_is_not_exclusive() -> None:
    assert not hami.exclusive(A, NODE, [share("h100", A), share(None, A)], "h100")


def test_card_missing_from_the_register_is_not_exclusive() -> None:
    assert not hami.exclusive("GPU-cccc", NODE, [share("h100", "GPU-cccc")], "h100")


def test_standby_pin_names_the_card() -> None:
    assert hami.pin_annotations((A,), "hami") == {hami.USE_UUID: A}


def test_a_card_the_backend_found_foreign_shares_on_stays_fenced() -> None:
    from broker.ports.backend import PodInfo
    from broker.warmth.standby import exclusive_cards

    def info(name: str, **details: Any) -> PodInfo:
        return PodInfo(name=name, pool="h100", gpus=(A,), template="t", created_at=0.0, isolated=True,
                       details=details)

    assert exclusive_cards([info("active"), info("standby")]) == {A}
    assert exclusive_cards([info("active", foreign=(A,)), info("standby")]) == set()


def test_allocated_memory_is_read_per_card() -> None:
    assert hami.allocated_memory_mb({hami.ALLOCATED: f"{A},NVIDIA,81920,0:{B},NVIDIA,1,0:;"}) == {A: 81920, B: 1}
    assert hami.allocated_memory_mb({hami.ALLOCATED: "garbage"}) == {}


def test_volcano_allocations_and_register_are_read_alike() -> None:
    assert hami.allocated_uuids({hami.VOLCANO_ALLOCATED: f"{A},NVIDIA,81920,0:;"}) == (A,)
    node = {"metadata": {"annotations": {hami.VOLCANO_REGISTER: f"{A},10,81920,100,NVIDIA-H100,0,true:"}}}
    assert hami.exclusive(A, node, [share("h100", A)], "h100")


def test_quarantined_cards_are_kept_off_a_new_pod_by_uuid() -> None:
    assert hami.avoid_annotations({"GPU-b", "GPU-a", "pod-1/gpu0"}) == {"nvidia.com/nouse-gpuuuid": "GPU-a,GPU-b"}
    assert hami.avoid_annotations(set()) == {} and hami.avoid_annotations({"pod-1/gpu0"}) == {}
