"""metricbus compare: config differences and Welch's t-test on the final windows."""

import math

import numpy as np
import pytest
from scipy import stats

from metricbus._compare import compare_metric, config_diff, final_window


def test_only_differing_config_keys_are_shown_nested_keys_flattened():
    diff = config_diff(
        {
            "a": {"lr": 0.1, "seed": 1, "model": {"layers": 2, "width": 8}},
            "b": {"lr": 0.2, "seed": 1, "model": {"layers": 2, "width": 16}, "extra": True},
        }
    )
    assert diff == {
        "extra": {"a": None, "b": True},
        "lr": {"a": 0.1, "b": 0.2},
        "model/width": {"a": 8, "b": 16},
    }


def test_the_final_window_is_the_last_tenth_of_finite_values():
    values = [float(i) for i in range(100)] + [math.nan]
    assert final_window(values) == [float(i) for i in range(90, 100)]
    assert final_window(values[:20]) == [float(i) for i in range(15, 20)]  # at least 5
    assert final_window(values, window=3) == [97.0, 98.0, 99.0]


def test_a_worse_loss_is_a_regression_with_scipys_p_value_and_hedges_g():
    rng = np.random.default_rng(0)
    base = list(1.0 + 0.05 * rng.standard_normal(200))
    worse = list(1.2 + 0.05 * rng.standard_normal(200))
    got = compare_metric("Train/Loss", ("a", base), ("b", worse))
    want = stats.ttest_ind(worse[-20:], base[-20:], equal_var=False)
    assert got.p_value == pytest.approx(want.pvalue) and got.verdict == "worse"
    a, b = np.array(base[-20:]), np.array(worse[-20:])
    pooled = math.sqrt((19 * a.var(ddof=1) + 19 * b.var(ddof=1)) / 38)
    assert got.effect_size == pytest.approx((b.mean() - a.mean()) / pooled * (1 - 3 / (4 * 40 - 9)))
    better = compare_metric("Train/AvgReward", ("a", base), ("b", worse))
    assert better.verdict == "better"  # the same rise is good news for a reward
    same = compare_metric("Train/Loss", ("a", base), ("c", list(1.0 + 0.05 * rng.standard_normal(200))))
    assert same.verdict == "no significant change" and same.p_value > 0.05
    assert compare_metric("x", ("a", [1.0]), ("b", [2.0])) is None
