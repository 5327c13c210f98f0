"""B7: agent and RL loops, three arms, on the local backend with the paper's H200 cold start scaled by 1/10.

Arms (paper §9, App. B.3): Reuse On (a stable tag per agent or trainer), Reuse Off (a fresh tag per job, the
pool's `reuse_tag: retire` boundary), fresh pod per job (a single-use pod, no warm pool). Workloads (§9,
App. B.2): W-Agent with 2 and 4 agents, W-RL, as seeded plans paired across arms. Pods really start (bwrap
sandboxes); each start also waits a draw from the H200 venue model (Table 1: 22.1 s median, 34.7 s p90,
×2.4 for eight at once), times `--scale`. Bodies and think pauses are scaled by the same factor: the run is
the paper's loop in a tenth of its time units (App. B.2's bodies are fixed-duration payloads, so only the
ratio of body to start time matters), and the local warm start (tens of ms) stands in for the paper's
0.59 s (App. C.4) at about the same scale. ≥ 6 repeats in Williams crossover order; speedups are ratios
of median makespans with 95% bootstrap CIs (App. B.4); percentiles pool all jobs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.common import RESULTS, Row, at_least, report
from bench.loops_run import run_repeat
from broker.sim.stats import paired_difference, percentile, speedup
from broker.sim.venues import h200
from broker.sim.workloads import ARMS, Plan, workload

WORKLOADS = ("w-agent-2", "w-agent-4", "w-rl")
BAND_LOW = 0.76  # App. B.4: prediction intervals ×0.76–1.31 for makespan
PAPER_SPEEDUP_FRESH = {"w-agent-4": 13.0, "w-rl": 10.8}  # Table 5, H200 vs fresh pod per job (4 agents; RL)
PAPER_SPEEDUP_OFF = {"w-agent-2": (3.6, "H200"), "w-agent-4": (2.2, "CPU"), "w-rl": (4.5, "CPU")}  # Table 5
PAPER_P90_OFF_ON = (59.1, 3.52)  # Table 5 / Fig. 4c: H200 agent (2 agents), Reuse Off vs Reuse On, p90 start
PAPER_STARTS = {  # Table 5 start p50 / p90 (s) at full scale; None where the paper has no such column
    ("w-agent-4", "reuse-on"): (0.61, 3.51), ("w-agent-4", "fresh-pod"): (89.5, 354.6),
    ("w-rl", "reuse-on"): (3.92, 80.8), ("w-rl", "fresh-pod"): (115.8, 315.2),
    ("w-agent-2", "reuse-on"): (1.91, 3.52), ("w-agent-2", "reuse-off"): (2.29, 59.1),
}
PAPER_MAKESPAN = {("w-agent-4", "reuse-on"): 119.3, ("w-agent-4", "fresh-pod"): 1554.2,
                  ("w-rl", "reuse-on"): 163.0, ("w-rl", "fresh-pod"): 1761.9,
                  ("w-agent-2", "reuse-on"): 51.8, ("w-agent-2", "reuse-off"): 186.4}  # Table 5, median


def simulated_h200_rows(plans: dict[str, list[Plan]]) -> list[Row]:
    """The same workloads through the simulator (broker.sim) at full scale with the `h200` venue: rows with
    id B7 and metrics prefixed "simulated h200:"."""
    from broker.sim.tables import loop_rows

    del plans  # the simulator draws the same workloads from its own seeds (Table 5's H200 columns, 10 repeats as the paper's)
    return [Row(**{**r, "metric": "simulated h200: " + r["metric"].removeprefix("sim H200 ")})
            for r in loop_rows(seed=1, venues=("h200",))]


def _by_arm(runs: list[dict[str, Any]], name: str) -> dict[str, list[dict[str, Any]]]:
    """The runs of one workload per arm, ordered by repeat (so arms pair up by index)."""
    return {arm: sorted((r for r in runs if r["workload"] == name and r["arm"] == arm), key=lambda r: r["repeat"])
            for arm in ARMS}


def _paper_s(value: float | None, scale: float) -> str:
    return "-" if value is None else f"{value:g} s (x{scale:g}: {value * scale:.3g})"


def rows_for(runs: list[dict[str, Any]], name: str, scale: float) -> list[Row]:
    arms = _by_arm(runs, name)
    span = {arm: [r["makespan"] for r in rs] for arm, rs in arms.items()}
    pooled = {arm: [s for r in rs for s in r["starts"]] for arm, rs in arms.items()}
    rows: list[Row] = []
    fresh = speedup(span["reuse-on"], span["fresh-pod"])
    paper = PAPER_SPEEDUP_FRESH.get(name)
    rows.append(Row("B7", f"{name}: loop speedup, Reuse On vs fresh pod {fresh.lo:.1f}-{fresh.hi:.1f}x CI",
                    fresh.estimate, "x", f"{paper}x" if paper else "- (4 agents only)",
                    f">= {paper * BAND_LOW:.1f}x" if paper else "", at_least(fresh.estimate, paper * BAND_LOW)
                    if paper else None))
    off = speedup(span["reuse-on"], span["reuse-off"])
    paper_off, venue = PAPER_SPEEDUP_OFF[name]
    h200_row = venue == "H200"
    rows.append(Row("B7", f"{name}: loop speedup, Reuse On vs Reuse Off {off.lo:.1f}-{off.hi:.1f}x CI",
                    off.estimate, "x", f"{paper_off}x ({venue})", f">= {paper_off * BAND_LOW:.2f}x" if h200_row else "",
                    at_least(off.estimate, paper_off * BAND_LOW) if h200_row else None))
    if name == "w-agent-2":
        ratio = percentile(pooled["reuse-off"], 90) / percentile(pooled["reuse-on"], 90)
        paper_ratio = PAPER_P90_OFF_ON[0] / PAPER_P90_OFF_ON[1]
        rows.append(Row("B7", f"{name}: p90 start, Reuse Off / Reuse On", ratio, "x",
                        f"{PAPER_P90_OFF_ON[0]} / {PAPER_P90_OFF_ON[1]} s = {paper_ratio:.1f}x",
                        f">= {paper_ratio:.1f}x", at_least(ratio, paper_ratio)))
        diff = paired_difference([percentile(r["starts"], 50) for r in arms["reuse-on"]],
                                 [percentile(r["starts"], 50) for r in arms["reuse-off"]])
        rows.append(Row("B7", f"{name}: paired p50 start diff, Off - On [{diff.lo:.3f}, {diff.hi:.3f}]",
                        diff.estimate, "s", "+0.43 s [-0.03, 0.84] (x0.1: 0.043)"))
    for arm in ARMS:
        paper_p = PAPER_STARTS.get((name, arm))
        for q, i in ((50, 0), (90, 1)):
            rows.append(Row("B7", f"{name}: start p{q}, {arm} (submit->first instr.)",
                            percentile(pooled[arm], q) if pooled[arm] else None, "s",
                            _paper_s(paper_p[i] if paper_p else None, scale)))
        medians = sorted(span[arm])
        rows.append(Row("B7", f"{name}: makespan median, {arm}", percentile(medians, 50), "s",
                        _paper_s(PAPER_MAKESPAN.get((name, arm)), scale)))
    return rows


def main(argv: Sequence[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench loops", description=__doc__)
    parser.add_argument("--repeats", type=int, default=6, help="paired repeats (>= 6 for the paper's design)")
    parser.add_argument("--quick", action="store_true", help="2 repeats: a smoke run, not the result")
    parser.add_argument("--scale", type=float, default=0.1, help="the venue's time scale (cold start, bodies, pauses)")
    parser.add_argument("--standbys", type=int, default=3, help="standbys per active pod (paper §9.1: 3 on H200)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of " + ",".join(WORKLOADS))
    parser.add_argument("--no-plot", action="store_true", help="skip the start-latency CDF PNG")
    args = parser.parse_args(list(argv))
    repeats = 2 if args.quick else args.repeats
    names = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown or repeats < 2:
        parser.error(f"unknown workloads {unknown}" if unknown else "at least 2 repeats (paired effects)")
    model = h200.cold_start.scaled(args.scale)
    began = time.monotonic()
    runs: list[dict[str, Any]] = []
    plans: dict[str, list[Plan]] = {n: [] for n in names}
    for r in range(repeats):
        plans_r = {name: workload(name, seed=r) for name in names}
        for name, plan in plans_r.items():
            plans[name].append(plan)
        runs += run_repeat({n: p.scaled(args.scale) for n, p in plans_r.items()}, r, model.template(seed=r),
                           args.standbys)
        print(f"repeat {r} done after {time.monotonic() - began:.0f} s", file=sys.stderr)
    failed = [j for r in runs for j in r["failed"]]
    rows = [Row("B7", f"failed jobs ({sum(r['jobs'] for r in runs)} run)", float(len(failed)), "jobs", "0 of 1,600",
                "0", not failed)]
    for name in names:
        rows += rows_for(runs, name, args.scale)
    rows += simulated_h200_rows(plans)
    settings = {"repeats": repeats, "scale": args.scale, "standbys_per_active": args.standbys, "cap": 2,
                "venue": "h200", "venue_delay": model.template(), "workloads": names,
                "wall_s": round(time.monotonic() - began, 1)}
    plot = None
    if not args.no_plot:
        from bench.loops_plot import plot_cdfs

        plot = plot_cdfs(runs, names, args.scale, RESULTS / "loops-start-cdf.png", PAPER_STARTS)
    return report("loops", rows, json_out=json_out, extra={"settings": settings, "runs": runs,
                                                          "plot": str(plot.name) if plot else None})
