"""Groups of runs: curves as mean and band on a common grid, IQMs with bootstrap intervals."""

import math

import numpy as np
import pytest
from scipy import stats

from metricbus.diagnostics._groups import aligned, band_of, curve, iqm, iqm_interval

from .test_compare import archived


def test_the_iqm_is_the_mean_of_the_middle_half_and_its_interval_is_scipys_bootstrap():
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 100.0]
    assert iqm(values) == pytest.approx(np.mean([3.0, 4.0, 5.0, 6.0]))  # the outlying seed trimmed
    assert iqm([1.0, 2.0, 9.0]) == pytest.approx(4.0)  # three runs: nothing trimmed
    want = stats.bootstrap(
        (np.array(values),),
        lambda x, axis: stats.trim_mean(x, 0.25, axis=axis),
        n_resamples=2000,
        method="percentile",
        rng=np.random.default_rng(0),
    ).confidence_interval
    assert iqm_interval(values) == pytest.approx((want.low, want.high))
    assert iqm_interval(values) == iqm_interval(values)  # seeded: the same answer each time
    assert all(math.isnan(v) for v in iqm_interval([1.0]))  # one run: no interval
    assert iqm_interval([2.0, 2.0, 2.0]) == (2.0, 2.0)


def test_runs_at_other_steps_are_interpolated_onto_the_steps_all_of_them_cover():
    a = curve([0, 10, 20, 30], [0.0, 1.0, 2.0, 3.0])
    b = curve([5, 15, 25], [10.0, 20.0, 30.0])
    grid, matrix = aligned([a, b])
    assert grid.tolist() == [5.0, 10.0, 15.0, 20.0, 25.0]  # b's range; nothing extrapolated
    assert matrix[0].tolist() == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.5])
    assert matrix[1].tolist() == pytest.approx([10.0, 15.0, 20.0, 25.0, 30.0])
    same, rows = aligned([a, curve([0, 10, 20, 30], [1.0, 1.0, 1.0, 1.0])])
    assert same.tolist() == [0.0, 10.0, 20.0, 30.0] and rows.shape == (2, 4)  # shared steps kept
    wide, _ = aligned([curve(range(10_000), np.ones(10_000)), curve(range(0, 10_000, 3), np.ones(3334))])
    assert len(wide) == 400 and wide[0] == 0 and wide[-1] == 9999  # thinned evenly, ends kept
    shared, rows = aligned([curve(range(10_000), np.arange(10_000.0))] * 2)
    assert len(shared) == 400 and shared[-1] == 9999 and rows[0].tolist() == shared.tolist()


def test_a_curve_keeps_the_last_value_at_a_step_and_drops_non_finite_values():
    steps, values = curve([0, 1, 1, 2, 3], [1.0, 2.0, 3.0, math.nan, 4.0])
    assert steps.tolist() == [0.0, 1.0, 3.0] and values.tolist() == [1.0, 3.0, 4.0]


def test_a_groups_band_is_mean_and_sample_std_or_min_and_max():
    curves = [curve([0, 1], [1.0, 2.0]), curve([0, 1], [3.0, 6.0]), curve([0, 1], [2.0, 4.0])]
    std = band_of("g", ["a", "b", "c"], curves)
    assert std.mean == pytest.approx([2.0, 4.0])
    assert std.upper == pytest.approx([3.0, 6.0]) and std.lower == pytest.approx([1.0, 2.0])  # ± 1 std
    minmax = band_of("g", ["a", "b", "c"], curves, "minmax")
    assert minmax.lower == [1.0, 2.0] and minmax.upper == [3.0, 6.0]
    alone = band_of("g", ["a"], curves[:1])
    assert alone.lower == alone.mean == alone.upper == [1.0, 2.0]


def test_grouping_by_a_named_key_gives_each_group_its_iqm_and_names_the_best():
    from metricbus.diagnostics._compare import compare_runs

    rng = np.random.default_rng(3)
    runs, finals = {}, {}
    for lr, batch, level in ((0.001, 32, 1.0), (0.001, 64, 1.02), (0.01, 32, 0.4), (0.01, 64, 0.42)):
        for seed in range(2):
            name = f"lr{lr}-b{batch}-s{seed}"
            values = list(level + 0.02 * rng.standard_normal(50))
            runs[name] = archived(name, {"lr": lr, "batch": batch, "seed": seed}, values)
            finals[name] = float(np.mean(values[-5:]))
    result = compare_runs(runs, metrics=["Train/AvgReward"], group_by=["lr"])
    assert list(result.groups) == ["lr=0.001", "lr=0.01"]  # batch is not a group key
    assert result.baseline_group == "lr=0.001"
    scores = {s.group: s for s in result.group_scores}
    for group, members in result.groups.items():
        mine = [finals[r] for r in members]
        assert scores[group].iqm == pytest.approx(stats.trim_mean(mine, 0.25))
        assert scores[group].std == pytest.approx(np.std(mine, ddof=1))
    assert scores["lr=0.001"].best and not scores["lr=0.01"].best
    (worse,) = result.group_metrics
    assert worse.verdict == "worse" and worse.interval[1] < 0
    by_default = compare_runs(runs, metrics=["Train/AvgReward"])
    assert len(by_default.groups) == 4  # every key that differs but seeds: lr and batch
    other_base = compare_runs(runs, metrics=["Train/AvgReward"], group_by=["lr"], baseline_group="lr=0.01")
    assert other_base.group_metrics[0].verdict == "better"
    with pytest.raises(KeyError):
        compare_runs(runs, group_by=["lr"], baseline_group="lr=5")
