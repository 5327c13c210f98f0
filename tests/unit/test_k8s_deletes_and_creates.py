"""The kubernetes backend's delete and create paths on the virtual clock: a delete returns only once the pod
object is gone (its GPUs count as taken until then) and gives up after the grace plus `delete_wait_s`; a
create whose answer was lost adopts what its first try made."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from broker.backends.kubernetes.manifests import ANN_CREATED
from broker.errors import BackendError
from broker.ports.backend import PodRequest
from tests.unit.k8s_fakeapi import FakeKubeApi
from tests.unit.test_k8s_backend import CPU, Harness, settle, start


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = Harness(FakeKubeApi())
    yield harness
    await harness.backend.close()


async def test_a_delete_returns_only_once_the_watch_sees_the_pod_object_go(h: Harness) -> None:
    await start(h, "cpu-1")
    h.api.graceful = True
    deleting = asyncio.create_task(h.backend.delete("cpu-1"))
    await settle()
    assert h.api.pod("cpu-1")["metadata"]["deletionTimestamp"] and not deleting.done(), "still terminating"
    await h.api.finish("cpu-1")
    await settle()
    assert deleting.done() and deleting.exception() is None


async def test_a_pod_that_never_goes_is_waited_for_its_grace_plus_delete_wait_then_given_up(h: Harness) -> None:
    await start(h, "cpu-2")
    h.api.graceful = True
    deleting = asyncio.create_task(h.backend.delete("cpu-2"))
    await settle()
    grace = h.api.pod("cpu-2")["spec"]["terminationGracePeriodSeconds"]
    h.clock.advance(grace + h.backend.settings.delete_wait_s - 1)
    await settle()
    assert not deleting.done()
    h.clock.advance(2)
    await settle()
    assert deleting.done() and ("Pod", "cpu-2") in h.api.objects


async def test_a_create_whose_answers_were_lost_adopts_its_own_secret_and_pod(h: Harness) -> None:
    h.api.lose_next = ["Secret", "Pod"]
    task = asyncio.create_task(h.backend.create(PodRequest(name="cpu-3", pool=CPU)))
    for _ in range(5):  # the retries' backoff, on the virtual clock
        await settle()
        h.clock.advance(1)
    await h.api.run_pod("cpu-3")
    info = await asyncio.wait_for(task, 5)
    assert info.details["uid"] == h.api.pod("cpu-3")["metadata"]["uid"]
    assert h.api.calls.count("create Pod") == 2 and "get Pod" in h.api.calls


async def test_a_409_for_a_pod_another_create_made_is_an_error_and_leaves_that_pod(h: Harness) -> None:
    await start(h, "cpu-4")
    h.backend._pods.pop("cpu-4")
    h.backend.cache.pods.pop("cpu-4")  # unknown to this broker: made by an earlier create
    h.api.objects.pop(("Secret", "cpu-4-agent"))
    theirs = h.api.pod("cpu-4")["metadata"]["annotations"][ANN_CREATED]
    h.clock.advance(1)
    with pytest.raises(BackendError, match="did not make"):
        await h.backend.create(PodRequest(name="cpu-4", pool=CPU))
    assert h.api.pod("cpu-4")["metadata"]["annotations"][ANN_CREATED] == theirs
    assert ("Secret", "cpu-4-agent") not in h.api.objects, "the Secret this create made is cleaned up"
