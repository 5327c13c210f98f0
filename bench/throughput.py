"""B14: end-to-end throughput over REST, and what each job costs the broker in CPU.

A real `firepool serve` on the local backend (bubblewrap pods, SQLite job store) with a pool of P pods
kept ready (min_count = P), measured at P = 4 and P = 16. 20 client threads, each with its own HTTP
session and caller-default (no) tag, each submit `true` and wait for it to finish, back to back, until
2,000 jobs have run. A job is one request, POST /v1/jobs?wait_s=60 (as the SDK's `run`; a job still running
after it is waited for with GET); `--two-requests` submits, then waits with GET /v1/jobs/{id}?wait_s=;
`--keyed` sends a fresh idempotency key with every submit, as the SDK does (broker.client).
Figures: jobs/s (jobs / wall time), submit -> finish p50/p99 as the client sees it, and the broker process's CPU seconds per job: utime + stime of its /proc/<pid>/stat, read before the
first submit and after the last job finished (the pods' agents are other processes and not counted).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.broker_proc import BenchBroker
from bench.common import Row, at_least, at_most, percentile, report

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
BEFORE_4PODS_JOBS_S = 87.0
"""Measured from outside before this benchmark's work (2026-11-30, 2-core VM): 87 jobs/s on 4 pods, ~10 ms CPU/job."""


@dataclass
class Run:
    pods: int
    jobs: int
    wall_s: float
    latencies: list[float]
    cpu_s: float
    failed: int


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (not its children), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pools(pods: int) -> str:
    return (f"pools:\n  - {{name: cpu, min_count: {pods}, max_count: {pods}, max_idle_count: {pods}, "
            f"idle_timeout: 600, step: {pods}}}\n")


def run(pods: int, jobs: int, threads: int, one_request: bool = True, keyed: bool = False) -> Run:
    with BenchBroker(pools=_pools(pods)) as broker:
        with broker.client() as c:
            deadline = time.monotonic() + 120
            while next(v for v in c.get("/v1/pools").json()["pools"] if v["name"] == "cpu")["idle"] < pods:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{pods} pods did not become idle")
                time.sleep(0.1)
            for _ in range(threads):  # one job per thread's worth, so the measured run starts warm
                job = c.post("/v1/jobs", json={"pool": "cpu", "command": ["true"]}).json()
                while job["state"] not in TERMINAL:
                    job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 30}).json()
        latencies: list[float] = []
        failed = [0]
        lock = threading.Lock()
        share = [jobs // threads + (1 if i < jobs % threads else 0) for i in range(threads)]
        start = threading.Barrier(threads + 1)
        submit_wait = {"wait_s": 60} if one_request else None  # as the SDK's run(); else submit, then GET ?wait_s=

        def client(n: int) -> None:
            mine: list[float] = []
            bad = 0
            with broker.client() as session:
                start.wait()
                for _ in range(n):
                    t0 = time.perf_counter()
                    body: dict[str, object] = {"pool": "cpu", "command": ["true"]}
                    if keyed:  # as the SDK's submit (broker.client)
                        body["idempotency_key"] = f"sdk-{uuid.uuid4().hex}"
                    job = session.post("/v1/jobs", json=body, params=submit_wait).json()
                    while job["state"] not in TERMINAL:
                        job = session.get(f"/v1/jobs/{job['id']}", params={"wait_s": 60}).json()
                    mine.append(time.perf_counter() - t0)
                    bad += job["state"] != "SUCCEEDED"
            with lock:
                latencies.extend(mine)
                failed[0] += bad

        workers = [threading.Thread(target=client, args=(n,), daemon=True) for n in share]
        for w in workers:
            w.start()
        cpu0 = cpu_seconds(broker.proc.pid)
        start.wait()
        t0 = time.perf_counter()
        for w in workers:
            w.join()
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(broker.proc.pid) - cpu0
    return Run(pods, len(latencies), wall, latencies, cpu, failed[0])


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench throughput", description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=20)
    parser.add_argument("--pods", type=int, action="append", help="pool sizes (default: 4 and 16)")
    parser.add_argument("--two-requests", action="store_true",
                        help="each job as POST then GET ?wait_s= (the clients before POST took wait_s)")
    parser.add_argument("--keyed", action="store_true",
                        help="every submit carries a fresh idempotency key, as the SDK's (Client.run included)")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    raw = {}
    for pods in args.pods or [4, 16]:
        r = run(pods, args.jobs, args.threads, one_request=not args.two_requests, keyed=args.keyed)
        rate = r.jobs / r.wall_s
        cpu_ms = r.cpu_s / max(r.jobs, 1) * 1000
        p50, p99 = percentile(r.latencies, 50) * 1000, percentile(r.latencies, 99) * 1000
        raw[pods] = {"jobs": r.jobs, "wall_s": r.wall_s, "cpu_s": r.cpu_s, "failed": r.failed,
                     "latencies_s": sorted(r.latencies)}
        before = f"before: {BEFORE_4PODS_JOBS_S:.0f}/s" if pods == 4 else "-"
        rows += [
            Row("B14", f"{pods} pods: jobs/s over REST ({r.jobs} `true` jobs, {args.threads} threads, "
                       f"{r.failed} failed{'; keyed as the SDK' if args.keyed else ''}; {before})", rate, "jobs/s", "483/s MySQL (broker only)",
                ">= 300/s" if pods >= 16 else "", at_least(rate, 300) if pods >= 16 else None),
            Row("B14", f"{pods} pods: submit->finish p50", p50, "ms", "-"),
            Row("B14", f"{pods} pods: submit->finish p99", p99, "ms", "-"),
            Row("B14", f"{pods} pods: broker CPU per job (/proc utime+stime; before: ~10 ms)", cpu_ms, "ms", "-",
                "<= 2 ms", at_most(cpu_ms, 2.0)),
        ]
    return report("throughput", rows, json_out=json_out, extra={"runs": raw})
