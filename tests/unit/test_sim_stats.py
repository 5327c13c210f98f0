"""The statistics module against hand-computed cases (App. B.4)."""

from __future__ import annotations

import itertools

import pytest

from broker.sim.stats import (
    crossover_order,
    paired_difference,
    percentile,
    pooled_percentile,
    speedup,
    williams_orders,
)


def test_percentile_interpolates_linearly_between_order_statistics() -> None:
    assert percentile([4, 1, 3, 2], 90) == pytest.approx(3.7)  # k = 3 * 0.9 = 2.7: 3 + 0.7 * (4 - 3)
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile([1, 2, 3, 4], 0) == 1
    assert percentile([1, 2, 3, 4], 100) == 4
    assert percentile([7.0], 90) == 7.0


def test_percentile_of_nothing_or_out_of_range_is_an_error() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_pooled_percentile_pools_all_jobs_of_all_repeats() -> None:
    # per-repeat medians would be 1.5 and 3.5; pooling all four jobs gives 2.5
    assert pooled_percentile([[1, 2], [3, 4]], 50) == pytest.approx(2.5)
    assert pooled_percentile([[10], [0, 0, 0]], 90) == pytest.approx(7.0)  # [0,0,0,10]: k=2.7 -> 0 + 0.7*10


def test_paired_difference_two_repeats_ci_spans_the_resampled_medians() -> None:
    # differences 1 and 3: resamples (1,1)->1, (1,3)/(3,1)->2, (3,3)->3, each ~25/50/25%: CI [1, 3]
    effect = paired_difference([0.0, 0.0], [1.0, 3.0])
    assert effect.estimate == 2.0
    assert (effect.lo, effect.hi) == (1.0, 3.0)


def test_constant_paired_differences_give_a_zero_width_ci() -> None:
    effect = paired_difference([1.0, 2.0, 5.0], [3.0, 4.0, 7.0])
    assert (effect.estimate, effect.lo, effect.hi) == (2.0, 2.0, 2.0)


def test_speedup_is_a_ratio_of_medians_or_of_means() -> None:
    assert speedup([1.0, 2.0, 3.0], [10.0, 20.0, 30.0]).estimate == pytest.approx(10.0)
    assert speedup([1.0, 2.0, 3.0], [10.0, 20.0, 30.0]).lo == pytest.approx(10.0)
    assert speedup([1.0, 2.0, 6.0], [6.0, 6.0, 6.0]).estimate == pytest.approx(3.0)  # 6 / median 2
    assert speedup([1.0, 2.0, 6.0], [6.0, 6.0, 6.0], center="mean").estimate == pytest.approx(2.0)  # 6 / mean 3


def test_bootstrap_is_reproducible_with_its_fixed_seed_and_changes_with_another() -> None:
    on, off = [1.0, 1.4, 0.9, 1.2, 2.0, 1.1], [9.0, 14.0, 8.0, 13.0, 11.0, 10.5]
    assert speedup(on, off) == speedup(on, off)
    assert speedup(on, off, center="mean", seed=1) != speedup(on, off, center="mean")  # the seed drives the CI
    effect = speedup(on, off)
    assert effect.lo <= effect.estimate <= effect.hi


def test_paired_samples_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError):
        paired_difference([1.0], [1.0, 2.0])


def _adjacent_pairs(rows: list[list[int]]) -> dict[tuple[int, int], int]:
    counts: dict[tuple[int, int], int] = {}
    for row in rows:
        for a, b in itertools.pairwise(row):
            counts[(a, b)] = counts.get((a, b), 0) + 1
    return counts


def test_williams_design_for_four_arms_is_the_textbook_square() -> None:
    rows = williams_orders(4)
    assert rows == [[0, 1, 3, 2], [1, 2, 0, 3], [2, 3, 1, 0], [3, 0, 2, 1]]
    assert set(_adjacent_pairs(rows).values()) == {1}
    assert len(_adjacent_pairs(rows)) == 12  # every ordered pair of distinct arms once


def test_williams_design_for_three_arms_needs_six_sequences_balanced_for_carry_over() -> None:
    rows = williams_orders(3)
    assert len(rows) == 6
    pairs = _adjacent_pairs(rows)
    assert len(pairs) == 6 and set(pairs.values()) == {2}
    for position in range(3):
        assert sorted(r[position] for r in rows) == [0, 0, 1, 1, 2, 2]


def test_crossover_order_cycles_through_the_design() -> None:
    arms = ["on", "off", "fresh"]
    assert crossover_order(arms, 0) == ["on", "off", "fresh"]
    assert crossover_order(arms, 3) == ["fresh", "off", "on"]  # the reverse of the first row
    assert crossover_order(arms, 6) == crossover_order(arms, 0)
