"""`MemoryJobStore` passes the same store contract as `SqlJobStore`, so unit tests may trust the fake."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.ports.store import MemoryJobStore
from tests.store_contract import JobStoreContract, make_job


class TestMemoryJobStore(JobStoreContract):
    @pytest.fixture
    def store(self) -> Iterator[MemoryJobStore]:
        store = MemoryJobStore()
        yield store
        store.close()

    def test_memory_store_runs_on_the_event_loop(self, store: MemoryJobStore) -> None:
        assert store.blocking is False

    def test_a_batch_of_writes_counts_as_one_commit(self, store: MemoryJobStore) -> None:
        a, b = store.insert(make_job("j-a")), store.insert(make_job("j-b"))
        store.commit([(a.stamp(claimed_at=1.0), 0), (b.stamp(claimed_at=1.0), 0)])
        assert store.commits == 1
