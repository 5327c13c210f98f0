"""The simulator's tables: rows in the benchmark format, bands and checks computed, not asserted."""

from __future__ import annotations

from typing import Any

from broker.sim import sweeps, tables

KEYS = {"id", "metric", "ours", "unit", "paper", "target", "met"}


def _frontier(held: dict[str, float], fresh_dp50: float = 22.0) -> dict[str, Any]:
    cells = {k: {"held": v, "dp50": 0.1, "p50": 0.5, "p90": 2.0, "hit": 0.9, "pods": 3} for k, v in held.items()}
    cells["fresh"]["dp50"] = fresh_dp50
    for g in tables.GRID:
        cells[g.label] = {"held": 0.7, "dp50": 0.0, "p50": 0.5, "p90": 1.0, "hit": 0.9, "pods": 3}
    return {"patterns": {p: {"peak": 6, "ref_p50": 0.45, "ref_p90": 0.5, "cells": cells}
                         for p in ("steady", "bursty", "diurnal")}}


def test_the_paper_band_is_x0_76_to_1_31() -> None:
    assert tables.in_band(13.0 * 0.77, 13.0) and not tables.in_band(13.0 * 0.75, 13.0)
    assert tables.in_band(13.0 * 1.3, 13.0) and not tables.in_band(13.0 * 1.32, 13.0)


def test_frontier_rows_mark_a_broken_ordering_as_a_miss() -> None:
    good = _frontier({"15": 0.4, "60": 0.6, "120": 0.7, "300": 0.9, "900": 1.5, "fresh": 1.3})
    rows = tables.frontier_rows(good)
    assert all(set(r) == KEYS and r["id"] == "B9" for r in rows)
    rising = [r for r in rows if "grows with keep-alive" in r["metric"]]
    assert rising and all(r["met"] is True for r in rising)
    bad = _frontier({"15": 0.9, "60": 0.6, "120": 0.7, "300": 0.9, "900": 0.8, "fresh": 0.5}, fresh_dp50=1.0)
    rows = tables.frontier_rows(bad)
    assert any(r["met"] is False for r in rows if "grows with keep-alive" in r["metric"])
    assert all(r["met"] is False for r in rows if "holds more than the always-on" in r["metric"])
    assert all(r["met"] is False for r in rows if "pays a pod start" in r["metric"])


def test_late_binding_rows_check_the_order_at_the_largest_e() -> None:
    def series(held: float, hit: float, p90: float) -> dict[str, list[float]]:
        return {"E": [1.0, 64.0], "held": [1.0, held], "hit": [0.9, hit], "p90": [1.0, p90]}

    table = {"series": {"shared": series(1.05, 0.9, 1.0), "per-env": series(2.2, 0.7, 5.0),
                        "split": series(0.8, 0.8, 400.0)}}
    rows = tables.late_binding_rows(table)
    assert all(set(r) == KEYS and r["id"] == "B10" for r in rows)
    assert all(r["met"] is True for r in rows)
    table["series"]["shared"] = series(3.0, 0.5, 1.0)
    assert any(r["met"] is False for r in tables.late_binding_rows(table))


def test_the_speedup_crossing_is_interpolated_on_a_log_scale() -> None:
    assert abs((sweeps.crossing([1.0, 100.0], [1.2, 1.0]) or 0.0) - 10.0) < 1e-9
    assert sweeps.crossing([1.0, 10.0], [2.0, 1.5]) is None


def test_a_reshaped_plan_has_the_asked_mean_body_and_think() -> None:
    from broker.sim.workloads import workload

    plan = sweeps.reshaped(workload("w-agent-2", 1), 100.0, 30.0)
    bodies = [j.body_s for c in plan.callers for s in c.stages for j in s.jobs]
    assert abs(sum(bodies) / len(bodies) - 100.0) < 1e-6
    pauses = {s.pause_s for c in plan.callers for s in c.stages[1:]}
    assert pauses == {30.0}
