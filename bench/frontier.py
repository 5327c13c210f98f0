"""B9: held capacity against start latency, App. C.1's grid in the simulator, our table beside the paper's.

The simulator runs Firepool's own control plane (tracker, scaler, holds, dispatcher) in virtual time with the
CPU venue (the production 22 s pod start, the 16-pod cap): W-Agent agent sessions arrive steady, bursty or
diurnal; each pool policy (keep-alive 15–900 s with no floor or idle cap, a fresh pod per job, and a floor ×
idle-cap grid at 60 s on the bursty pattern) runs the same arrivals. Held capacity counts each pod from binding
to deletion (§9.2) ÷ an always-on pool sized to the peak concurrency over the workload's span; Δp50 is against
that always-on pool. Hand-offs are drawn with the paper's spread (§9.2), so the share of jobs that wait for a pod
moves the median. Median of 3 seeds, as the paper's table. The paper does not publish the workload behind its
table; ours is documented in docs/simulator.md. Each row checks one ordering, crossover or figure the paper
states (App. C.1's table and text, §9.2) and prints the paper's cell beside ours.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench.common import RESULTS, Row, report
from bench.simplots import frontier_plot, save_json
from broker.sim import openloop
from broker.sim.tables import fan_out
from broker.sim.venues import cpu
from broker.sim.workloads import PATTERNS

KEEP_ALIVES = (15.0, 60.0, 120.0, 300.0, 900.0)
PAPER_C1: dict[str, dict[str, tuple[float, float | None]]] = {
    # pattern -> column -> (held ÷ always-on, Δp50 s); App. C.1's table (Δp50 not recorded at 300 s)
    "steady": {
        "15": (0.435, 0.38),
        "60": (0.571, 0.08),
        "120": (0.679, 0.01),
        "300": (0.916, None),
        "900": (1.543, -0.02),
        "fresh": (1.347, 22.8),
    },
    "bursty": {
        "15": (0.371, 0.64),
        "60": (0.476, 0.27),
        "120": (0.615, 0.13),
        "300": (0.849, None),
        "900": (1.484, 0.09),
        "fresh": (0.646, 23.0),
    },
    "diurnal": {
        "15": (0.486, 0.37),
        "60": (0.606, 0.01),
        "120": (0.659, 0.03),
        "300": (0.860, None),
        "900": (1.124, -0.01),
        "fresh": (1.543, 22.9),
    },
}
GRID = (
    openloop.Knobs("floor 1, idle cap 2, 60 s", floor=1, idle_cap=2, keep_alive=60.0),
    openloop.Knobs("floor 2, idle cap 2, 60 s", floor=2, idle_cap=2, keep_alive=60.0),
    openloop.Knobs("floor 4, idle cap 2, 60 s", floor=4, idle_cap=2, keep_alive=60.0),
    openloop.Knobs("floor 0, idle cap 2, 60 s", floor=0, idle_cap=2, keep_alive=60.0),
)
FRONTIER_RATE = 0.08
"""Agent sessions per second (mean): the rate at which the steady pattern's peak concurrency is 5–7 jobs, as App.
C.1 states (ours: 5–6 over seeds; 0.06/s gives 4–5). The paper's fresh pod per job pays one pod start in every
pattern (+22.8–23.0 s); at this rate ours queue at the 16-pod cap in bursts and the diurnal peak (a miss)."""
OVERSHOOT = ((11, 16), (5, 7))
"""App. C.1: "the scaler creates more pods than the peak concurrency during bursts (11–16 against 5–7), because
queued calls trigger creates while released pods free up seconds later"; the rows check most pods ÷ peak against
11/7–16/5, an independent check that our scaler overshoots as the paper's does."""
FRONTIER_HORIZON_S = 900.0
BAND = (0.76, 1.31)
"""App. B.4: the simulator's prediction interval for makespan and throughput, ×0.76–1.31 (held cells)."""
QUEUE_BAND = (0.69, 1.44)
"""App. B.4: the prediction interval for queue medians, ×0.69–1.44 (a fresh pod's Δp50 is a queue wait)."""


def _knobs(pattern: str) -> list[openloop.Knobs]:
    ks = [openloop.Knobs(f"{t:g}", keep_alive=t) for t in KEEP_ALIVES] + [
        openloop.Knobs("fresh", single_use=True)
    ]
    return ks + list(GRID) if pattern == "bursty" else ks


def _task(args: tuple[str, int, float, float]) -> tuple[str, int, Any]:
    pattern, seed, rate, horizon = args
    ref, cells = openloop.frontier_cells(cpu, pattern, _knobs(pattern), seed, rate=rate, horizon_s=horizon)  # type: ignore[arg-type]
    return pattern, seed, (ref, cells)


def frontier_table(
    seeds: Sequence[int] = (1, 2, 3),
    *,
    rate: float = FRONTIER_RATE,
    horizon_s: float = FRONTIER_HORIZON_S,
    workers: int = 1,
) -> dict[str, Any]:
    """App. C.1's grid, CPU venue: per pattern and policy the median over seeds of held ÷ always-on and Δp50."""
    tasks = [(p, s, rate, horizon_s) for p in PATTERNS for s in seeds]
    done = fan_out(_task, tasks, workers)
    table: dict[str, Any] = {}
    for pattern in PATTERNS:
        runs = [cells for p, _, (ref, cells) in done if p == pattern]
        refs = [ref for p, _, (ref, cells) in done if p == pattern]
        ref_p50 = statistics.median(r.p50 for r in refs)
        table[pattern] = {
            "peak": statistics.median(r.peak for r in refs),
            "ref_p50": ref_p50,
            "ref_p90": statistics.median(r.p90 for r in refs),
            "cells": {
                c.label: {
                    "held": c.held_ratio,
                    "dp50": c.p50 - ref_p50,
                    "p50": c.p50,
                    "p90": c.p90,
                    "hit": c.hit_rate,
                    "pods": c.pods_created,
                    "max_pods": c.extra.get("max_pods", 0.0),
                    "unused_idle": c.extra.get("unused_idle", 0.0),
                    "empty": c.extra.get("empty", 0.0),
                    "new_pod_jobs": c.extra.get("new_pod_jobs", 0.0),
                    "starting": c.extra.get("starting", 0.0),
                    "busy": c.extra.get("busy", 0.0),
                    "tail": c.extra.get("tail", 0.0),
                }
                for c in openloop.median_cells(runs)
            },
        }
    return {
        "patterns": table,
        "seeds": list(seeds),
        "rate": rate,
        "horizon_s": horizon_s,
        "callers": openloop.CALLERS,
        "ceiling": cpu.cap,
        "paper": PAPER_C1,
    }


def _row(metric: str, ours: float, unit: str, paper: str, target: str, met: bool) -> Row:
    return Row(id="B9", metric=metric, ours=ours, unit=unit, paper=paper, target=target, met=met)


def frontier_rows(table: dict[str, Any]) -> list[Row]:
    """One row per ordering, crossover or figure App. C.1 and §9.2 state; the paper's cell beside ours."""
    t = table["patterns"]
    rows: list[Row] = []
    for pattern in PATTERNS:
        cells, paper = t[pattern]["cells"], PAPER_C1[pattern]
        held = [cells[f"{k:g}"]["held"] for k in KEEP_ALIVES]
        rows.append(
            _row(
                f"{pattern}: held rises with keep-alive at every step 15->900 s (x at 900 / x at 15 s)",
                held[-1] / held[0],
                "x",
                " < ".join(f"{paper[f'{k:g}'][0]}" for k in KEEP_ALIVES),
                "rises at every step",
                all(b > a for a, b in zip(held, held[1:], strict=False)),
            )
        )
        rows.append(
            _row(
                f"{pattern}: 900 s keep-alive holds more than the always-on pool",
                held[-1],
                "x",
                f"{paper['900'][0]}x",
                "> 1x",
                held[-1] > 1.0,
            )
        )
        for tau in ("60", "120"):
            ph, pd = paper[tau]
            rows.append(
                _row(
                    f"{pattern}: held at {tau} s keep-alive (dp50 {cells[tau]['dp50']:+.2f} s)",
                    cells[tau]["held"],
                    "x",
                    f"{ph}x ({pd:+.2f} s)",
                    f"{BAND[0] * ph:.3g}-{BAND[1] * ph:.3g} x",
                    BAND[0] * ph <= cells[tau]["held"] <= BAND[1] * ph,
                )
            )
        fresh, fd = cells["fresh"], paper["fresh"][1] or 0.0
        rows.append(
            _row(
                f"{pattern}: fresh pod per job pays a pod start (dp50)",
                fresh["dp50"],
                "s",
                f"+{fd} s",
                f"{QUEUE_BAND[0] * fd:.3g}-{QUEUE_BAND[1] * fd:.3g} s",
                QUEUE_BAND[0] * fd <= fresh["dp50"] <= QUEUE_BAND[1] * fd,
            )
        )
        rows.append(
            _row(
                f"{pattern}: fresh pod per job is not the cost floor (held / held at 15 s)",
                fresh["held"] / held[0],
                "x",
                f"{paper['fresh'][0] / paper['15'][0]:.2f}x ({paper['fresh'][0]} / {paper['15'][0]})",
                "> 1x",
                fresh["held"] > held[0],
            )
        )
        cheaper = paper["fresh"][0] < paper["900"][0]
        rows.append(
            _row(
                f"{pattern}: fresh pod per job vs 900 s keep-alive (held fresh / held 900 s)",
                fresh["held"] / held[-1],
                "x",
                f"{paper['fresh'][0] / paper['900'][0]:.2f}x ({paper['fresh'][0]} vs {paper['900'][0]})",
                "< 1x (fresh cheaper)" if cheaper else "> 1x (fresh dearer)",
                (fresh["held"] < held[-1]) if cheaper else (fresh["held"] > held[-1]),
            )
        )
    short = [t[p]["cells"][tau]["dp50"] for p in PATTERNS for tau in ("60", "120")]
    rows.append(
        _row(
            "dp50 at 60-120 s keep-alive, worst pattern (§9.2)",
            max(short),
            "s",
            "+0.01 to +0.27 s",
            "<= +0.27 s",
            max(short) <= 0.27,
        )
    )
    falls = [t[p]["cells"]["15"]["dp50"] - t[p]["cells"]["120"]["dp50"] for p in PATTERNS]
    rows.append(
        _row(
            "dp50 shrinks from 15 s to 120 s keep-alive, every pattern (least drop)",
            min(falls),
            "s",
            "0.38->0.01, 0.64->0.13, 0.37->0.03 s",
            "> 0 s",
            min(falls) > 0.0,
        )
    )
    b60 = {p: t[p]["cells"]["60"]["held"] for p in PATTERNS}
    rows.append(
        _row(
            "bursty holds least at 60 s keep-alive",
            b60["bursty"],
            "x",
            "0.476 < 0.571, 0.606",
            "bursty < steady, diurnal",
            b60["bursty"] < min(b60["steady"], b60["diurnal"]),
        )
    )
    lo, hi = OVERSHOOT[0][0] / OVERSHOOT[1][1], OVERSHOOT[0][1] / OVERSHOOT[1][0]
    for pattern in PATTERNS:
        most, peak = t[pattern]["cells"]["900"]["max_pods"], t[pattern]["peak"]
        rows.append(
            _row(
                f"{pattern}, 900 s: the scaler overshoots the peak concurrency: most pods at once "
                f"{most:.0f} against {peak:.0f} (x peak)",
                most / peak,
                "x",
                "11-16 against 5-7",
                f"{lo:.2f}-{hi:.2f}x (11/7-16/5)",
                lo <= most / peak <= hi,
            )
        )
    bc = t["bursty"]["cells"]
    f1 = bc["floor 1, idle cap 2, 60 s"]["held"]
    rows.append(
        _row(
            "bursty: floor 1, idle cap 2, 60 s keep-alive held",
            f1,
            "x",
            "0.52x (measured, local cluster; bare 60 s 0.24x, 900 s 1.15x)",
            "between bare 60 s and 900 s",
            bc["60"]["held"] < f1 < bc["900"]["held"],
        )
    )
    f4 = bc["floor 4, idle cap 2, 60 s"]
    rows.append(
        _row(
            f"bursty: floor 4, idle cap 2, 60 s: p90 start (held {f4['held']:.2f}x)",
            f4["p90"],
            "s",
            "3.39 s at 0.78x",
            f"< bare 60 s p90 ({bc['60']['p90']:.3g} s), held < 1x",
            f4["p90"] < bc["60"]["p90"] and f4["held"] < 1.0,
        )
    )
    return rows


def side_by_side(table: dict[str, Any]) -> str:
    lines = ["held ÷ always-on (Δp50 s): ours | paper (App. C.1)"]
    cols = [f"{t:g}" for t in KEEP_ALIVES] + ["fresh"]
    lines.append(
        f"{'pattern':<9}" + "".join(f"{('τ=' + c + ' s') if c != 'fresh' else 'fresh pod':>30}" for c in cols)
    )
    for pattern in PATTERNS:
        cells, paper = table["patterns"][pattern]["cells"], PAPER_C1[pattern]
        out = f"{pattern:<9}"
        for c in cols:
            ours = f"{cells[c]['held']:.2f} ({cells[c]['dp50']:+.2f})"
            ph, pd = paper[c]
            theirs = f"{ph:.3f}" + (f" ({pd:+.2f})" if pd is not None else "")
            out += f"{ours + ' | ' + theirs:>30}"
        lines.append(out)
        p = table["patterns"][pattern]
        lines.append(
            f"{'':<9}peak concurrency {p['peak']:.0f}, always-on p50 {p['ref_p50']:.2f} s; p90 at 15/60/120 s "
            + "/".join(f"{cells[k]['p90']:.1f}" for k in ("15", "60", "120"))
            + " s"
        )
        lines.append(
            f"{'':<9}most pods at once at 15/60/120/300/900 s: "
            + "/".join(f"{cells[f'{k:g}']['max_pods']:.0f}" for k in KEEP_ALIVES)
            + f" against peak {p['peak']:.0f} (paper: 11-16 against 5-7); at 60 s {cells['60']['pods']} pods "
            f"made, {cells['60']['new_pod_jobs']:.0f} taken by the job they were made for"
        )
        lines.append(
            f"{'':<9}÷ τ=15 s (shape) at 60/120/300/900 s, fresh: ours "
            + "/".join(f"{cells[c]['held'] / cells['15']['held']:.2f}" for c in cols[1:])
            + " | paper "
            + "/".join(f"{paper[c][0] / paper['15'][0]:.2f}" for c in cols[1:])
        )
        c60 = cells["60"]
        lines.append(
            f"{'':<9}held at 60 s {c60['held']:.2f} = pods starting {c60['starting']:.2f} + jobs running "
            f"{c60['busy']:.2f} + idle or owner-held {c60['held'] - c60['starting'] - c60['busy'] - c60['tail']:.2f}"
            f" + after the last job {c60['tail']:.2f}"
        )
    bursty = table["patterns"]["bursty"]["cells"]
    lines.append("bursty, floor × idle cap at 60 s keep-alive: held (Δp50, p90; what an idle cap can retain)")
    lines.append(
        f"  {'bare 60 s':<28} {bursty['60']['held']:.2f} ({bursty['60']['dp50']:+.2f} s, p90 "
        f"{bursty['60']['p90']:.2f} s; never-used idle pods {bursty['60'].get('unused_idle', 0.0):.2f}; "
        f"no pod at all {bursty['60'].get('empty', 0.0):.1%} of the span, when a floor of 1 would add one)"
    )
    for k, v in bursty.items():
        if k.startswith("floor"):
            lines.append(
                f"  {k:<28} {v['held']:.2f} ({v['dp50']:+.2f} s, p90 {v['p90']:.2f} s; "
                f"never-used idle pods {v.get('unused_idle', 0.0):.2f} on average)"
            )
    lines.append(
        "  paper: floor 1, idle cap 2, 60 s 0.52x (measured, local); floor 4, idle cap 2: p90 3.39 s at 0.78x"
    )
    return "\n".join(lines)


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench frontier", description=__doc__)
    parser.add_argument("--seeds", type=int, default=3, help="seeds per cell (the paper: median of 3)")
    parser.add_argument("--horizon", type=float, default=FRONTIER_HORIZON_S, help="arrival window (s)")
    parser.add_argument("--rate", type=float, default=FRONTIER_RATE, help="agent sessions per second (mean)")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    args = parser.parse_args(argv)
    started = time.monotonic()
    table = frontier_table(
        range(1, args.seeds + 1), rate=args.rate, horizon_s=args.horizon, workers=args.workers
    )
    rows = frontier_rows(table)
    save_json("frontier-sim", table)
    if not args.no_plot:
        frontier_plot(table, RESULTS / "frontier-sim.png")
    if not json_out:
        print(side_by_side(table))
        print()
    held = sum(1 for r in rows if r.met)
    return report(
        "frontier",
        rows,
        json_out=json_out,
        extra={
            "table": table,
            "held": f"{held} of {len(rows)}",
            "wall_s": round(time.monotonic() - started, 1),
        },
    )
