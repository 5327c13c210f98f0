"""B10: late binding vs per-environment pools in the simulator (`firepool bench late-binding --sim`), beside Fig. 5.

RL rollout batches (8 rollouts of 1.5–4 s) arrive steadily; each batch's environment is drawn from E = 1…64
Zipf(s = 1)-popular environments. Three layouts run the same arrivals on Firepool's own control plane with the
CPU venue (22 s pod start), a 64-pod budget and a 900 s keep-alive (App. C.5): one shared base-image pool that
binds each job's environment at start (late binding), a pool per environment that may each grow to the budget,
and a pool per environment with the budget split. Held capacity is pod-seconds ÷ an always-on pool sized to
peak concurrency; the hit rate is the share of jobs served by a warm, recycled or standby pod.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from bench.common import RESULTS, Row, report
from bench.simplots import late_binding_plot, save_json
from broker.sim import tables


def side_by_side(table: dict[str, Any]) -> str:
    s = table["series"]
    lines = ["E     held ÷ always-on (shared / per-env / split)   hit rate (shared / per-env / split)   p90 s (shared / per-env / split)"]
    for i, e in enumerate(s["shared"]["E"]):
        held = " / ".join(f"{s[m]['held'][i]:.2f}" for m in ("shared", "per-env", "split"))
        hit = " / ".join(f"{s[m]['hit'][i]:.2f}" for m in ("shared", "per-env", "split"))
        p90 = " / ".join(f"{s[m]['p90'][i]:.1f}" for m in ("shared", "per-env", "split"))
        lines.append(f"{e:<5.0f} {held:<47} {hit:<37} {p90}")
    p = table["paper"]
    lines.append(f"paper (Fig. 5, E = 64): held {p['shared_held_64']} (shared) vs {p['per_env_held_64']} (per-env); "
                 f"per-env hit {p['per_env_hit_1']} -> {p['per_env_hit_64']}; budget split p90 ~{p['split_p90_64']:.0f} s")
    return "\n".join(lines)


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench late-binding --sim", description=__doc__)
    parser.add_argument("--seeds", type=int, default=3, help="paired seeds per E (the paper: 10)")
    parser.add_argument("--batches", type=int, default=tables.LB_BATCHES, help="rollout batches per run")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    args = parser.parse_args(argv)
    started = time.monotonic()
    table = tables.late_binding_table(range(1, args.seeds + 1), batches=args.batches, workers=args.workers)
    rows = [Row(**r) for r in tables.late_binding_rows(table)]
    save_json("late-binding-sim", table)
    if not args.no_plot:
        late_binding_plot(table, RESULTS / "late-binding-sim.png")
    if not json_out:
        print(side_by_side(table))
        print()
    return report("late-binding-sim", rows, json_out=json_out,
                  extra={"table": table, "wall_s": round(time.monotonic() - started, 1)})
