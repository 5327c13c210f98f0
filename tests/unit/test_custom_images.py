"""Custom images (broker.images): the allowlist at admission, and who may ever run on an image's pod."""

from __future__ import annotations

import asyncio

import pytest

from broker.backends.kubernetes.backend import LaunchError
from broker.claiming.admission import admit
from broker.claiming.tracker import Claim, Tracker
from broker.clock import VirtualClock
from broker.errors import ImageNotAllowed, ImagesUnsupported, InvalidRequest
from broker.images import allowed, pinned
from broker.jobs import JobSpec, JobState
from broker.pods import Origin, Pod, PodState, owner_annotations, restore_owner
from broker.pools import CatalogError, PoolSpec, parse_pool
from broker.ports.backend import FakeBackend, PodRequest
from broker.warmth.scaling import count, plan
from tests.unit.harness import Harness, cpu_pool, gpu_pool
from tests.unit.test_k8s_backend import CPU, settle, start
from tests.unit.test_k8s_backend import Harness as K8sHarness

DIGEST = "registry.example/team/train@sha256:" + "ab" * 32
OTHER_DIGEST = "registry.example/team/train@sha256:" + "cd" * 32
TAG = "registry.example/team/train:latest"
ALLOW = ("registry.example/team/*",)


def test_the_catalog_takes_an_allowlist_of_patterns_and_refuses_other_shapes() -> None:
    pool = parse_pool({"name": "cpu", "images": ["registry.example/team/*", "docker.io/library/python@sha256:*"]})
    assert pool.images == ("registry.example/team/*", "docker.io/library/python@sha256:*")
    with pytest.raises(CatalogError, match="images"):
        parse_pool({"name": "cpu", "images": [1]})
    with pytest.raises(CatalogError, match="images"):
        parse_pool({"name": "cpu", "images": [""]})
    with pytest.raises(CatalogError, match="images"):
        parse_pool({"name": "cpu", "images": "registry.example/*"})


def test_a_digest_pins_an_image_and_a_tag_does_not() -> None:
    assert pinned(DIGEST)
    assert not pinned(TAG)
    assert not pinned("registry.example/team/train@sha256:abc")  # not a whole digest
    assert allowed(DIGEST, ALLOW) and allowed(TAG, ALLOW)
    assert not allowed("registry.example/teamevil/x:1", ALLOW)
    assert not allowed("evil.example/registry.example/team/x:1", ALLOW)


@pytest.mark.parametrize(("image", "runs", "error"), [
    ("registry.example/other/x:1", True, ImageNotAllowed),
    ("Registry.Example/team/x:1", True, InvalidRequest),  # not a reference a runtime parses
    ("registry.example/team/x:1 ; rm -rf /", True, InvalidRequest),
    (TAG, False, ImagesUnsupported),  # the local backend runs no images: refused, never faked
])
def test_admission_refuses_an_image_with_a_typed_error(image: str, runs: bool, error: type[Exception]) -> None:
    pools = {"cpu": cpu_pool(images=ALLOW)}
    with pytest.raises(error) as caught:
        admit(JobSpec(pool="cpu", command=("true",), image=image), "alice", pools, 0.0, runs_images=runs)
    assert 400 <= caught.value.status < 500  # type: ignore[attr-defined]


def test_a_pool_without_an_allowlist_allows_no_image() -> None:
    with pytest.raises(ImageNotAllowed, match="allows no custom images"):
        admit(JobSpec(pool="cpu", command=("true",), image=TAG), "alice", {"cpu": cpu_pool()}, 0.0, runs_images=True)
    job = admit(JobSpec(pool="cpu", command=("true",), image=TAG), "alice", {"cpu": cpu_pool(images=ALLOW)}, 0.0,
                runs_images=True)
    assert job.state is JobState.QUEUED and job.spec.image == TAG


async def _harness(**pool: object) -> Harness:
    pool.setdefault("images", ALLOW)
    return await Harness([cpu_pool(**pool)]).start()


async def test_a_digest_pinned_pod_is_reused_by_its_caller_only() -> None:
    h = await _harness()
    try:
        first = await h.run_job("alice", image=DIGEST, lease_tag="a")
        assert first.state is JobState.SUCCEEDED and h.paths(first) == ["custom_image"]
        pod = first.pods[0]
        assert h.backend.images[pod] == DIGEST  # the backend was asked for the image
        assert h.cp.tracker.pods[pod].origin is Origin.CUSTOM_IMAGE
        again = await h.run_job("alice", image=DIGEST, lease_tag="b")
        assert again.pods == first.pods  # the same caller's job of the same image reuses it
        assert again.acquisition[0].reason is None
        plain = await h.run_job("alice", lease_tag="a")  # her job without an image: never that pod
        bob = await h.run_job("bob", image=DIGEST)  # another caller, same image: never that pod
        other = await h.run_job("alice", image=OTHER_DIGEST)  # another image: never that pod
        for job in (plain, bob, other):
            assert job.state is JobState.SUCCEEDED and job.pods != first.pods, job
        assert pod not in (plain.pods + bob.pods + other.pods)
        assert plain.pods[0] not in h.backend.images  # the plain job ran the pool's own image
        assert h.cp.tracker.pods[pod].state is PodState.IDLE  # still alice's, held
    finally:
        await h.stop()


async def test_a_mutable_tag_runs_on_a_single_use_pod_that_is_deleted_after_the_job() -> None:
    h = await _harness()
    try:
        first = await h.run_job("alice", image=TAG)
        await h.run_for(1.0)
        assert first.state is JobState.SUCCEEDED and h.paths(first) == ["custom_image"]
        assert h.backend.images[first.pods[0]] == TAG
        assert first.pods[0] in h.backend.deleted and first.pods[0] not in h.cp.tracker.pods
        again = await h.run_job("alice", image=TAG)
        assert again.pods != first.pods  # never reused, even by its own caller
    finally:
        await h.stop()


async def test_a_pinned_pod_counts_against_the_budget_and_the_ceiling_but_not_the_idle_cap() -> None:
    h = Harness([gpu_pool(images=ALLOW, max_count=2, max_idle_count=1, idle_timeout=5.0,
                          caller_hold_seconds=1000.0)], backend=FakeBackend(VirtualClock(), gpus=2),
                budgets={"fake-gpu": 2})
    h.backend.clock = h.clock
    await h.start()
    try:
        job = await h.run_job("alice", pool="gpu", image=DIGEST)
        pod = job.pods[0]
        assert h.cp.controller.ledger.holds(pod)  # its GPU is in the accelerator's budget
        spec = h.cp.catalog.pools["gpu"]
        now = h.clock.now()
        fresh = Pod("gpu-fresh", "gpu", ("fake-gpu-1",), state=PodState.IDLE, template=spec.template_hash,
                    created_at=now - 100)
        fresh.idle_since = now - 100  # a never-used pool pod past its keep-alive
        pods = [h.cp.tracker.pods[pod], fresh]
        c = count(pods, spec, now)
        assert c.physical == 2  # the ceiling counts it
        assert (c.idle, c.held, c.fresh) == (1, 0, 1)  # not an idle, held or fresh pod of the pool
        assert plan(spec, pods, c, 0, now).retire == ()  # the idle cap (1) keeps the plain pod: nothing retires
    finally:
        await h.stop()


async def test_a_pinned_pod_made_for_a_cancelled_job_retires_and_no_one_else_takes_it() -> None:
    h = await _harness()
    h.backend.start_delay = 5.0
    try:
        job = await h.submit("alice", image=DIGEST)
        await h.run_for(1.0)
        made = [p for p in h.cp.tracker.snapshot() if p.image == DIGEST]
        assert len(made) == 1 and made[0].reserved_for == job.id
        await h.cp.cancel("alice", job.id)
        await h.run_for(10.0)
        assert made[0].name not in h.cp.tracker.pods  # an orphan: retired, never pooled
        assert made[0].name in h.backend.deleted
    finally:
        await h.stop()


def test_an_image_pods_owner_record_restores_its_image() -> None:
    pod = Pod("cpu-1", "cpu", origin=Origin.CUSTOM_IMAGE, image=DIGEST)
    pod.caller, pod.key, pod.used = "alice", ("alice", "default", ""), True
    back = Pod("cpu-1", "cpu")
    restore_owner(back, owner_annotations(pod))
    assert (back.image, back.origin, back.caller) == (DIGEST, Origin.CUSTOM_IMAGE, "alice")


def test_a_restored_image_pod_is_only_its_callers() -> None:
    tracker = Tracker({"cpu": cpu_pool(images=ALLOW)})
    pod = Pod("cpu-1", "cpu", state=PodState.IDLE, origin=Origin.CUSTOM_IMAGE, image=DIGEST)
    pod.caller, pod.key, pod.used = "alice", ("alice", "default", ""), True
    tracker.add(pod)
    assert not hasattr(tracker.claim(Claim("j1", "alice", "cpu"), 0.0), "pods")  # no image: shortfall
    assert not hasattr(tracker.claim(Claim("j2", "bob", "cpu", image=DIGEST), 0.0), "pods")
    got = tracker.claim(Claim("j3", "alice", "cpu", image=DIGEST), 0.0)
    assert getattr(got, "pods", ()) == (pod,)


def test_an_unpinned_pool_spec_field_defaults_to_no_images() -> None:
    assert PoolSpec(name="x").images == ()


async def test_a_custom_images_pull_error_blocks_that_image_not_the_pools_own() -> None:
    h = K8sHarness()
    try:
        task = asyncio.create_task(h.backend.create(PodRequest(name="cpu-bad", pool=CPU, image=TAG)))
        await settle()
        agent = h.api.pod("cpu-bad")["spec"]["containers"][0]
        assert (agent["image"], agent["imagePullPolicy"]) == (TAG, "Always")
        await h.api.fail_pull("cpu-bad")
        with pytest.raises(LaunchError) as caught:
            await asyncio.wait_for(task, 5)
        assert caught.value.details["image"] == TAG
        with pytest.raises(LaunchError, match="not retried"):
            await h.backend.create(PodRequest(name="cpu-bad2", pool=CPU, image=TAG))
        info = await start(h, "cpu-own")  # the pool's own image is not blocked
        assert info.name == "cpu-own"
    finally:
        await h.backend.close()
