"""The Kubernetes emulator's store, selectors and patches, without a server."""

from __future__ import annotations

import pytest

from k8s_emulator import objects, validation
from k8s_emulator.objects import ApiError, Event, Store
from k8s_emulator.selectors import (
    SelectorError,
    field_selector,
    json_patch,
    label_selector,
    merge_patch,
)


def pod(name: str, **labels: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {"containers": [{"name": "c"}]}}


def labelled(**labels: str) -> dict[str, object]:
    return {"metadata": {"labels": labels}}


@pytest.mark.parametrize(("selector", "labels", "expected"), [
    ("a=1", {"a": "1"}, True),
    ("a==1", {"a": "2"}, False),
    ("a!=1", {}, True),
    ("a in (1, 2),b", {"a": "2", "b": ""}, True),
    ("a notin (1,2)", {"a": "1"}, False),
    ("!a", {"b": "1"}, True),
    ("a", {}, False),
    ("", {"x": "y"}, True),
    ("firepool.io/pool=gpu-a,firepool.io/role=standby", {"firepool.io/pool": "gpu-a", "firepool.io/role": "standby"},
     True),
])
def test_label_selectors_match_as_the_api_server_does(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert label_selector(selector)(labelled(**labels)) is expected


def test_malformed_selectors_are_selector_errors() -> None:
    with pytest.raises(SelectorError):
        label_selector("a in (1")
    with pytest.raises(SelectorError):
        field_selector("status.phase")


def test_field_selectors_compare_dotted_fields_as_strings() -> None:
    obj = {"metadata": {"name": "p"}, "status": {"phase": "Running"}, "spec": {}}
    assert field_selector("status.phase=Running,metadata.name=p")(obj)
    assert field_selector("spec.nodeName=")(obj)
    assert not field_selector("status.phase!=Running")(obj)


def test_merge_patch_deletes_on_null_and_replaces_lists() -> None:
    target = {"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"l": [1, 2]}}
    assert merge_patch(target, {"metadata": {"labels": {"a": None, "c": "3"}}, "spec": {"l": [3]}}) == \
        {"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"l": [3]}}


def test_json_patch_adds_replaces_removes_and_tests() -> None:
    doc = {"metadata": {"annotations": {"x/y": "1"}}}
    patched = json_patch(doc, [{"op": "add", "path": "/metadata/annotations/firepool.io~1caller", "value": "a"},
                               {"op": "test", "path": "/metadata/annotations/x~1y", "value": "1"},
                               {"op": "remove", "path": "/metadata/annotations/x~1y"}])
    assert patched == {"metadata": {"annotations": {"firepool.io/caller": "a"}}}
    with pytest.raises(SelectorError):
        json_patch(doc, [{"op": "test", "path": "/metadata/annotations/x~1y", "value": "2"}])


def test_every_write_bumps_one_global_resource_version_and_no_op_writes_do_not() -> None:
    store = Store()
    a = store.create("pods", "ns", pod("a"))
    b = store.create("secrets", "ns", {"metadata": {"name": "s"}})
    assert int(b["metadata"]["resourceVersion"]) == int(a["metadata"]["resourceVersion"]) + 1
    same = store.update("pods", "ns", "a", lambda p: p)
    assert same["metadata"]["resourceVersion"] == a["metadata"]["resourceVersion"]
    _, version = store.list("pods", None)
    assert version == store.resource_version == 2


def test_a_stale_update_is_a_409_conflict_and_identity_fields_stay() -> None:
    store = Store()
    created = store.create("pods", "ns", pod("a"))
    store.update("pods", "ns", "a", lambda p: {**p, "metadata": {**p["metadata"], "labels": {"v": "2"}}})
    with pytest.raises(ApiError) as exc:
        store.update("pods", "ns", "a", lambda p: p, expected_rv=created["metadata"]["resourceVersion"])
    assert exc.value.code == 409 and exc.value.status()["reason"] == "Conflict"
    moved = store.update("pods", "ns", "a", lambda p: {**p, "metadata": {"name": "b", "uid": "forged"}})
    assert moved["metadata"]["uid"] == created["metadata"]["uid"] and moved["metadata"]["name"] == "a"


def test_replay_after_compaction_is_410_and_replay_before_it_sees_every_event_in_order() -> None:
    store = Store()
    start = store.resource_version
    store.create("pods", "ns", pod("a"))
    store.update("pods", "ns", "a", lambda p: {**p, "spec": {"containers": [{"name": "d"}]}})
    store.delete("pods", "ns", "a")
    seen: list[Event] = []
    store.replay("pods", start, seen.append)
    assert [e.type for e in seen] == ["ADDED", "MODIFIED", "DELETED"]
    store.compact()
    with pytest.raises(ApiError) as exc:
        store.replay("pods", start, seen.append)
    assert exc.value.code == 410
    store.replay("pods", store.resource_version, seen.append)  # from now on is fine


def test_a_full_event_window_forgets_its_oldest_versions() -> None:
    store = Store(window=2)
    start = store.resource_version
    for name in ("a", "b", "c"):
        store.create("pods", "ns", pod(name))
    with pytest.raises(ApiError):
        store.replay("pods", start, lambda _e: None)
    store.replay("pods", start + 1, lambda _e: None)


def test_a_bound_pod_under_a_kubelet_terminates_first_and_a_wrong_uid_precondition_is_409() -> None:
    store = Store()
    store.graceful_pods = True
    created = store.create("pods", "ns", {**pod("a"), "spec": {"nodeName": "n", "containers": [{"name": "c"}]}})
    with pytest.raises(ApiError) as exc:
        store.delete("pods", "ns", "a", uid="someone-else")
    assert exc.value.code == 409
    terminating = store.delete("pods", "ns", "a", uid=created["metadata"]["uid"])
    assert terminating["metadata"]["deletionTimestamp"] and store.get("pods", "ns", "a")
    store.remove("pods", "ns", "a")
    with pytest.raises(ApiError) as gone:
        store.get("pods", "ns", "a")
    assert gone.value.code == 404


def gpu_pod(resources: dict[str, object], **labels: str) -> dict[str, object]:
    return {"kind": "Pod", "metadata": {"name": "p", "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "img:1", "resources": resources}]}}


@pytest.mark.parametrize(("labels", "annotations"), [
    ({"firepool.io/pool": "a b"}, {}),
    ({"Firepool.IO/pool": "a"}, {}),
    ({"x" * 64: "a"}, {}),
    ({"a": "-starts-with-dash"}, {}),
    ({}, {"firepool.io/": "empty name"}),
])
def test_label_and_annotation_syntax_the_api_server_refuses_is_422(labels: dict[str, str],
                                                                   annotations: dict[str, str]) -> None:
    with pytest.raises(ApiError) as exc:
        validation.check({"kind": "Pod", "metadata": {"name": "p", "labels": labels, "annotations": annotations}})
    assert exc.value.code == 422


def test_extended_resources_need_requests_equal_to_limits() -> None:
    validation.check(gpu_pod({"limits": {"nvidia.com/gpu": "1"}}))
    validation.check(gpu_pod({"requests": {"nvidia.com/gpu": "1", "cpu": "2"}, "limits": {"nvidia.com/gpu": "1"}}))
    for resources in ({"requests": {"nvidia.com/gpu": "1"}},
                      {"requests": {"nvidia.com/gpumem": "1"}, "limits": {"nvidia.com/gpumem": "2"}}):
        with pytest.raises(ApiError) as exc:
            validation.check(gpu_pod(resources))
        assert exc.value.code == 422


def test_a_new_pod_gets_the_api_servers_defaults() -> None:
    pod = gpu_pod({"limits": {"nvidia.com/gpu": "1"}})
    validation.default_pod(pod)
    container = pod["spec"]["containers"][0]  # type: ignore[index]
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "1"}
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30  # type: ignore[index]


def test_events_past_the_kept_number_go_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects, "EVENTS_KEPT", 2)
    store = Store()
    for i in range(3):
        store.create("events", "ns", {"metadata": {"name": f"e{i}"}, "involvedObject": {}})
    assert [e["metadata"]["name"] for e in store.list("events", "ns")[0]] == ["e1", "e2"]
