import math
from fractions import Fraction

import numpy as np
import pytest

from metricbus.stream_jobs._stats import (
    DECLINING,
    EMA,
    IMPROVING,
    STABLE,
    Convergence,
    Welford,
    Window,
    trend_class,
)

SERIES = {
    "normal": np.random.default_rng(0).normal(3.0, 2.0, 5000),
    "large offset, tiny spread": 1e9 + np.random.default_rng(1).normal(0, 1e-3, 5000),
    "tiny variance": 0.5 + np.random.default_rng(2).normal(0, 1e-9, 5000),
    "constant": np.full(1000, 0.25),
}


@pytest.mark.parametrize("name", SERIES)
def test_welford_matches_numpy(name):
    xs = SERIES[name]
    w = Welford()
    for x in xs:
        w.add(float(x))
    assert w.count == len(xs)
    assert w.mean == pytest.approx(np.mean(xs), rel=1e-12)
    assert w.variance == pytest.approx(np.var(xs), rel=1e-6, abs=1e-24)
    assert w.sample_variance == pytest.approx(np.var(xs, ddof=1), rel=1e-6, abs=1e-24)
    assert (w.min, w.max) == (xs.min(), xs.max())


@pytest.mark.parametrize("name", SERIES)
def test_chan_merge_of_parts_equals_the_whole(name):
    xs = SERIES[name]
    parts = np.array_split(xs, 7)
    total = Welford()
    for part in parts:
        w = Welford()
        w.extend(part)
        total.merge(w)
    assert total.count == len(xs)
    assert total.mean == pytest.approx(np.mean(xs), rel=1e-12)
    assert total.variance == pytest.approx(np.var(xs), rel=1e-6, abs=1e-24)


def test_nonfinite_values_are_counted_not_averaged():
    w, win = Welford(), Window(5)
    for x in [1.0, math.nan, 3.0, math.inf, -math.inf]:
        w.add(x)
        win.add(x)
    assert (w.count, w.nonfinite, w.mean) == (2, 3, 2.0)
    assert (len(win), win.nonfinite, win.mean()) == (2, 3, 2.0)
    w.extend([math.nan, 5.0])
    assert (w.count, w.nonfinite) == (3, 4)


@pytest.mark.parametrize("name", SERIES)
def test_window_matches_numpy_on_the_last_n(name):
    xs = SERIES[name]
    win = Window(10)
    for x in xs:
        win.add(float(x))
    last = xs[-10:]
    assert win.mean() == pytest.approx(np.mean(last), rel=1e-12)
    assert win.std() == pytest.approx(np.std(last), rel=1e-6, abs=1e-15)
    assert win.median() == pytest.approx(np.median(last))
    assert win.quantile(0.99) == pytest.approx(np.quantile(last, 0.99))
    assert win.slope() == pytest.approx(exact_slope(last), rel=1e-9, abs=1e-15)


def test_window_quantiles_equal_numpys_to_the_bit_and_survive_values_past_floats_range():
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 25))
        xs = rng.normal(0, 10.0 ** rng.integers(-5, 12), n) + rng.choice([0.0, 1e9])
        win = Window(n)
        win.extend(xs.tolist())
        for q in (0.0, 0.01, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0, float(rng.random())):
            assert win.quantile(q) == float(np.quantile(xs, q)), (xs, q)  # == : numpy's arithmetic
    win = Window(10)
    win.extend([-1e308, 1e308])
    assert win.median() == 0.0  # numpy: -inf (b - a overflows)
    win.extend([1.0])
    assert math.isfinite(win.quantile(0.99)) and win.quantile(0.99) == pytest.approx(0.98e308)


def exact_slope(ys):
    # Exact rational least squares: np.polyfit itself loses digits on a 1e9 offset.
    y = [Fraction(float(v)) for v in ys]
    x = list(range(len(y)))
    mx, my = Fraction(sum(x), len(x)), sum(y) / len(y)
    return float(sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x))


def test_ema_matches_tensorboards_debiased_smoothing():
    xs = [1.0, 2.0, 3.0, 10.0, math.nan, 4.0]
    weight = 0.6
    ema = EMA(weight)
    got = [ema.add(x) for x in xs]
    last, n, want = 0.0, 0, []
    for x in xs:  # TensorBoard's scalar card smoothing
        if math.isfinite(x):
            last = last * weight + (1 - weight) * x
            n += 1
        want.append(last / (1 - weight**n))
    assert got == pytest.approx(want)
    assert got[0] == 1.0  # debiased: no pull toward zero


def test_trend_direction_depends_on_the_metric():
    assert trend_class(-0.5, 1.0, higher_is_better=False) == IMPROVING  # loss falling
    assert trend_class(-0.5, 1.0, higher_is_better=True) == DECLINING  # reward falling
    assert trend_class(0.5, 1.0, higher_is_better=True) == IMPROVING
    assert trend_class(1e-5, 1.0, higher_is_better=True) == STABLE
    assert trend_class(math.nan, 1.0, higher_is_better=True) == STABLE


def test_convergence_needs_patience_windows_of_calm():
    conv, win = Convergence(patience=3), Window(10)
    results = []
    for x in list(np.linspace(0, 10, 30)) + [10.0] * 40:
        win.add(float(x))
        results.append(conv.update(win))
    assert not any(results[:32])  # rising, then the window still holds the ramp
    assert results[-1]
    first = results.index(True)
    assert 30 + 9 <= first <= 30 + 12  # the window turns calm once it holds only the plateau, then 3 in a row


@pytest.mark.parametrize("name", ["normal", "tiny variance", "constant"])
def test_rolling_moments_match_the_exact_window(name):
    from metricbus.stream_jobs._stats import RollingMoments

    xs = SERIES[name][:500]
    fast, exact = RollingMoments(20), Window(20)
    for x in xs:
        fast.add(float(x))
        exact.add(float(x))
        assert fast.mean() == pytest.approx(exact.mean(), rel=1e-12)
        assert fast.std() == pytest.approx(exact.std(), rel=1e-6, abs=1e-12)


def test_values_past_floats_range_give_inf_or_nan_never_an_exception_and_the_window_recovers():
    """A finite 1e200 squares past float's range: ``** 2`` raised OverflowError and math.fsum
    raised on two values of 1e308 (the report and backtest stopped; the worker dead-lettered
    the record), and the rolling sums went inf - inf = NaN for good once it left the window."""
    import warnings

    from metricbus.stream_jobs._stats import RollingMoments, fsum

    window = Window(4)
    for x in (1.0, 1e200, -1e200, 3.0):
        window.add(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning either
        assert fsum([1e308, 1e308]) == math.inf and math.isnan(fsum([math.inf, -math.inf]))
        assert fsum([0.1] * 10) == 1.0  # still exact where it can be
        assert math.isinf(window.std()) and window.slope() < 0
        rolling = RollingMoments(4)
        for x in (1.0, 1e200, 2.0, 3.0, 4.0):
            rolling.add(x)
        assert not math.isfinite(rolling.std())
        for x in (5.0, 6.0, 7.0, 8.0):  # 1e200 has left the window
            rolling.add(x)
        exact = Window(4)
        for x in (5.0, 6.0, 7.0, 8.0):
            exact.add(x)
        assert rolling.std() == pytest.approx(exact.std(), rel=1e-9)
        assert rolling.scores([1e300, -1e300], 1).shape == (2,)
