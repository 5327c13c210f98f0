"""B5: warm start over REST on the local backend — submit -> first instruction, by phase.

200 sequential jobs of one caller and one session tag (`true`), after a first job that creates the pod.
Phases from the broker's own timestamps: dispatch (submitted -> committed: admission, insert, claim,
version-checked commit), hand-off (committed -> handed off to the agent), first instruction (handed
off -> the process exec'd). Accept is the client's POST round trip.
"""

from __future__ import annotations

import argparse
import time

from bench.broker_proc import BenchBroker
from bench.common import Row, at_most, percentile, report


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench warm-start", description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--db", help="job store URL (default: SQLite file in a temp state dir)")
    args = parser.parse_args(argv)
    extra = ("--db", args.db) if args.db else ()
    total, dispatch, handoff, first, accept, share = [], [], [], [], [], []
    paths: dict[str, int] = {}
    with BenchBroker(extra=extra) as broker, broker.client() as c:
        body = {"pool": "cpu", "command": ["true"], "lease_tag": "warm-start"}
        for i in range(args.jobs + 1):
            t0 = time.time()
            job = c.post("/v1/jobs", json=body).json()
            accepted = time.time()
            while job["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 30}).json()
            if i == 0:
                continue  # the pod's creation
            t = job["timings"]
            path = job["acquisition"][0]["path"]
            paths[path] = paths.get(path, 0) + 1
            accept.append(accepted - t0)
            total.append(t["first_instruction_at"] - t["submitted_at"])
            dispatch.append(t["committed_at"] - t["submitted_at"])
            handoff.append(t["handed_off_at"] - t["committed_at"])
            first.append(t["first_instruction_at"] - t["handed_off_at"])
            share.append(t["handed_off_at"] - t["submitted_at"])
    ms = 1000.0
    p50, p90 = percentile(total, 50) * ms, percentile(total, 90) * ms
    rows = [
        Row("B5", f"warm submit->first instruction p50 ({args.jobs} jobs, {paths})", p50, "ms", "590 ms", "<= 50 ms",
            at_most(p50, 50)),
        Row("B5", "warm submit->first instruction p90", p90, "ms", "-", "<= 100 ms", at_most(p90, 100)),
        Row("B5", "broker share (submitted->handed off) p50", percentile(share, 50) * ms, "ms", "50 ms",
            "<= 10 ms", at_most(percentile(share, 50) * ms, 10)),
        Row("B5", "phase: accept (client POST round trip) p50", percentile(accept, 50) * ms, "ms", "40 ms"),
        Row("B5", "phase: dispatch (submitted->committed) p50", percentile(dispatch, 50) * ms, "ms", "10 ms"),
        Row("B5", "phase: hand-off (committed->handed off) p50", percentile(handoff, 50) * ms, "ms", "390 ms"),
        Row("B5", "phase: first instruction (handed off->exec) p50", percentile(first, 50) * ms, "ms", "120 ms"),
    ]
    return report("warm-start", rows, json_out=json_out)
