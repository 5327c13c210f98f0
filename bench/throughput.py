"""B14 and B18: end-to-end throughput over REST, one request per job and in batches, and what each job costs the
broker in CPU as the count of pods grows.

A real `firepool serve` on the local backend (bubblewrap pods, SQLite job store) with a pool of P virtual-GPU pods
kept ready (min_count = P, one virtual GPU each), P = 4, 16 and 64 by default. On each broker, two phases of N
`true` jobs run back to back (the same run, so the two paths are compared on the same machine state):

- B14, single requests: 20 client threads, each with its own HTTP session, submit a job and wait for it to finish,
  back to back. A job is one request, POST /v1/jobs?wait_s=60 (as the SDK's `run`); `--keyed` sends a fresh
  idempotency key with every submit, as the SDK does.
- B18, batches: the N jobs in batches of up to 1,000 (POST /v1/jobs:batch), their results followed over one
  stream (POST /v1/jobs:watch), as the SDK's `Client.map`.

Figures per phase: jobs/s (jobs / wall time), submit -> finish p50/p99 as the client sees it (for a batch, from
the batch's request to the job's event on the stream), and the broker process's CPU per job: utime + stime of
its /proc/<pid>/stat, read before the first submit and after the last job finished (the pods' agents are other
processes and not counted there). Beside it, the whole machine's CPU per job (bench.machine_cpu: broker, agents,
jobs, this process's clients, idle share): on a machine whose cores are all busy, single's total over the batches'
is about the most the batches can gain; the same ratio without the agents' share is what batches could gain with a
pod agent that cost nothing, and the CPU of one bare `true` start here is the part of every job no broker or agent
can save.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import httpx

from bench import machine_cpu
from bench.broker_proc import BenchBroker
from bench.common import Row, at_least, at_most, percentile, report
from broker.fanout import BATCH_PATH, MAX_BATCH, WATCH_PATH, SseParser

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
BEFORE_4PODS_JOBS_S = 87.0
"""Measured from outside before this benchmark's work (2026-11-30, 2-core VM): 87 jobs/s on 4 pods, ~10 ms CPU/job."""


@dataclass
class Phase:
    jobs: int
    wall_s: float
    latencies: list[float]
    failed: int
    machine: machine_cpu.Split

    @property
    def cpu_s(self) -> float:
        """The broker process's CPU seconds over the phase."""
        return self.machine.broker_ms * self.jobs / 1000

    @property
    def rate(self) -> float:
        return self.jobs / self.wall_s

    @property
    def cpu_ms(self) -> float:
        return self.machine.broker_ms


def _pools(pods: int) -> str:
    return (f"pools:\n  - {{name: gpu, gpus: 1, accelerator: virtual, min_count: {pods}, max_count: {pods}, "
            f"max_idle_count: {pods}, idle_timeout: 600, step: {pods}}}\n")


def _ready(broker: BenchBroker, pods: int, threads: int) -> None:
    """Every pod idle, and one job per client thread run, so the measured phases start warm."""
    with broker.client() as c:
        deadline = time.monotonic() + 60 + 2 * pods
        while next(v for v in c.get("/v1/pools").json()["pools"] if v["name"] == "gpu")["idle"] < pods:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{pods} pods did not become idle")
            time.sleep(0.1)
        for _ in range(threads):
            job = c.post("/v1/jobs", json={"pool": "gpu", "command": ["true"]}, params={"wait_s": 30}).json()
            while job["state"] not in TERMINAL:
                job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 30}).json()


def single(broker: BenchBroker, jobs: int, threads: int, keyed: bool = False) -> Phase:
    """B14: one request per job from `threads` client threads."""
    latencies: list[float] = []
    failed = [0]
    lock = threading.Lock()
    share = [jobs // threads + (1 if i < jobs % threads else 0) for i in range(threads)]
    start = threading.Barrier(threads + 1)

    def client(n: int) -> None:
        mine: list[float] = []
        bad = 0
        with broker.client() as session:
            start.wait()
            for _ in range(n):
                t0 = time.perf_counter()
                body: dict[str, object] = {"pool": "gpu", "command": ["true"]}
                if keyed:  # as the SDK's submit (broker.client)
                    body["idempotency_key"] = f"sdk-{uuid.uuid4().hex}"
                job = session.post("/v1/jobs", json=body, params={"wait_s": 60}).json()
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
    machine0 = machine_cpu.sample(broker.proc.pid)
    start.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    machine = machine_cpu.split(machine0, machine_cpu.sample(broker.proc.pid), len(latencies))
    return Phase(len(latencies), wall, latencies, failed[0], machine)


def batched(broker: BenchBroker, jobs: int) -> Phase:
    """B18: batches of up to MAX_BATCH jobs, then one watch stream for their results."""
    with broker.client() as c:
        machine0 = machine_cpu.sample(broker.proc.pid)
        t0 = time.perf_counter()
        sent: dict[str, float] = {}
        for first in range(0, jobs, MAX_BATCH):
            at = time.perf_counter()
            n = min(MAX_BATCH, jobs - first)
            r = c.post(BATCH_PATH, json={"jobs": [{"pool": "gpu", "command": ["true"]}] * n})
            r.raise_for_status()
            sent.update((job["id"], at) for job in r.json()["jobs"])
        latencies, failed = _watch(c, sent)
        wall = time.perf_counter() - t0
        machine = machine_cpu.split(machine0, machine_cpu.sample(broker.proc.pid), len(latencies))
        return Phase(len(latencies), wall, latencies, failed, machine)


def _watch(c: httpx.Client, sent: dict[str, float]) -> tuple[list[float], int]:
    latencies: list[float] = []
    failed = 0
    pending = list(sent)
    while pending:
        with c.stream("POST", WATCH_PATH, json={"ids": pending, "wait_s": 300}) as response:
            response.raise_for_status()
            parser = SseParser()
            for line in response.iter_lines():
                event = parser.feed(line)
                if event is not None and event[0] == "job":
                    job = json.loads(event[1])
                    latencies.append(time.perf_counter() - sent[job["id"]])
                    failed += job["state"] != "SUCCEEDED"
                elif event is not None and event[0] == "end":
                    pending = json.loads(event[1])["pending"]
    return latencies, failed


def run(pods: int, jobs: int, threads: int, keyed: bool = False) -> tuple[Phase, Phase]:
    with BenchBroker(pools=_pools(pods), extra=("--virtual-gpus", str(pods))) as broker:
        _ready(broker, pods, threads)
        return single(broker, jobs, threads, keyed), batched(broker, jobs)


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench throughput", description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per phase")
    parser.add_argument("--threads", type=int, default=20)
    parser.add_argument("--pods", type=int, action="append", help="pool sizes (default: 4, 16 and 64)")
    parser.add_argument("--keyed", action="store_true",
                        help="every single submit carries a fresh idempotency key, as the SDK's (Client.run included)")
    args = parser.parse_args(argv)
    start_ms = machine_cpu.process_start_ms()
    rows: list[Row] = [Row("B18", "this machine: CPU of one `true` start, outside any pod (200 posix_spawn + wait)",
                           start_ms, "ms", "-")]
    raw: dict[int, dict[str, object]] = {}
    for pods in args.pods or [4, 16, 64]:
        one, many = run(pods, args.jobs, args.threads, keyed=args.keyed)
        raw[pods] = {name: {"jobs": p.jobs, "wall_s": p.wall_s, "cpu_s": p.cpu_s, "failed": p.failed,
                            "machine_ms": asdict(p.machine), "latencies_s": sorted(p.latencies)}
                     for name, p in (("single", one), ("batch", many))}
        before = f"; before: {BEFORE_4PODS_JOBS_S:.0f}/s" if pods == 4 else ""
        goal = pods == 16
        rows += [
            Row("B14", f"{pods} pods: jobs/s, one request a job ({one.jobs} `true` jobs, {args.threads} threads, "
                       f"{one.failed} failed{'; keyed as the SDK' if args.keyed else ''}{before})", one.rate,
                "jobs/s", "483/s MySQL (broker only)", ">= 300/s" if goal else "", at_least(one.rate, 300) if goal else None),
            Row("B14", f"{pods} pods: submit->finish p50, one request a job", percentile(one.latencies, 50) * 1000,
                "ms", "-"),
            Row("B14", f"{pods} pods: submit->finish p99, one request a job", percentile(one.latencies, 99) * 1000,
                "ms", "-"),
            Row("B14", f"{pods} pods: broker CPU per job, one request a job (/proc utime+stime)", one.cpu_ms, "ms", "-",
                "<= 2 ms" if goal else "", at_most(one.cpu_ms, 2.0) if goal else None),
            Row("B18", f"{pods} pods: jobs/s in batches ({many.jobs} jobs, {many.failed} failed; x single: "
                       f"{many.rate / one.rate:.1f})", many.rate, "jobs/s", "-", ">= 2x single" if goal else "",
                at_least(many.rate, 2 * one.rate) if goal else None),
            Row("B18", f"{pods} pods: submit->finish p50 in batches", percentile(many.latencies, 50) * 1000, "ms", "-"),
            Row("B18", f"{pods} pods: submit->finish p99 in batches", percentile(many.latencies, 99) * 1000, "ms", "-"),
            Row("B18", f"{pods} pods: broker CPU per job in batches", many.cpu_ms, "ms", "-",
                "<= 1 ms" if goal else "", at_most(many.cpu_ms, 1.0) if goal else None),
            Row("B18", f"{pods} pods: the machine's CPU per job, one request a job ({one.machine.describe()})",
                one.machine.total_ms, "ms", "-"),
            Row("B18", f"{pods} pods: the machine's CPU per job in batches ({many.machine.describe()})",
                many.machine.total_ms, "ms", "-"),
            Row("B18", f"{pods} pods: the most batches can gain while the cores are busy (the two totals above)",
                one.machine.total_ms / max(many.machine.total_ms, 1e-9), "x", "-"),
            Row("B18", f"{pods} pods: ... and with the pods' agents at zero CPU (the totals less the agents' share)",
                (one.machine.total_ms - one.machine.agents_ms)
                / max(many.machine.total_ms - many.machine.agents_ms, 1e-9), "x", "-"),
        ]
    return report("throughput", rows, json_out=json_out, extra={"runs": raw})
