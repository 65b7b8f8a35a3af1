"""How the generated tables write a share and a count per seed."""

from benchmarks.evidence.tables.cells import (
    share_interval,
    shown_counts,
    shown_seed_rates,
    shown_share,
)


def test_a_share_interval_stays_inside_zero_and_one():
    for seeds in ([1, 1, 1, 0.2, 1], [0, 0, 0, 0.8, 0], [0.99, 1.0]):
        mean, low, high = share_interval(tuple(seeds))
        assert 0 < low <= mean <= high < 1


def test_a_share_is_written_with_its_logit_scale_t_interval_and_n():
    assert shown_share([1, 1, 1, 0.2, 1]) == "0.84 [0.16, 0.99] [5]"
    assert shown_share([0.5]) == "0.50 [1]"
    assert shown_seed_rates([1, 0, 0, 0, 0], [5] * 5).endswith("; 1 of 5 seeds")


def test_a_count_is_written_with_its_range_over_seeds():
    assert shown_counts([0, 0, 1, 0, 0]) == "0.2 (0–1) [5]"
    assert shown_counts([]) == "–"
