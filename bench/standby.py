"""B8: standby handover — 30 sequential jobs of one caller, a fresh reuse tag each, on a 2-GPU pool.

With `reuse_tag: retire` (the paper's rule) each job may run once on the previous job's pod, which then retires, so
jobs alternate between a recycled pod and a handover: a job that found no idle pod (path `standby` or
`new`). Handover wait is submitted -> handed off to the agent, which includes a standby's wait at the
per-GPU gate. Arms: standby on (`standbys_per_active`) and off; a third arm runs the same loop with
`reuse_tag: hint` (paper §9.5: the tag only routes, so the pod stays warm). Local backend, virtual
GPUs, no venue delay unless `--start-delay` is given.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from typing import Any

from bench.broker_proc import BenchBroker
from bench.common import Row, at_most, median, percentile, report

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def pool_yaml(standbys: int, reuse_tag: str, start_delay: float) -> str:
    template = f", template: {{start_delay_s: {start_delay}}}" if start_delay else ""
    return ("pools:\n  - {name: gpu, gpus: 1, min_count: 1, max_count: 2, max_idle_count: 2, idle_timeout: 600, "
            f"caller_hold_seconds: 600, step: 2, standbys_per_active: {standbys}, reuse_tag: {reuse_tag}{template}}}\n")


def run_arm(jobs: int, body_s: float, standbys: int, reuse_tag: str, start_delay: float) -> dict[str, Any]:
    """One arm on its own broker: the jobs' REST views and the loop's makespan."""
    with BenchBroker(pools=pool_yaml(standbys, reuse_tag, start_delay), extra=("--virtual-gpus", "2")) as broker, \
            broker.client() as c:
        deadline = time.monotonic() + 120
        while True:  # the floor pod (and its standbys) ready before the loop starts, in every arm
            view = next(p for p in c.get("/v1/pools").json()["pools"] if p["name"] == "gpu")
            if view["idle"] >= 1 and view["standby"] >= standbys:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the pool never warmed up: {view}")
            time.sleep(0.05)
        done = []
        began = time.time()
        for i in range(jobs):
            body = {"pool": "gpu", "command": ["sleep", str(body_s)], "lease_tag": f"session-{i}"}
            job = c.post("/v1/jobs", json=body).json()
            while job["state"] not in TERMINAL:
                job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 30}).json()
            done.append(job)
        makespan = time.time() - began
    return {"jobs": done, "makespan": makespan}


def summarise(arm: dict[str, Any]) -> dict[str, Any]:
    jobs = arm["jobs"]
    failed = [j["id"] for j in jobs if j["state"] != "SUCCEEDED"]
    paths = Counter(j["acquisition"][0]["path"] for j in jobs if j.get("acquisition"))
    handovers = [j for j in jobs if j.get("acquisition") and j["acquisition"][0]["path"] in ("standby", "new")]
    waits = [j["timings"]["handed_off_at"] - j["timings"]["submitted_at"] for j in handovers
             if "handed_off_at" in j["timings"]]
    starts = [j["timings"]["first_instruction_at"] - j["timings"]["submitted_at"] for j in jobs
              if "first_instruction_at" in j["timings"]]
    warm = sum(1 for j in jobs if j.get("acquisition") and j["acquisition"][0]["path"] == "warm")
    return {"failed": failed, "paths": dict(paths), "handovers": len(handovers), "by_standby": paths["standby"],
            "wait_p50": median(waits) if waits else None, "start_p50": percentile(starts, 50),
            "start_p90": percentile(starts, 90), "makespan": arm["makespan"], "warm_share": warm / len(jobs),
            "pods": len({p for j in jobs for p in j.get("bound_pods", [])})}


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench standby", description=__doc__)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--body-s", type=float, default=0.5, help="fixed job body (W-Agent bodies: 0.5-1.6 s)")
    parser.add_argument("--standbys", type=int, default=3, help="standbys_per_active in the standby-on arm")
    parser.add_argument("--start-delay", type=float, default=0.0, help="venue model: pod start delay (s)")
    args = parser.parse_args(argv)
    on = summarise(run_arm(args.jobs, args.body_s, args.standbys, "retire", args.start_delay))
    off = summarise(run_arm(args.jobs, args.body_s, 0, "retire", args.start_delay))
    hint = summarise(run_arm(args.jobs, args.body_s, 0, "hint", args.start_delay))
    n = args.jobs
    rows = [
        Row("B8", f"median handover wait, standby on ({on['handovers']} handovers of {n})", on["wait_p50"], "s",
            "0.94 s", "<= 0.1 s", at_most(on["wait_p50"], 0.1) if not on["failed"] else False),
        Row("B8", f"median handover wait, standby off ({off['handovers']} handovers of {n})", off["wait_p50"], "s",
            "51.0 s"),
        Row("B8", f"handovers served by standby ({on['by_standby']}/{on['handovers']})",
            on["by_standby"] / on["handovers"] if on["handovers"] else None, "", "101/117 (0.86)"),
        Row("B8", "submit->first instruction p50, standby on", on["start_p50"], "s", "1.66 s"),
        Row("B8", "submit->first instruction p50, standby off", off["start_p50"], "s", "28.2 s"),
        Row("B8", "loop makespan, standby on", on["makespan"], "s", "337 s"),
        Row("B8", "loop makespan, standby off", off["makespan"], "s", "1,023 s"),
        Row("9.5", "warm share, fresh tag per job: reuse_tag retire (standby off)", off["warm_share"], "",
            "about 0.5"),
        Row("9.5", "warm share, fresh tag per job: reuse_tag hint", hint["warm_share"], "", "0.99"),
        Row("9.5", f"pods used per {n} jobs: retire / hint ({off['pods']} / {hint['pods']})",
            float(hint["pods"]), "pods", "28.9 -> 2.5 created"),
    ]
    failed = on["failed"] + off["failed"] + hint["failed"]
    extra = {"arms": {"standby_on": on, "standby_off": off, "hint": hint},
             "settings": {"jobs": n, "body_s": args.body_s, "standbys_per_active": args.standbys,
                          "start_delay_s": args.start_delay, "virtual_gpus": 2}}
    if failed:
        print(f"warning: {len(failed)} job(s) did not succeed: {failed[:5]}", file=sys.stderr)
    return report("standby", rows, json_out=json_out, extra=extra)
