"""The simulator's tables: rows in the benchmark format, bands and checks computed, not asserted."""

from __future__ import annotations

from broker.sim import sweeps, tables

KEYS = {"id", "metric", "ours", "unit", "paper", "target", "met"}


def test_the_paper_band_is_x0_76_to_1_31() -> None:
    assert tables.in_band(13.0 * 0.77, 13.0) and not tables.in_band(13.0 * 0.75, 13.0)
    assert tables.in_band(13.0 * 1.3, 13.0) and not tables.in_band(13.0 * 1.32, 13.0)


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
