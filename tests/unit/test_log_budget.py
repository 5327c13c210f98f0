"""The broker's side of the output budget: logs are copied a window at a time and stored within the pool's cap."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from broker.errors import AgentError
from broker.pods import Pod
from broker.ports.agent import AttemptStatus, LogChunk
from broker.ports.logs import MemoryLogStore
from broker.running.logcopy import CHUNK, WINDOW, LogCopier, capped
from firepool_agent.output import marker


class FloodAgent:
    """An agent whose every stream is `size` bytes of output, made up as it is read."""

    def __init__(self, meter: Meter, size: int, tail: bytes = b"", fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.meter = meter
        self.size = size
        self.tail = tail

    async def read_log(self, attempt_id: str, stream: str = "combined", offset: int = 0,
                       max_bytes: int = 1 << 20, wait_s: float = 0.0) -> LogChunk:
        await asyncio.sleep(0)  # other copies run meanwhile, as they would behind a socket
        if self.fail_at is not None and offset >= self.fail_at:
            raise AgentError("the agent went away")
        body = b"x" * max(0, min(max_bytes, self.size - len(self.tail) - offset))
        rest = self.tail[max(0, offset - (self.size - len(self.tail))):]
        data = (body + rest)[:max_bytes]
        self.meter.held += len(data)
        self.meter.most_held = max(self.meter.most_held, self.meter.held)
        self.meter.largest_read = max(self.meter.largest_read, len(data))
        return LogChunk(data, offset + len(data), offset + len(data) >= self.size)


class Meter:
    held = 0
    most_held = 0
    largest_read = 0


class CountingStore(MemoryLogStore):
    """Keeps each stream's size and last bytes only; a chunk leaves the broker's memory once appended."""

    def __init__(self, meter: Meter) -> None:
        super().__init__()
        self.meter = meter
        self.sizes: dict[tuple[str, str], int] = {}
        self.tails: dict[tuple[str, str], bytes] = {}
        self.whole_writes: list[int] = []
        self.committed: list[str] = []

    def write(self, caller: str, attempt_id: str, stream: str, data: bytes) -> None:
        self.whole_writes.append(len(data))
        self.sizes[(attempt_id, stream)] = len(data)
        self.tails[(attempt_id, stream)] = data[-200:]

    def append(self, caller: str, attempt_id: str, stream: str, data: bytes, *, first: bool) -> None:
        key = (attempt_id, stream)
        self.sizes[key] = (0 if first else self.sizes[key]) + len(data)
        self.tails[key] = (b"" if first else self.tails[key])[-200:] + data[-200:]
        self.meter.held -= len(data)

    def commit(self, caller: str, attempt_id: str, stream: str) -> None:
        self.committed.append(stream)


class Agents:
    def __init__(self, agent: FloodAgent) -> None:
        self._agent = agent

    def agent(self, name: str) -> FloodAgent:
        return self._agent


def pods(n: int) -> Sequence[Pod]:
    return [Pod(name=f"p{i}", pool="cpu") for i in range(n)]


async def copy(agent: FloodAgent, store: CountingStore, cap: int, ranks: int = 3,
               statuses: Sequence[AttemptStatus | None] | None = None) -> None:
    copier = LogCopier(Agents(agent), store)  # type: ignore[arg-type]
    done = [AttemptStatus("j1:0", running=False, exit_code=0)] * ranks
    await copier.copy("alice", "j1:0", pods(ranks), statuses or done, cap)


async def test_a_flood_is_copied_a_chunk_at_a_time_within_the_window_and_stored_at_the_cap() -> None:
    meter = Meter()
    store = CountingStore(meter)
    cap = 4 << 20
    await copy(FloodAgent(meter, 6 << 20), store, cap)  # 3 ranks x 3 streams, each past the cap
    assert len(store.sizes) == 9
    assert set(store.sizes.values()) == {cap}
    assert all(tail.endswith(marker(cap)) for tail in store.tails.values())
    assert meter.largest_read <= CHUNK
    assert meter.most_held <= WINDOW * CHUNK  # nine streams at once, never more than the window in memory
    assert store.whole_writes == []  # no stream was joined and written whole


async def test_a_stream_the_agent_already_capped_is_stored_whole_without_a_second_marker() -> None:
    meter = Meter()
    store = CountingStore(meter)
    cap = 3 << 20
    await copy(FloodAgent(meter, cap, tail=marker(cap)), store, cap, ranks=1)
    assert set(store.sizes.values()) == {cap}
    assert store.tails[("j1:0", "combined")].endswith(b"x" + marker(cap))


async def test_a_stream_shorter_than_the_cap_is_stored_whole() -> None:
    meter = Meter()
    store = CountingStore(meter)
    await copy(FloodAgent(meter, 2 * CHUNK + 5), store, 64 << 20, ranks=1)
    assert set(store.sizes.values()) == {2 * CHUNK + 5}
    assert meter.held == 0


async def test_inline_logs_longer_than_the_cap_are_cut_with_the_marker() -> None:
    meter = Meter()
    store = CountingStore(meter)
    cap = 8192
    inline = AttemptStatus("j1:0", running=False, exit_code=0,
                           logs={"combined": b"y" * 20000, "stdout": b"y" * 20000, "stderr": b"ok\n"})
    await copy(FloodAgent(meter, 0), store, cap, ranks=1, statuses=[inline])
    assert store.sizes[("j1:0", "combined")] == cap
    assert store.tails[("j1:0", "combined")].endswith(marker(cap))
    assert store.sizes[("j1:0", "stderr")] == 3


async def test_a_quiet_attempt_with_inline_logs_stores_nothing_and_reads_nothing_from_its_agent() -> None:
    meter = Meter()
    store = CountingStore(meter)
    quiet = AttemptStatus("j1:0", running=False, exit_code=0, logs={"combined": b"", "stdout": b"", "stderr": b""})
    await copy(FloodAgent(meter, 1 << 20), store, 1 << 20, ranks=2, statuses=[quiet, quiet])
    assert store.whole_writes == [] and store.sizes == {} and store.committed == []
    assert meter.largest_read == 0  # every stream came inline: no read went to the agent


async def test_inline_logs_store_only_their_streams_with_output_under_each_ranks_name() -> None:
    meter = Meter()
    store = CountingStore(meter)
    rank0 = AttemptStatus("j1:0", running=False, exit_code=0, logs={"combined": b"hi\n", "stdout": b"hi\n", "stderr": b""})
    rank1 = AttemptStatus("j1:0", running=False, exit_code=0, logs={"combined": b"", "stdout": b"", "stderr": b"no\n"})
    await copy(FloodAgent(meter, 1 << 20), store, 1 << 20, ranks=2, statuses=[rank0, rank1])
    assert store.sizes == {("j1:0", "combined"): 3, ("j1:0", "stdout"): 3, ("j1:0", "rank1.stderr"): 3}
    assert meter.largest_read == 0


@pytest.mark.parametrize("size", [0, 100, 8192])
def test_capped_keeps_what_fits(size: int) -> None:
    assert capped(b"z" * size, 8192) == b"z" * size


async def test_a_copy_cut_short_by_a_lost_agent_keeps_what_came_before() -> None:
    meter = Meter()
    store = CountingStore(meter)
    await copy(FloodAgent(meter, 10 * CHUNK, fail_at=3 * CHUNK), store, 64 << 20, ranks=1)
    assert set(store.sizes.values()) == {3 * CHUNK}
    assert sorted(store.committed) == ["combined", "stderr", "stdout"]
