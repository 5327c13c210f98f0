"""Ray mode gangs (`mode: ray`): submit -> first task on an N-pod Ray cluster formed at job start.

Real sandboxes on the local backend, over REST. Per gang size, the first job creates its pods (cold);
the next ones find them warm (same caller and session). The driver pins one task to each node and
reports when the first one started; submit is the broker's `submitted_at`. Paper (App. C.6): 8.6 s
(N=2), 9.9 s (N=4), 13.1 s (N=8) warm, 14.4-19.6 s cold; warm pods save the pod start but not Ray's
own bootstrap (driver start 2.0-2.6 s, ray.init 0.4 s, first task 1.1 s after the last node registers).
Each warm job is split into phases from the head's timeline line (`firepool_agent.raymode.TIMELINE`) and the
driver's own clock, so a miss says where its time went; the host's load average is printed beside them.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

from bench.broker_proc import BenchBroker
from bench.common import Row, at_most, percentile
from firepool_agent.raymode import TIMELINE

POOLS = "pools:\n  - {name: cpu, max_count: 8, max_idle_count: 8, idle_timeout: 900, caller_hold_seconds: 900, step: 8}\n"

DRIVER = """
import time
started = time.time()
import json, socket
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
imported = time.time()
ray.init()
connected = time.time()

@ray.remote(num_cpus=0)
def where():
    return socket.gethostname(), time.time()

nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
out = ray.get([where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
               for n in nodes])
print(json.dumps({"nodes": len(nodes), "hosts": sorted(h for h, _ in out), "first_task_at": min(t for _, t in out),
                  "driver_at": started, "imported_at": imported, "connected_at": connected}))
"""

PAPER_WARM = {2: 8.6, 4: 9.9, 8: 13.1}
BEFORE_WARM = {2: 21.6, 4: 25.8}
"""Warm p50 on this 2-core build machine before the bootstrap was trimmed (commit 52e1692, docs/health.md)."""
PHASES = (  # (name, from, to): epoch-second marks of one job; the paper's figure where it gives one (App. C.6)
    ("submit -> the head's wrapper runs (claim, launch)", "submitted_at", "wrapper_at", "-"),
    ("  -> head GCS answers (ray start, GCS)", "wrapper_at", "gcs_up_at", "-"),
    ("  -> every node registered (raylets, agents, workers join)", "gcs_up_at", "nodes_up_at", "-"),
    ("  -> driver imported ray (driver start)", "nodes_up_at", "imported_at", "2.0-2.6 s"),
    ("  -> ray.init connected", "imported_at", "connected_at", "0.4 s"),
    ("  -> first task runs", "connected_at", "first_task_at", "1.1 s"),
)


def available() -> bool:
    return importlib.util.find_spec("ray") is not None


def first_task(sizes: tuple[int, ...], repeats: int) -> dict[int, dict[str, Any]]:
    """Per gang size: submit -> first task of the cold job and of each warm one, the warm jobs' phase marks, and
    the 1-minute load average when each job ended."""
    out: dict[int, dict[str, Any]] = {}
    with BenchBroker(pools=POOLS) as broker, broker.client() as c:
        for n in sizes:
            out[n] = {"cold": [], "warm": [], "marks": [], "load": []}
            body: dict[str, Any] = {
                "pool": "cpu",
                "pods": n,
                "lease_tag": f"ray{n}",
                "mode": "ray",
                "timeout_s": 600,
                "command": ["python3", "-c", DRIVER],
            }
            for i in range(repeats + 1):
                job = c.post("/v1/jobs", json=body).json()
                while job["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 30}).json()
                log = c.get(f"/v1/jobs/{job['id']}/logs").text
                if job["state"] != "SUCCEEDED":
                    raise RuntimeError(f"ray gang job failed: {job}\n{log[-2000:]}")
                result = json.loads(next(line for line in log.splitlines() if line.startswith("{")))
                if result["nodes"] != n:
                    raise RuntimeError(f"{result['nodes']} Ray nodes for a {n}-pod job")
                out[n]["cold" if i == 0 else "warm"].append(
                    result["first_task_at"] - job["timings"]["submitted_at"]
                )
                out[n]["load"].append(os.getloadavg()[0])
                if i:
                    head: dict[str, float] = next(
                        (
                            json.loads(line.split(TIMELINE, 1)[1])
                            for line in log.splitlines()
                            if TIMELINE in line
                        ),
                        {},
                    )
                    out[n]["marks"].append({"submitted_at": job["timings"]["submitted_at"], **head, **result})
    return out


def rows(sizes: tuple[int, ...], repeats: int) -> tuple[list[Row], dict[str, Any]]:
    if not available():
        return [
            Row(
                "G4",
                "Ray gang submit->first task: ray not installed (pip install -e '.[ray]' in the checkout)",
                None,
                "s",
                "8.6 s (N=2) - 13.1 s (N=8)",
            )
        ], {}
    measured = first_task(sizes, repeats)
    out: list[Row] = []
    for n, times in measured.items():
        paper = PAPER_WARM.get(n)
        warm = percentile(times["warm"], 50)
        before = f"; before: {BEFORE_WARM[n]} s here" if n in BEFORE_WARM else ""
        load = max(times["load"])
        out.append(
            Row(
                "G4",
                f"Ray {n}-pod gang, warm pods: submit->first task p50 ({len(times['warm'])} jobs; "
                f"load avg up to {load:.1f} on {os.cpu_count()} cores)",
                warm,
                "s",
                f"{paper} s (N={n}){before}" if paper else "-",
                f"<= {paper} s" if paper else "",
                at_most(warm, paper) if paper else None,
            )
        )
        for name, start, end, paper_phase in PHASES:
            spans = [m[end] - m[start] for m in times["marks"] if start in m and end in m]
            if spans:
                out.append(Row("G4", f"    {name}, p50", percentile(spans, 50), "s", paper_phase))
        out.append(
            Row(
                "G4",
                f"  ... cold (the job that created its {n} pods)",
                times["cold"][0],
                "s",
                "14.4-19.6 s (N=2-8)",
            )
        )
    return out, {"ray": measured}
