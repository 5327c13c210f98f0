"""B7's rows from the arms' runs: speedups as ratios of median makespans, misses shown as misses."""

from __future__ import annotations

from typing import Any

import pytest

from bench.loops import rows_for


def _runs(name: str, makespans: dict[str, float], starts: dict[str, list[float]], repeats: int = 6) -> list[dict[str, Any]]:
    return [{"workload": name, "arm": arm, "repeat": r, "makespan": span * (1 + 0.01 * r), "starts": starts[arm],
             "jobs": len(starts[arm]), "failed": []}
            for r in range(repeats) for arm, span in makespans.items()]


STARTS = {"reuse-on": [0.01, 0.02, 0.03, 0.04, 0.05], "reuse-off": [0.05, 0.1, 0.2, 2.0, 3.0],
          "fresh-pod": [3.0, 3.5, 4.0, 4.5, 5.0]}


def test_agent4_speedup_inside_the_band_is_met_and_below_it_a_miss() -> None:
    rows = rows_for(_runs("w-agent-4", {"reuse-on": 10.0, "reuse-off": 20.0, "fresh-pod": 130.0}, STARTS), "w-agent-4", 0.1)
    fresh = next(r for r in rows if "vs fresh pod" in r.metric)
    assert fresh.ours == pytest.approx(13.0) and fresh.met is True
    rows = rows_for(_runs("w-agent-4", {"reuse-on": 10.0, "reuse-off": 20.0, "fresh-pod": 60.0}, STARTS), "w-agent-4", 0.1)
    fresh = next(r for r in rows if "vs fresh pod" in r.metric)
    assert fresh.ours == pytest.approx(6.0) and fresh.met is False  # below 13.0 x 0.76
    off = next(r for r in rows if "vs Reuse Off" in r.metric)
    assert off.met is None  # the paper's 4-agent vs Reuse Off figure is from CPU: printed, no target


def test_agent2_p90_ratio_pools_all_jobs_of_both_arms() -> None:
    rows = rows_for(_runs("w-agent-2", {"reuse-on": 10.0, "reuse-off": 40.0, "fresh-pod": 100.0}, STARTS), "w-agent-2", 0.1)
    ratio = next(r for r in rows if "p90 start, Reuse Off / Reuse On" in r.metric)
    # pooled over 6 repeats each value appears 6 times: p90 at k = 29 * 0.9 = 26.1 lies among the six 3.0s
    # (Off) and the six 0.05s (On): 60x; one repeat alone would give 2.6 / 0.046
    assert ratio.ours == pytest.approx(3.0 / 0.05)
    assert ratio.met is True
    off = next(r for r in rows if "vs Reuse Off" in r.metric)
    assert off.ours == pytest.approx(4.0) and off.met is True  # H200 2 agents: 3.6x, band from 2.74x
    fresh = next(r for r in rows if "vs fresh pod" in r.metric)
    assert fresh.met is None  # the paper ran the fresh-pod arm with 4 agents only
