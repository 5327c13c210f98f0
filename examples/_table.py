"""Shared printing for the examples: one row per job, then a summary of paths and latencies."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

from broker.client import JobInfo


def run_time(job: JobInfo) -> float | None:
    t = job.timings
    if "first_instruction_at" in t and "finished_at" in t:
        return t["finished_at"] - t["first_instruction_at"]
    return None


def print_table(title: str, rows: Sequence[tuple[str, JobInfo]]) -> None:
    """`rows` are (step label, final job)."""
    print(f"\n{title}")
    header = f"{'step':<14} {'job':<20} {'caller':<10} {'tag':<10} {'path':<9} {'submit->first':>13} {'run':>7}  state"
    print(header)
    print("-" * len(header))
    for label, job in rows:
        lat, run = job.start_latency, run_time(job)
        print(f"{label:<14} {job.id:<20} {job.caller:<10} {job.raw.get('lease_tag', ''):<10} {job.path or '-':<9} "
              f"{(f'{lat * 1000:.0f} ms') if lat is not None else '-':>13} {(f'{run:.2f} s') if run is not None else '-':>7}"
              f"  {job.state}")
    paths = Counter(job.path for _, job in rows)
    lats = sorted(j.start_latency for _, j in rows if j.start_latency is not None)
    warm = [j.start_latency for _, j in rows if j.path == "warm" and j.start_latency is not None]
    summary = ", ".join(f"{p}: {n}" for p, n in sorted(paths.items(), key=lambda kv: str(kv[0])))
    print(f"paths: {summary}")
    if lats:
        print(f"submit->first instruction: p50 {statistics.median(lats) * 1000:.0f} ms over {len(lats)} jobs"
              + (f"; warm p50 {statistics.median(warm) * 1000:.0f} ms" if warm else ""))
