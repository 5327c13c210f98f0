"""B15: fragmentation — a week of mixed training/inference/notebook churn at 50–90% occupancy, in virtual time.

The run goes through the broker's own placement (`broker.fleet.placement.place`, via
`broker.fleet.churn`), once per policy: best-fit over topology sets, shape-aligned (ours, design §6 and
R1), first-fit (the first node that fits) and worst-fit (the most-free node: what a spreading scheduler
does; §10 rejects both). Workload (share of GPU-hours, mean duration): notebooks 1 GPU (10%, 1 h),
inference 2 GPUs (10%, 4 h) and 4 GPUs (25%, 6 h), a 4×1-GPU gang (5%, 2 h), training 8 GPUs on one
node (30%, 8 h) and 16 GPUs on two whole nodes of one domain (20%, 12 h). Figures are means of hourly
samples after a day of warm-up. The design's claim (seed 003, §2): at 50% occupancy, topology-blind
placement leaves ≈ 0.5 fully free 8-GPU nodes of 128 (128 × 0.5⁸ for random placement).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bench.common import RESULTS, Row, percentile, report
from broker.fleet.churn import MIXED, Result, fleet_of, run
from broker.fleet.placement import Policy

POLICIES: tuple[Policy, ...] = ("best_fit", "first_fit", "worst_fit")


def summarise(r: Result, nodes: int) -> dict[str, Any]:
    waits = sorted(r.gang_waits)
    return {"policy": r.policy, "occupancy": r.occupancy, "utilization": r.utilization / (nodes * 8),
            "free_nodes": r.mean("node"), "placeable_4": r.mean("4"), "eight_gpu_placed": r.eight_gpu_placed,
            "eight_gpu_at_once": r.at_once,
            "arrived_8": sum(n for name, n in r.arrived.items() if name in ("train-8", "train-16")),
            "gang_wait_p50_s": percentile(waits, 50) if waits else None,
            "gang_wait_p90_s": percentile(waits, 90) if waits else None,
            "half_open": r.half_open, "mixed": r.mixed,
            "series": [[s.t / 3600.0, s.placeable["node"], s.used] for s in r.samples]}


def plot(results: list[dict[str, Any]], occupancies: list[float], path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no plot"
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    colours = {"best_fit": "tab:green", "first_fit": "tab:orange", "worst_fit": "tab:red"}
    for occ, style in ((occupancies[0], "-"), (occupancies[-1], ":")):
        for r in results:
            if r["occupancy"] == occ:
                xs = [s[0] for s in r["series"]]
                axes[0].plot(xs, [s[1] for s in r["series"]], style, color=colours[r["policy"]],
                             label=f"{r['policy']} @ {occ:.0%}")
    axes[0].set(title="largest_placeable['node'] over time", xlabel="hour", ylabel="whole free nodes")
    axes[0].legend(fontsize=8)
    for policy in POLICIES:
        rs = [r for r in results if r["policy"] == policy]
        axes[1].plot([r["occupancy"] for r in rs], [r["free_nodes"] for r in rs], "o-", color=colours[policy],
                     label=policy)
        axes[2].plot([r["occupancy"] for r in rs], [(r["gang_wait_p90_s"] or 0) / 3600 for r in rs], "o-",
                     color=colours[policy], label=policy)
    axes[1].set(title="mean whole free nodes", xlabel="offered occupancy", ylabel="nodes")
    axes[2].set(title="queue wait p90, jobs of >= 8 GPUs", xlabel="offered occupancy", ylabel="hours")
    for ax in axes[1:]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench fragmentation", description=__doc__)
    parser.add_argument("--nodes", type=int, default=128, help="8-GPU nodes, 8 per domain (the design's cluster: 128)")
    parser.add_argument("--days", type=float, default=7.0, help="virtual days per run")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    occupancies = [0.5, 0.6, 0.7, 0.8, 0.9]
    nodes = fleet_of(args.nodes)
    results = [summarise(run(nodes, MIXED, occ, policy, hours=args.days * 24, seed=args.seed), args.nodes)
               for occ in occupancies for policy in POLICIES]
    by = {(r["policy"], r["occupancy"]): r for r in results}
    scale = f"{args.nodes} nodes"
    rows = [
        Row("B15", f"first-fit: whole free 8-GPU nodes at 50% ({scale})", by["first_fit", 0.5]["free_nodes"],
            "nodes", "≈ 0.5 of 128 (random)"),
        Row("B15", f"worst-fit (spreading): whole free nodes at 50% ({scale})", by["worst_fit", 0.5]["free_nodes"],
            "nodes", "≈ 0.5 of 128 (random)"),
        Row("B15", f"random placement, analytic: {args.nodes} × 0.5^8 at 50%", args.nodes * 0.5 ** 8, "nodes",
            "128 × 0.5^8 = 0.5"),
    ]
    for occ in occupancies:
        ours, first = by["best_fit", occ], by["first_fit", occ]
        rows.append(Row("B15", f"best-fit-aligned: whole free nodes at {occ:.0%} (first-fit "
                               f"{first['free_nodes']:.2f})", ours["free_nodes"], "nodes", "-",
                        "> first-fit", ours["free_nodes"] > first["free_nodes"]))
        rows.append(Row("B15", f"best-fit-aligned: 8+ GPU jobs placed on arrival at {occ:.0%} (first-fit "
                               f"{first['eight_gpu_at_once']} of {first['arrived_8']})", ours["eight_gpu_at_once"],
                        "jobs", "-", "> first-fit, or all", ours["eight_gpu_at_once"] > first["eight_gpu_at_once"]
                        or ours["eight_gpu_at_once"] == ours["arrived_8"]))
        rows.append(Row("B15", f"best-fit-aligned: gang queue wait p90 at {occ:.0%} (first-fit "
                               f"{(first['gang_wait_p90_s'] or 0) / 60:.1f} min)",
                        (ours["gang_wait_p90_s"] or 0) / 60, "min", "-"))
    png = plot(results, occupancies, str(RESULTS / "fragmentation.png"))
    series = RESULTS / "fragmentation-series.json"  # the plot's raw data: [hour, whole free nodes, GPUs used]
    series.write_text(json.dumps({f"{r['policy']}@{r['occupancy']}": r["series"] for r in results}) + "\n")
    extra = {"nodes": args.nodes, "days": args.days, "seed": args.seed, "plot": png, "series": str(series),
             "runs": [{k: v for k, v in r.items() if k != "series"} for r in results]}
    code = report("fragmentation", rows, json_out=json_out, extra=extra)
    if not json_out:
        print(f"plot: {png}")
    return code
