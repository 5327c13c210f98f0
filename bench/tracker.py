"""B1-B3: tracker claims/s at 100,000 pods (1 claimer and 32 threads), lock hold per claim, memory per pod.

The loop is the warm path the paper measures: a caller claims its session's idle pod and releases it
(ASSIGNED -> RESETTING -> IDLE, held again), with 100,000 pods tracked across 1,000 callers.
"""

from __future__ import annotations

import argparse
import gc
import threading
import time
import tracemalloc

from bench.common import Row, at_least, at_most, percentile, report
from broker.claiming.tracker import Claim, Lease, Tracker
from broker.pods import Origin, Pod, PodState
from broker.pools import PoolSpec

POOL = PoolSpec(name="h200", gpus=1, accelerator="nvidia-h200", max_count=1_000_000)


def build(n: int, callers: int = 1000) -> Tracker:
    """n pods; half of them held by `callers` sessions, the rest never used."""
    t = Tracker({"h200": POOL})
    for i in range(n):
        name = f"h200-{i:07d}"
        t.add(Pod(name, "h200", state=PodState.STARTING, origin=Origin.WARM))
        t.ready(name, 0.0, (f"GPU-{i:07d}",))
    for i in range(n // 2):
        caller = f"caller{i % callers}"
        key = (caller, "default", f"s{i % callers}")
        lease = t.claim(Claim(f"seed{i}", caller, "h200", "default", key[2]), 0.0)
        assert isinstance(lease, Lease)
        t.release(f"seed{i}", key, 0.0, 1e9)
    return t


def claim_loop(t: Tracker, caller: str, tag: str, seconds: float, job: str) -> int:
    want = Claim(job, caller, "h200", "default", tag)
    key = (caller, "default", tag)
    claim, release = t.claim, t.release
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            claim(want, 1.0)
            release(job, key, 1.0, 1e9)
        n += 1000
    return n


class TimedLock:
    """The tracker lock, recording how long each holder kept it (ns)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.holds: list[int] = []
        self._t0 = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self._t0 = time.perf_counter_ns()

    def __exit__(self, *exc: object) -> None:
        self.holds.append(time.perf_counter_ns() - self._t0)
        self._lock.release()


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench tracker", description=__doc__)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="per throughput run")
    parser.add_argument("--claims", type=int, default=200_000, help="claims timed for lock holds")
    args = parser.parse_args(argv)

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    t = build(args.pods)
    gc.collect()
    per_pod = (tracemalloc.get_traced_memory()[0] - before) / args.pods
    tracemalloc.stop()

    gc.disable()
    try:
        claim_loop(t, "caller1", "s1", 0.3, "warmup")
        runs = [claim_loop(t, "caller1", "s1", args.seconds / 3, "j1") / (args.seconds / 3) for _ in range(3)]
        one = sorted(runs)[1]

        counts = [0] * 32

        def worker(w: int) -> None:
            counts[w] = claim_loop(t, f"caller{w}", f"s{w}", args.seconds, f"t{w}")

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(32)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        many = sum(counts) / args.seconds

        lock = TimedLock()
        t.state.lock = lock  # type: ignore[assignment]
        want, key = Claim("h", "caller2", "h200", "default", "s2"), ("caller2", "default", "s2")
        claim_holds: list[int] = []
        for _ in range(args.claims):
            t.claim(want, 1.0)
            claim_holds.append(lock.holds[-1])
            t.release("h", key, 1.0, 1e9)
            if len(lock.holds) > 100_000:
                lock.holds.clear()
    finally:
        gc.enable()
    p50, p99 = percentile(claim_holds, 50) / 1000, percentile(claim_holds, 99) / 1000

    rows = [
        Row("B1", f"claims/s, 1 claimer, {args.pods:,} pods (claim+release)", one, "/s",
            "191-219k/s (Go)", ">= 220k/s", at_least(one, 220_000)),
        Row("B1", f"claims/s, 32 threads, {args.pods:,} pods", many, "/s", "109-120k/s (Go)", "", None),
        Row("B2", f"lock hold per claim p50 ({args.claims:,} claims)", p50, "us", "1.5-2.6 us", "<= 2.6 us",
            at_most(p50, 2.6)),
        Row("B2", "lock hold per claim p99", p99, "us", "<= 8 us", "<= 8 us", at_most(p99, 8.0)),
        Row("B3", f"tracker memory per pod (tracemalloc, {args.pods:,} pods)", per_pod, "B", "~1 KB", "<= 1024 B",
            at_most(per_pod, 1024)),
    ]
    return report("tracker", rows, json_out=json_out)
