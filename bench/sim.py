"""`firepool sim SCENARIO`: the paper's scenarios in the simulator, our figures beside the paper's.

Scenarios: `loops` (Table 5: W-Agent 2/4 and W-RL, Reuse On vs Reuse Off vs fresh pod per job; with
`--venue` the three arms on that venue), `standby` (Table 6), `frontier` (App. C.1, as `bench frontier`),
`late-binding` (Fig. 5, as `bench late-binding --sim`), `sweep` (Fig. 7), `tenants` (the CPU Reuse Off columns
across tenant loads) and `calibrate` (measures the
local backend and writes the `local` venue). `--plot` writes PNGs under bench/results/.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from bench.common import RESULTS, Row, report
from bench.simplots import save_json, sweep_plot
from broker.sim import scenarios, sweeps, tables
from broker.sim.venues import venue as venue_named
from broker.sim.workloads import ARMS

LOCAL_VENUE = RESULTS / "venue-local.json"
"""Where `firepool sim calibrate` writes the local venue and `--venue local` reads it."""


def loops_table(columns: list[dict[str, Any]]) -> str:
    lines = [f"{'Table 5 column':<32} {'':>9} {'start p50 On/base (s)':>24} {'start p90 On/base (s)':>24} "
             f"{'makespan On/base (s)':>24} {'speedup':>18}"]
    for c in columns:
        p = c["paper"]
        lines.append(f"{c['column']:<32} {'ours':>9} {c['p50_on']:>11.2f} / {c['p50_off']:<10.2f} "
                     f"{c['p90_on']:>11.2f} / {c['p90_off']:<10.2f} {c['mk_on']:>11.1f} / {c['mk_off']:<10.1f} "
                     f"{c['speedup']:>6.2f}x [{c['speedup_ci'][0]:.2f}, {c['speedup_ci'][1]:.2f}]")
        lines.append(f"{'':<32} {'paper':>9} {p['p50_on']:>11.2f} / {p['p50_off']:<10.2f} "
                     f"{p['p90_on']:>11.2f} / {p['p90_off']:<10.2f} {p['mk_on']:>11.1f} / {p['mk_off']:<10.1f} "
                     f"{p['speedup']:>6.2f}x (band {tables.BAND[0] * p['speedup']:.2f}-{tables.BAND[1] * p['speedup']:.2f})")
        paper_paths = c.get("paper_paths") or {}
        for arm, mine in (("reuse-on", c["paths_on"]), (c["baseline"], c["paths_off"])):
            theirs = paper_paths.get(arm)
            lines.append(f"{'':<32} {'paths':>9} {arm:<10} warm/standby/recycled/new {tables.paths_text(mine):<22} "
                         f"paper {tables.paths_text(theirs) if theirs else '-'}")
        if c["venue"] != "cpu":  # a CPU column's pool holds its tenants' pods too
            held = tables.PAPER_HELD.get(c["column"])
            creating = c["creating_share_off"]
            ours = f"{c['held_per_job_on']:.1f} / {c['held_per_job_off']:.1f}"
            if creating is not None:
                ours += f" ({creating:.0%} creating pods)"
            theirs = (f"{held['per_job_on']} / {held['per_job_off']} ({held['creating_off']:.0%} creating pods)"
                      if held else "-")
            lines.append(f"{'':<32} {'held':>9} GPU-s per job On / {c['baseline']} {ours:<28} paper {theirs}")
        if c.get("tenants"):
            lines.append(f"{'':<32} {'':>9} beside tenant load {c['tenants']:g} sessions/s (App. B.1)")
    return "\n".join(lines)


def tenant_table(table: list[dict[str, Any]]) -> str:
    lines = [f"{'CPU column':<32} {'tenants/s':>9} {'start p50 On/Off (s)':>22} {'makespan On/Off (s)':>22} "
             f"{'speedup':>18}"]
    for c in table:
        lines.append(f"{c['column']:<32} {c['tenants']:>9g} {c['p50_on']:>10.2f} / {c['p50_off']:<9.2f} "
                     f"{c['mk_on']:>10.1f} / {c['mk_off']:<9.1f} {c['speedup']:>6.2f}x "
                     f"[{c['speedup_ci'][0]:.2f}, {c['speedup_ci'][1]:.2f}]  paper {c['paper']['speedup']}x")
    return "\n".join(lines)


def cdf_plot(columns: list[dict[str, Any]], runs: dict[str, dict[str, list[float]]], path: Any) -> None:
    from bench.simplots import _plt

    plt = _plt()
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.8), squeeze=False)
    for ax, (column, arms) in zip(axes[0], runs.items(), strict=True):
        for arm, lat in arms.items():
            xs = sorted(lat)
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=arm)
        ax.set_xscale("log")
        ax.set_xlabel("submit -> first instruction (s, log)")
        ax.set_ylabel("fraction of jobs")
        ax.set_title(column, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_loops(args: argparse.Namespace) -> int:
    if args.venue:
        venue = venue_named(args.venue, LOCAL_VENUE)
        out: dict[str, Any] = {}
        print(f"{'workload':<12} {'arm':<10} {'p50 s':>8} {'p90 s':>8} {'makespan s':>11} {'pods':>5}")
        for name in ("w-agent-2", "w-agent-4", "w-rl"):
            for arm in ARMS:
                rs = [scenarios.run_loop(name, venue, arm, args.seed * 1000 + r) for r in range(args.repeats)]
                s = scenarios.summary(rs)
                out[f"{name}/{arm}"] = s
                print(f"{name:<12} {arm:<10} {s['p50']:>8.2f} {s['p90']:>8.2f} {s['makespan']:>11.1f} "
                      f"{s['pods_created']:>5.0f}")
        save_json(f"sim-loops-{venue.name}", out)
        return 0
    columns = tables.loop_columns(args.seed, args.repeats)
    rows = [Row(**r) for r in tables.loop_rows(columns=columns)]
    if args.plot:
        runs = {c["column"]: {"reuse-on": c["latencies_on"], c["baseline"]: c["latencies_off"]} for c in columns}
        cdf_plot(columns, runs, RESULTS / "sim-loops-cdf.png")
    if not args.json:
        print(loops_table(columns))
        print()
    return report("sim-loops", rows, json_out=args.json, extra={"columns": columns})


def run_tenants(args: argparse.Namespace) -> int:
    table = tables.tenant_sensitivity(args.seed, args.repeats)
    rows = [Row(**r) for r in tables.tenant_rows(table)]
    if not args.json:
        print(tenant_table(table))
        print()
    columns = [{k: v for k, v in c.items() if not k.startswith("latencies")} for c in table]
    return report("sim-tenants", rows, json_out=args.json,
                  extra={"columns": columns, "default": tables.CPU_TENANTS.sessions_per_s})


def run_standby(args: argparse.Namespace) -> int:
    table = tables.standby_table(args.seed, args.repeats)
    rows = [Row(**r) for r in tables.standby_rows(table)]
    if not args.json:
        on, off, p = table["on"], table["off"], table["paper"]
        print(f"{'Table 6 (H200, 2-GPU pool)':<40} {'standby on':>22} {'standby off':>22}")
        print(f"{'handovers served by standby':<40} {on['by_standby']:>9}/{on['handovers']:<4} (paper 101/117) "
              f"{off['by_standby']:>5}/{off['handovers']:<4} (paper 0/156)")
        print(f"{'handover submit->first, median (s)':<40} {on['wait']:>9.2f} (paper {p['wait_on']}) "
              f"{off['wait']:>9.2f} (paper {p['wait_off']})")
        print(f"{'submit->first p50 (s)':<40} {on['p50']:>9.2f} (paper {p['p50_on']}) "
              f"{off['p50']:>9.2f} (paper {p['p50_off']})")
        print(f"{'loop makespan, median (s)':<40} {on['makespan']:>9.1f} (paper {p['mk_on']:.0f}) "
              f"{off['makespan']:>9.1f} (paper {p['mk_off']:.0f})")
        print()
    return report("sim-standby", rows, json_out=args.json, extra={"table": table})


def run_sweep(args: argparse.Namespace) -> int:
    seeds = range(args.seed, args.seed + args.repeats)
    data = [sweeps.sweep("w-rl", seeds=seeds), sweeps.sweep("w-agent-4", seeds=seeds)]
    sweep_plot(data, RESULTS / "sim-sweep.png")
    rows = []
    for sw in data:
        zero = sw["series"]["0"]["median"]
        cross = sweeps.crossing(sw["lengths"], zero)
        paper = sw["paper"]
        rows.append(Row("F7", f"{sw['workload']}: speedup falls below 1.1x at body length (think 0)", cross, "s",
                        f"~{paper['below_1_1_at_s']:.0f} s", "", None))
        rows.append(Row("F7", f"{sw['workload']}: speedup at 1 s bodies, think 0", zero[0], "x",
                        f"{paper['short'][0]}-{paper['short'][1]}x (measured {paper['measured_short']}x)", "> 1.1x",
                        zero[0] > 1.1))
        long_think = sw["series"][f"{sweeps.THINKS_S[-1]:g}"]["median"]
        rows.append(Row("F7", f"{sw['workload']}: speedup at 1 s bodies, think {sweeps.THINKS_S[-1]:g} s "
                        f"(> {scenarios.KEEP_ALIVE_S:g} s keep-alive)", long_think[0], "x", "~1x (vanishes)", "< 1.1x",
                        long_think[0] < 1.1))
    return report("sim-sweep", rows, json_out=args.json, extra={"sweeps": data})


def main(argv: list[str]) -> int:
    scenario = argv[0] if argv else ""
    if scenario == "frontier":
        from bench.frontier import main as frontier_main

        rest = [a for a in argv[1:] if a not in ("--json", "--plot")]
        return frontier_main(rest, json_out="--json" in argv)
    if scenario == "late-binding":
        from bench.late_binding_sim import main as lb_main

        rest = [a for a in argv[1:] if a not in ("--json", "--plot")]
        return lb_main(rest, json_out="--json" in argv)
    if scenario == "calibrate":
        from bench.calibrate import main as calibrate_main

        return calibrate_main(argv[1:], LOCAL_VENUE)
    parser = argparse.ArgumentParser(prog=f"firepool sim {scenario}", description=__doc__)
    parser.add_argument("--venue", choices=("h200", "cpu", "local"), help="loops: the three arms on this venue")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=None, help="paired repeats (loops: the paper's per column, 10 on H200 and 6 on CPU; standby 10, sweep 3)")
    parser.add_argument("--plot", action="store_true", help="write PNGs under bench/results/")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv[1:])
    started = time.monotonic()
    if scenario == "loops":
        if args.venue:
            args.repeats = args.repeats or 6
        rc = run_loops(args)
    elif scenario == "tenants":
        args.repeats = args.repeats or 6
        rc = run_tenants(args)
    elif scenario == "standby":
        args.repeats = args.repeats or 10
        rc = run_standby(args)
    elif scenario == "sweep":
        args.repeats = args.repeats or 3
        rc = run_sweep(args)
    else:
        print(f"unknown scenario {scenario!r}", file=sys.stderr)
        return 2
    if not args.json:
        print(f"(simulated in {time.monotonic() - started:.1f} s of wall time)")
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
