"""Fig. 7: the loop speedup of Reuse On over Reuse Off against job body length and think time (CPU venue).

A plan's bodies are rescaled so their mean is L seconds (their spread kept), and every think pause (an
agent's pauses between calls and iterations; W-RL's pause before each iteration's rollouts) is set to T.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from broker.sim import scenarios
from broker.sim.venues import Venue, cpu
from broker.sim.workloads import Caller, Job, Plan, Stage, workload

LENGTHS_S = (1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
THINKS_S = (0.0, 30.0, 120.0, 600.0, 1800.0)
PAPER_FIG7 = {"w-rl": {"below_1_1_at_s": 196.0, "short": (4.1, 4.3), "measured_short": 4.5},
              "w-agent-4": {"below_1_1_at_s": 104.0, "short": (1.6, 2.0), "measured_short": 2.2}}


def reshaped(plan: Plan, body_s: float, think_s: float) -> Plan:
    """The plan with mean body `body_s` and every pause `think_s` (the first stage never waits)."""
    bodies = [j.body_s for c in plan.callers for s in c.stages for j in s.jobs]
    factor = body_s / statistics.fmean(bodies)
    callers = []
    for c in plan.callers:
        stages = []
        for i, s in enumerate(c.stages):
            rollout_start = plan.name.startswith("w-rl") and s.jobs[0].kind == "rollout"
            pause = think_s if i > 0 and (s.pause_s > 0 or rollout_start) else 0.0
            stages.append(Stage(pause, tuple(Job(j.kind, j.body_s * factor) for j in s.jobs)))
        callers.append(Caller(c.name, tuple(stages)))
    return Plan(f"{plan.name}-L{body_s:g}-T{think_s:g}", plan.seed, tuple(callers))


def sweep(name: str, *, venue: Venue = cpu, lengths: Sequence[float] = LENGTHS_S,
          thinks: Sequence[float] = THINKS_S, seeds: Sequence[int] = (1, 2, 3)) -> dict[str, Any]:
    """Makespan(Reuse Off) ÷ makespan(Reuse On) per (think, length): median and range over seeds."""
    out: dict[str, Any] = {"workload": name, "venue": venue.name, "lengths": list(lengths), "thinks": list(thinks),
                           "keep_alive_s": scenarios.KEEP_ALIVE_S, "series": {}, "paper": PAPER_FIG7.get(name)}
    for think in thinks:
        med, lo, hi = [], [], []
        for length in lengths:
            ratios = []
            for seed in seeds:
                plan = reshaped(workload(name, seed), length, think)
                on = scenarios.run_plan(plan, venue, "reuse-on", seed)
                off = scenarios.run_plan(plan, venue, "reuse-off", seed)
                ratios.append(off.makespan / on.makespan)
            med.append(statistics.median(ratios))
            lo.append(min(ratios))
            hi.append(max(ratios))
        out["series"][f"{think:g}"] = {"median": med, "lo": lo, "hi": hi}
    return out


def crossing(lengths: Sequence[float], speedups: Sequence[float], level: float = 1.1) -> float | None:
    """The body length where the speedup first falls below `level` (log-linear interpolation)."""
    import math

    for (l0, s0), (l1, s1) in zip(zip(lengths, speedups, strict=True), zip(lengths[1:], speedups[1:], strict=True),
                                  strict=False):
        if s0 >= level > s1:
            f = (s0 - level) / (s0 - s1)
            return math.exp(math.log(l0) + f * (math.log(l1) - math.log(l0)))
    return None
