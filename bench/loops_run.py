"""B7's runner: one broker per repeat on the local backend, each workload's three arms in crossover order.

Each caller of a plan (an agent or the trainer) runs in its own thread with its own token: it sleeps its
stage's think pause, submits the stage's jobs together and waits for all of them (an RL barrier), then
moves on. Two pools share the broker, each on its own two virtual GPUs (the paper's two-GPU cap): `warm`
(a floor of two pods, standbys, `reuse_tag: retire`) serves Reuse On and Reuse Off; `fresh` (no warm
pods) serves single-use jobs. Both draw each pod start from the venue model on top of the real start.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from typing import Any

import httpx

from bench.broker_proc import BenchBroker
from broker.sim.stats import crossover_order
from broker.sim.workloads import ARMS, Arm, Caller, Plan, reuse_tag

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
POOL_OF: dict[Arm, str] = {"reuse-on": "warm", "reuse-off": "warm", "fresh-pod": "fresh"}
CAP = 2  # App. B.1: "a two-GPU cap"


def catalog(venue_delay: dict[str, Any], standbys: int) -> str:
    """The two pools as a catalog (JSON is YAML); every pod start draws from `venue_delay`."""
    template = {"venue_delay": venue_delay}
    warm = {"name": "warm", "gpus": 1, "min_count": CAP, "max_count": CAP, "max_idle_count": CAP,
            "idle_timeout": 600, "caller_hold_seconds": 600, "step": CAP, "standbys_per_active": standbys,
            "reuse_tag": "retire", "template": template}
    fresh = {"name": "fresh", "gpus": 1, "min_count": 0, "max_count": CAP, "max_idle_count": 0,
             "idle_timeout": 60, "step": CAP, "template": template}
    return json.dumps({"pools": [warm, fresh]})


def _pool(client: httpx.Client, name: str) -> dict[str, Any]:
    return next(p for p in client.get("/v1/pools").json()["pools"] if p["name"] == name)


def settle(client: httpx.Client, timeout_s: float = 60.0) -> bool:
    """Wait until both pools are quiet (no pod starting or busy, the warm floor up) twice 0.2 s apart, so one
    arm's pod starts and releases do not spill into the next arm's measurements."""
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while time.monotonic() < deadline:
        warm, fresh = _pool(client, "warm"), _pool(client, "fresh")
        ok = (warm["starting"] == 0 and warm["busy"] == 0 and warm["idle"] + warm["held"] >= CAP
              and fresh["starting"] == 0 and fresh["busy"] == 0)
        quiet = quiet + 1 if ok else 0
        if quiet >= 2:
            return True
        time.sleep(0.2)
    return False


def _run_caller(broker: BenchBroker, caller: Caller, arm: Arm, out: list[dict[str, Any]],
                errors: list[BaseException], start: threading.Barrier) -> None:
    try:
        with broker.client(caller.name) as c:
            start.wait()
            index = 0
            for stage in caller.stages:
                if stage.pause_s:
                    time.sleep(stage.pause_s)
                pending = []
                for job in stage.jobs:
                    body: dict[str, Any] = {"pool": POOL_OF[arm], "command": ["sleep", f"{job.body_s:.4f}"]}
                    tag = reuse_tag(arm, caller.name, index)
                    index += 1
                    if tag is not None:
                        body["lease_tag"] = tag
                    if arm == "fresh-pod":
                        body["single_use"] = True
                    response = c.post("/v1/jobs", json=body)
                    response.raise_for_status()
                    pending.append(response.json())
                for job, view in zip(stage.jobs, pending, strict=True):
                    while view["state"] not in TERMINAL:
                        view = c.get(f"/v1/jobs/{view['id']}", params={"wait_s": 30}).json()
                    out.append({**view, "kind": job.kind, "caller_name": caller.name})
    except BaseException as exc:  # noqa: BLE001 - reported by the arm, which fails the run
        errors.append(exc)


def run_arm(broker: BenchBroker, plan: Plan, arm: Arm) -> dict[str, Any]:
    """One arm of one repeat: every caller's loop; the jobs' start latencies, paths and the makespan."""
    jobs: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(plan.callers))
    threads = [threading.Thread(target=_run_caller, args=(broker, c, arm, jobs, errors, start), daemon=True)
               for c in plan.callers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"arm {arm} of {plan.name}: {errors[0]!r}") from errors[0]
    submitted = [j["timings"]["submitted_at"] for j in jobs]
    finished = [j["timings"].get("finished_at", 0.0) for j in jobs]
    starts = [j["timings"]["first_instruction_at"] - j["timings"]["submitted_at"] for j in jobs
              if "first_instruction_at" in j["timings"]]
    paths = Counter(j["acquisition"][0]["path"] for j in jobs if j.get("acquisition"))
    return {"arm": arm, "workload": plan.name, "seed": plan.seed, "jobs": len(jobs),
            "failed": [j["id"] for j in jobs if j["state"] != "SUCCEEDED"],
            "makespan": max(finished) - min(submitted), "starts": starts, "paths": dict(paths)}


def run_repeat(plans: dict[str, Plan], repeat: int, venue_delay: dict[str, Any], standbys: int,
               log: Any = sys.stderr) -> list[dict[str, Any]]:
    """One repeat: the workloads in turn on one fresh broker, each one's three arms in Williams crossover order.

    Callers are named per workload (`w-rl/trainer`), so one workload's owner holds are another's carry-over:
    the next callers break them as they queue, in every arm alike."""
    named = {name: Plan(plan.name, plan.seed, tuple(Caller(f"{name}.{c.name}", c.stages) for c in plan.callers))
             for name, plan in plans.items()}
    callers = tuple(c.name for plan in named.values() for c in plan.callers)
    order = crossover_order(ARMS, repeat)
    results = []
    with BenchBroker(callers=callers, pools=catalog(venue_delay, standbys),
                     extra=("--virtual-gpus", str(2 * CAP))) as broker, broker.client(callers[0]) as c:
        for name, plan in named.items():
            for arm in order:
                if not settle(c):
                    print(f"  note: pools not settled before {arm}: {_pool(c, 'warm')}", file=log)
                began = time.monotonic()
                result = run_arm(broker, plan, arm)
                result.update(workload=name, repeat=repeat, position=order.index(arm))
                results.append(result)
                print(f"  repeat {repeat} {name:<9} {arm:<9}: makespan {result['makespan']:6.2f} s, "
                      f"{result['jobs']} jobs, paths {result['paths']} ({time.monotonic() - began:.0f} s)", file=log)
    return results
