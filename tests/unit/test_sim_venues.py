"""Venue models: the paper's constants and the cold-start sampler fitted to them (Table 1, App. C.4)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from broker.backends.startdelay import StartModel, from_template
from broker.sim.stats import percentile
from broker.sim.venues import cpu, h200, load_local, save_local, venue


def _draws(model: StartModel, n: int = 20_000, starting: int = 1) -> list[float]:
    rng = random.Random(11)
    return [model.sample(rng, starting) for _ in range(n)]


def test_h200_cold_start_draws_match_table_1_median_and_p90() -> None:
    draws = _draws(h200.cold_start)
    assert percentile(draws, 50) == pytest.approx(22.1, rel=0.02)
    assert percentile(draws, 90) == pytest.approx(34.7, rel=0.03)


def test_eight_pods_at_once_start_as_slowly_as_table_1_reports() -> None:
    assert h200.cold_start.crowding(1) == 1.0
    assert h200.cold_start.crowding(8) == pytest.approx(47.5 / 19.8)
    assert h200.cold_start.crowding(20) == h200.cold_start.crowding(8)  # not extrapolated past the observation
    assert 1.0 < h200.cold_start.crowding(4) < h200.cold_start.crowding(8)
    alone, crowded = _draws(h200.cold_start), _draws(h200.cold_start, starting=8)
    assert percentile(crowded, 50) / percentile(alone, 50) == pytest.approx(47.5 / 19.8, rel=0.01)


def test_warm_start_phases_of_app_c4() -> None:
    assert (h200.accept_s, h200.dispatch_s, h200.handoff_s, h200.first_instruction_s) == (0.04, 0.01, 0.39, 0.12)
    assert h200.warm_start_s() == pytest.approx(0.56)
    assert h200.cap == 2 and h200.standbys_per_active == 3
    assert cpu.cold_start.median_s == 22.0 and cpu.standbys_per_active == 0 and cpu.cap == 16


def test_a_scaled_venue_draws_a_tenth_of_the_cold_start() -> None:
    small = h200.scaled(0.1)
    assert percentile(_draws(small.cold_start), 50) == pytest.approx(2.21, rel=0.02)
    assert small.handoff_s == pytest.approx(0.039)
    assert h200.cold_start.median_s == 22.1  # the paper's venue is a value, unchanged


def test_the_sampler_is_driven_only_by_its_seeded_rng() -> None:
    a = [h200.sample_cold_start(random.Random(5)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    assert h200.sample_cold_start(random.Random(5)) != h200.sample_cold_start(random.Random(6))


def test_a_fixed_delay_model_always_draws_its_median() -> None:
    fixed = StartModel(median_s=3.0, p90_s=3.0)
    assert set(_draws(fixed, n=10)) == {3.0}
    assert StartModel(0.0, 0.0).sample(random.Random(1)) == 0.0


def test_bad_start_models_are_refused() -> None:
    with pytest.raises(ValueError):
        StartModel(median_s=5.0, p90_s=4.0)
    with pytest.raises(ValueError):
        StartModel(median_s=5.0, p90_s=6.0, crowd_factor=0.5)


def test_pool_template_round_trips_the_model_and_rejects_unknown_fields() -> None:
    model = h200.cold_start.scaled(0.1)
    assert from_template({}) is None
    assert from_template({"venue_delay": model.template(seed=3)}) == (model, 3)
    with pytest.raises(ValueError, match="unknown"):
        from_template({"venue_delay": {"median_s": 1.0, "mean_s": 2.0}})
    with pytest.raises(ValueError):
        from_template({"venue_delay": {"p90_s": 1.0}})
    with pytest.raises(ValueError):
        from_template({"venue_delay": {"median_s": 1.0, "seed": "x"}})


def test_local_venue_round_trips_through_the_calibration_file(tmp_path: Path) -> None:
    path = tmp_path / "venue-local.json"
    measured = h200.scaled(0.01)
    save_local(measured, path)
    assert load_local(path) == measured
    assert venue("local", path) == measured
    assert load_local(path).scaled(10).cold_start.scale == pytest.approx(0.1)


def test_a_bad_calibration_file_is_refused_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "venue-local.json"
    with pytest.raises(ValueError, match="no calibration file"):
        load_local(path)
    raw = h200.to_json()
    raw["colour"] = "red"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="colour"):
        load_local(path)
    with pytest.raises(ValueError):
        venue("local")
    with pytest.raises(ValueError):
        venue("tpu")


def test_backend_venue_delays_draw_a_seeded_sequence_per_pool() -> None:
    from broker.backends.startdelay import VenueDelays

    template = {"venue_delay": h200.cold_start.scaled(0.1).template(seed=4)}
    a, b = VenueDelays(), VenueDelays()
    first = [a.draw("gpu", template, starting=1) for _ in range(5)]
    assert first == [b.draw("gpu", template, starting=1) for _ in range(5)]  # same seed, same starts
    assert len(set(first)) == 5 and all(0.5 < d < 10.0 for d in first)
    assert VenueDelays().draw("other", template, 1) != first[0]  # each pool its own sequence
    assert VenueDelays().draw("gpu", {}, 1) == 0.0
    crowded = VenueDelays().draw("gpu", template, starting=8)
    assert crowded == pytest.approx(first[0] * 47.5 / 19.8, rel=1e-4)  # the same draw, 8 pods starting at once
    with pytest.raises(ValueError):
        VenueDelays().draw("gpu", {"venue_delay": {"median_s": "soon"}}, 1)
