"""`firepool sim calibrate`: measure this machine's local backend and write the simulator's `local` venue.

Over REST against a broker on the local backend (bubblewrap sandboxes): warm jobs of one session give the
control plane's phases (accept: the POST round trip; dispatch: submitted -> committed; hand-off:
committed -> handed off; first instruction: handed off -> first instruction); single-use jobs (`true`) each
wait for a pod of their own, so their start minus a warm start is a pod start; eight single-use jobs
submitted together give the contention of eight starts at once. Termination is not measured (0).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench.broker_proc import BenchBroker
from broker.backends.startdelay import StartModel
from broker.sim.stats import percentile
from broker.sim.venues import Venue, save_local

POOLS = ("pools:\n  - {name: cpu, cpus: 1, max_count: 8, max_idle_count: 0, idle_timeout: 600, step: 8, "
         "caller_hold_seconds: 600}\n")


def _run(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    job: dict[str, Any] = c.post("/v1/jobs", json=body).json()
    if "id" not in job:
        raise RuntimeError(f"submit refused: {job}")
    while job["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 60}).json()
    return job


def _start(job: dict[str, Any]) -> float:
    t = job["timings"]
    return float(t["first_instruction_at"] - t["submitted_at"])


def measure(warm_jobs: int, cold_jobs: int) -> dict[str, Any]:
    accept, dispatch, handoff, first, warm = [], [], [], [], []
    cold, crowd = [], []
    with BenchBroker(pools=POOLS) as broker, broker.client() as c:
        warm_body = {"pool": "cpu", "command": ["true"], "lease_tag": "calibrate"}
        _run(c, warm_body)  # the session's pod
        for _ in range(warm_jobs):
            t0 = time.time()
            job = c.post("/v1/jobs", json=warm_body).json()
            accept.append(time.time() - t0)
            while job["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 60}).json()
            t = job["timings"]
            dispatch.append(t["committed_at"] - t["submitted_at"])
            handoff.append(t["handed_off_at"] - t["committed_at"])
            first.append(t["first_instruction_at"] - t["handed_off_at"])
            warm.append(_start(job))
        single = {"pool": "cpu", "command": ["true"], "single_use": True}
        for _ in range(cold_jobs):
            cold.append(_start(_run(c, single)))
        jobs = [c.post("/v1/jobs", json=single).json() for _ in range(8)]
        for job in jobs:
            while job["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 60}).json()
            crowd.append(_start(job))
    base = statistics.median(warm)
    return {"accept": accept, "dispatch": dispatch, "handoff": handoff, "first": first, "warm": warm,
            "pod_start": [max(0.0, x - base) for x in cold], "eight_at_once": [max(0.0, x - base) for x in crowd]}


def main(argv: list[str], out: Path) -> int:
    parser = argparse.ArgumentParser(prog="firepool sim calibrate", description=__doc__)
    parser.add_argument("--warm-jobs", type=int, default=30)
    parser.add_argument("--cold-jobs", type=int, default=10)
    args = parser.parse_args(argv)
    m = measure(args.warm_jobs, args.cold_jobs)
    median = statistics.median(m["pod_start"])
    p90 = max(median, percentile(m["pod_start"], 90))
    crowd = max(1.0, statistics.median(m["eight_at_once"]) / median) if median > 0 else 1.0
    venue = Venue(name="local", cold_start=StartModel(median_s=median, p90_s=p90, crowd_n=8, crowd_factor=crowd),
                  handoff_s=statistics.median(m["handoff"]), first_instruction_s=statistics.median(m["first"]),
                  accept_s=statistics.median(m["accept"]), dispatch_s=statistics.median(m["dispatch"]),
                  promotion_s=0.0, termination_s=0.0, cap=8, standbys_per_active=0)
    save_local(venue, out)
    print(f"{'phase':<34} {'median':>10}")
    for label, key in (("accept (POST round trip)", "accept"), ("dispatch (submitted->committed)", "dispatch"),
                       ("hand-off (committed->handed off)", "handoff"), ("first instruction", "first"),
                       ("warm start (submit->first)", "warm"), ("pod start (single-use - warm)", "pod_start"),
                       ("pod start, eight at once", "eight_at_once")):
        print(f"{label:<34} {statistics.median(m[key]) * 1000:>8.1f} ms")
    print(f"pod start p90 {p90 * 1000:.1f} ms; contention x{crowd:.2f} at eight at once")
    print(f"wrote the local venue to {out}")
    return 0
