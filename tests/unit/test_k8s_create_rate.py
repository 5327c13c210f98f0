"""The catalog's `create_rate` paces pod creates, and a reloaded catalog re-paces them (not only the start)."""

from __future__ import annotations

from broker.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings
from broker.backends.kubernetes.ratelimit import RateSettings, TokenBucket
from broker.clock import VirtualClock
from broker.control import ControlPlane
from broker.pools import Catalog, CreateRate, load_catalog
from broker.ports.logs import MemoryLogStore
from broker.ports.store import MemoryJobStore
from tests.unit.k8s_fakeapi import FakeKubeApi
from tests.unit.test_k8s_backend import CPU


def test_a_retuned_bucket_keeps_what_was_earned_and_paces_at_the_new_rate() -> None:
    clock = VirtualClock()
    bucket = TokenBucket(clock, qps=1.0, burst=1)
    bucket.tokens = 0.0
    clock.advance(0.5)
    bucket.retune(10.0, 4)  # half a token earned at the old rate
    assert abs(bucket.wait_s() - 0.05) < 1e-6  # the other half at the new one
    clock.advance(10.0)
    assert bucket.wait_s() == 0.0 and bucket.tokens == 4.0  # saved up to the new burst
    bucket.retune(1.0, 2)
    assert bucket.tokens == 2.0  # a smaller burst caps what is saved


async def test_reloading_the_catalog_re_paces_the_kubernetes_backends_creates() -> None:
    clock = VirtualClock()
    backend = KubernetesBackend(clock, FakeKubeApi(),  # type: ignore[arg-type]
                                KubernetesSettings(rate=RateSettings(qps=1.0, burst=1)))
    cp = ControlPlane(clock=clock, store=MemoryJobStore(), backend=backend, logs=MemoryLogStore(clock.now),
                      catalog=Catalog(pools={"cpu": CPU}, create_rate=CreateRate(qps=1.0, burst=1)))
    try:
        await backend._bucket.take()
        assert backend._bucket.wait_s() == 1.0  # one create a second
        reloaded = load_catalog("create_rate: {qps: 50.0, burst: 5}\npools: [{name: cpu}]\n")
        cp.reload_catalog(reloaded)
        assert cp.catalog.create_rate == CreateRate(qps=50.0, burst=5)
        assert (backend.settings.rate.qps, backend.settings.rate.burst) == (50.0, 5)
        clock.advance(1.0)  # saved up to the new burst: 5
        for _ in range(5):
            assert backend._bucket.wait_s() == 0.0
            await backend._bucket.take()
        assert abs(backend._bucket.wait_s() - 1 / 50) < 1e-6  # then paced at the new rate
    finally:
        await backend.close()
