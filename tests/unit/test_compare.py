"""metricbus compare: config differences and Welch's t-test on the final windows."""

import math

import numpy as np
import pytest
from scipy import stats

from metricbus.diagnostics._compare import compare_metric, config_diff, final_window


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
    assert same.verdict == "cannot tell" and same.p_value > 0.05 and same.interval[0] < 0 < same.interval[1]
    assert compare_metric("x", ("a", [1.0]), ("b", [2.0])) is None


def archived(run, config, values, env_steps_per_step=1, labels=None):
    """A run's logged events: its config, then one Metrics event per value."""
    from metricbus.schemas import METRICS, RUN_STARTED, Event, run_started

    out = [Event(run, "p", 0, 0, RUN_STARTED, run_started("proj", run, config), b"")]
    for i, v in enumerate(values):
        body = {"step": i, "epoch": None, "rank": 0, "samples": {}, "labels": labels(i) if labels else {}}
        body["scalars"] = {"Train/AvgReward": v, "env_steps": float(i * env_steps_per_step)}
        out.append(Event(run, "p", i + 1, 1000 * i, METRICS, body, b""))
    return out


def test_seeds_of_one_config_are_a_group_and_groups_are_compared_on_per_run_means():
    from metricbus.diagnostics._compare import compare_runs, group_runs

    rng = np.random.default_rng(1)
    runs, finals = {}, {}
    for lr, level in ((0.001, 1.0), (0.0003, 0.7)):
        for seed in range(3):
            name = f"lr{lr}-s{seed}"
            values = list(level + 0.05 * rng.standard_normal(100))
            runs[name] = archived(name, {"lr": lr, "seed": seed, "env": {"seed": seed}}, values)
            finals[name] = float(np.mean(values[-10:]))
    groups = group_runs({r: {"lr": float(r[2:].split("-")[0]), "seed": r[-1]} for r in runs})
    assert groups == {"lr=0.001": list(runs)[:3], "lr=0.0003": list(runs)[3:]}
    result = compare_runs(runs, metrics=["Train/AvgReward"])
    assert result.groups == {"lr=0.001": list(runs)[:3], "lr=0.0003": list(runs)[3:]}
    (grouped,) = result.group_metrics
    base = [finals[r] for r in list(runs)[:3]]
    other = [finals[r] for r in list(runs)[3:]]
    want = stats.ttest_ind(other, base, equal_var=False)
    assert grouped.p_value == pytest.approx(want.pvalue) and grouped.means == pytest.approx(other)
    assert grouped.verdict == "worse" and result.regressions() == [grouped]
    assert len(result.metrics) == 5  # the per-run comparisons are still there, not deciding


def test_runs_line_up_on_a_logged_axis_and_are_cut_at_the_shared_budget():
    from metricbus.diagnostics._compare import compare_runs

    # a logs 1 env step per step for 100 steps; b 4 per step for 100 steps (400 env steps).
    # On the env_steps axis b is cut at 99 env steps: its first 25 values, all 0.0.
    a = archived("a", {"lr": 1}, [0.0] * 100)
    b = archived("b", {"lr": 2}, [0.0] * 25 + [1.0] * 75, env_steps_per_step=4)
    on_steps = compare_runs({"a": a, "b": b}, metrics=["Train/AvgReward"], window=5)
    assert on_steps.metrics[0].mean == 1.0 and on_steps.budget is None
    on_budget = compare_runs({"a": a, "b": b}, metrics=["Train/AvgReward"], window=5, axis="env_steps")
    assert on_budget.budget == 99.0 and on_budget.metrics[0].mean == 0.0
    with pytest.raises(KeyError):
        compare_runs({"a": a, "b": b}, axis="tokens")


def test_labelled_series_are_compared_per_label():
    from metricbus.diagnostics._compare import compare_runs

    def tasks(i):
        return {"task": "hard" if i % 2 else "easy"}

    a = archived("a", {}, [float(i % 2 == 0) for i in range(200)], labels=tasks)
    b = archived("b", {}, [0.5 * (i % 2) + float(i % 2 == 0) for i in range(200)], labels=tasks)
    result = compare_runs({"a": a, "b": b})
    by = {m.metric: m for m in result.metrics}
    assert (
        by["Train/AvgReward [task=hard]"].mean == 0.5 and by["Train/AvgReward [task=hard]"].baseline_mean == 0
    )
    assert by["Train/AvgReward [task=easy]"].mean == 1.0


def test_two_sb3_runs_are_compared_on_their_rewards_logged_as_episode_returns():
    """SB3's adapter logs each rollout's episode returns as samples beside rollout/ep_rew_mean."""
    from metricbus.diagnostics._compare import compare_runs

    runs = {}
    for name, level in (("a", 200.0), ("b", 120.0)):
        events = archived(name, {"lr": 3e-4 if name == "a" else 1e-1}, [0.0] * 60)
        for e in events[1:]:
            i = e.body["step"]
            e.body["scalars"] = {"train/loss": 1.0}
            e.body["samples"] = {"rollout/episode_return": [level + (i % 5), level - (i % 3)]}
        runs[name] = events
    result = compare_runs(runs, baseline="a")
    (reward,) = [m for m in result.metrics if m.metric == "rollout/episode_return"]
    assert reward.verdict == "worse" and reward.mean < reward.baseline_mean  # higher is better


def test_welchs_p_equals_scipys_ttest_over_sizes_spreads_and_a_constant_side():
    from metricbus.diagnostics._compare import stdev, welch_p

    rng = np.random.default_rng(7)
    cases = [
        (rng.normal(0, sa, na), rng.normal(shift, sb, nb))
        for na, nb, sa, sb, shift in (
            (2, 2, 1.0, 1.0, 0.5),
            (3, 5, 0.1, 2.0, 1.0),
            (10_000, 9_000, 1.0, 1.5, 0.01),
            (5, 5, 1e-9, 1e9, 3.0),
        )
    ]
    cases.append((np.full(5, 2.0), rng.normal(2.5, 1.0, 7)))  # one side constant
    for a, b in cases:
        want = stats.ttest_ind(b, a, equal_var=False).pvalue
        assert welch_p(list(a), list(b), stdev(a), stdev(b)) == pytest.approx(want, rel=1e-9, abs=1e-300)


def test_the_iqm_equals_scipys_trimmed_mean_at_every_small_size():
    from metricbus.diagnostics._groups import iqm

    rng = np.random.default_rng(8)
    for n in range(1, 14):
        values = rng.normal(0, 1, n).tolist()
        assert iqm(values) == pytest.approx(stats.trim_mean(values, 0.25))


def test_a_verdict_agrees_with_the_interval_printed_beside_it_and_says_how_many_seeds_would_tell():
    """Three seeds a learning rate, one group 66x lower with a spread the other has not: the
    interval of the difference of means (Welch's) holds 0, so the verdict cannot be "no change"
    beside an interval that leaves it out, nor "better": it says how many runs would separate it."""
    from metricbus.diagnostics._compare import welch

    base = [0.62, 1.31, 0.08]  # a loss: lower is better
    lower = [0.0099, 0.0103, 0.0102]
    w = welch("Train/Loss", base, lower)
    got = stats.ttest_ind(lower, base, equal_var=False)
    assert w.p_value == pytest.approx(got.pvalue)
    ci = got.confidence_interval(0.95)
    assert w.interval == pytest.approx((ci.low, ci.high))
    assert w.interval[0] < 0 < w.interval[1] and w.verdict == "cannot tell"
    assert w.needed is not None and w.needed > 3
    assert (
        f"cannot tell at 95 %: 3 vs 3 values leave 0 in the interval [{ci.low:.4g}, {ci.high:.4g}]" in w.said
    )
    assert f"about {w.needed} values a side would separate" in w.said
    # with the runs that many, the same difference and spreads separate: the estimate is honest
    rng = np.random.default_rng(0)
    wins = 0
    for _ in range(400):
        a = rng.normal(np.mean(base), np.std(base, ddof=1), w.needed)
        b = rng.normal(np.mean(lower), np.std(lower, ddof=1), w.needed)
        wins += welch("Train/Loss", list(a), list(b)).verdict == "better"
    assert 0.7 < wins / 400 < 0.95  # about the 80 % power it was planned for
    # separated: the verdict and the interval agree, whichever way the metric goes
    sep = welch("Train/Loss", [1.0, 1.1, 0.9, 1.05], [0.2, 0.25, 0.22, 0.21])
    assert sep.verdict == "better" and sep.interval[1] < 0 and "leaves out 0" in sep.said
    assert welch("Train/AvgReward", [1.0, 1.1, 0.9, 1.05], [0.2, 0.25, 0.22, 0.21]).verdict == "worse"
