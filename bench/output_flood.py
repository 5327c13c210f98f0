"""B19: a job that floods its output costs the broker a bounded window of memory and at most the pool's cap on disk.

A real `firepool serve` on the local backend with one pool sized as a production CPU pod (`max_count: 4`,
512 MiB memory, 256 MiB workspace) and the default `max_output_bytes` (64 MiB per stream). After one warm-up
job (the pod's start is not counted), a job prints 300 MB (`--big`: 1 GB) of `x` to stdout:
`head -c N /dev/zero | tr '\\0' x; echo`. The broker's process tree (the broker and its pods, which are its
children) is sampled from /proc every 50 ms while the job runs and its log is read back; figures: the tree's
RSS growth (peak less the level before the job), the broker process's own growth, the bytes stored per
stream under the state dir, and the bytes `GET /v1/jobs/{id}/logs?follow=false` returned. Before the output
budget, a 300 MB print grew the broker by ~1.2 GB and stored ~600 MB (docs/security.md, "Output budget").
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from bench.broker_proc import BenchBroker
from bench.common import Row, at_most, report

MiB = 1 << 20
CAP = 64 * MiB
POOLS = """pools:
  - name: cpu
    max_count: 4
    template: {memory: 512Mi, pids: 256, workspace_size: 256Mi, tmp_size: 64Mi, shm_size: 64Mi}
"""
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def _status(pid: int) -> tuple[int, int] | None:
    """(parent pid, resident bytes) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return None
    return int(fields["PPid"]), int(fields.get("VmRSS", "0 kB").split()[0]) * 1024


def tree_rss(root: int) -> tuple[int, int]:
    """(resident bytes of `root` and every process below it, of `root` alone)."""
    procs = {int(e): s for e in os.listdir("/proc") if e.isdigit() and (s := _status(int(e))) is not None}
    below, frontier = {root}, {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in procs.items() if ppid in frontier} - below
        below |= frontier
    return sum(procs[p][1] for p in below if p in procs), procs.get(root, (0, 0))[1]


class Sampler(threading.Thread):
    """Peak RSS of a process tree and of its root, sampled every 50 ms until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = self.peak_root = self.samples = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            tree, root = tree_rss(self.pid)
            self.peak, self.peak_root = max(self.peak, tree), max(self.peak_root, root)
            self.samples += 1
            self.halt.wait(0.05)


def flood(size: int) -> dict[str, float]:
    with BenchBroker(pools=POOLS) as broker, broker.client() as c:
        body = {"pool": "cpu", "command": ["true"], "lease_tag": "flood"}
        warm = c.post("/v1/jobs", json=body, params={"wait_s": 120}).json()
        assert warm["state"] == "SUCCEEDED", warm
        time.sleep(0.5)
        before, before_root = tree_rss(broker.proc.pid)
        sampler = Sampler(broker.proc.pid)
        sampler.start()
        began = time.monotonic()
        try:
            command = ["sh", "-c", f"head -c {size} /dev/zero | tr '\\0' x; echo"]
            job = c.post("/v1/jobs", json={**body, "command": command, "timeout_s": 600}, params={"wait_s": 60}).json()
            while job["state"] not in TERMINAL:
                job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 60}).json()
            wall = time.monotonic() - began
            read = 0
            with c.stream("GET", f"/v1/jobs/{job['id']}/logs", params={"follow": "false"}) as r:
                for part in r.iter_bytes():
                    read += len(part)
        finally:
            sampler.halt.set()
            sampler.join()
        stored = [p.stat().st_size for p in (broker.dir / "state" / "logs").rglob("*.log") if job["id"] in str(p)]
        return {"state_ok": float(job["state"] == "SUCCEEDED"), "tree_mib": (sampler.peak - before) / MiB,
                "root_mib": (sampler.peak_root - before_root) / MiB, "stored": float(max(stored, default=0)),
                "read": float(read), "wall_s": wall, "samples": float(sampler.samples)}


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench output-flood", description=__doc__)
    parser.add_argument("--big", action="store_true", help="also print 1 GB")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    raw = {}
    for size in (300_000_000, 1_000_000_000) if args.big else (300_000_000,):
        r = flood(size)
        raw[size] = r
        label = f"{size // 1_000_000:,} MB print"
        ok = "" if r["state_ok"] else " (the job did not succeed)"
        rows += [
            Row("B19", f"{label}: broker process tree RSS growth (broker + pods, 50 ms samples){ok}", r["tree_mib"],
                "MiB", "—", "<= 150 MB", at_most(r["tree_mib"] * MiB, 150e6)),
            Row("B19", f"{label}: broker process RSS growth", r["root_mib"], "MiB", "—"),
            Row("B19", f"{label}: stored log, largest stream (cap {CAP:,} bytes)", r["stored"], "bytes", "—",
                f"<= {CAP:,}", at_most(r["stored"], CAP)),
            Row("B19", f"{label}: GET logs?follow=false returned", r["read"], "bytes", "—", f"<= {CAP:,}",
                at_most(r["read"], CAP)),
            Row("B19", f"{label}: job submit -> finished", r["wall_s"], "s", "—"),
        ]
    return report("output-flood", rows, json_out=json_out, extra={"runs": raw})
