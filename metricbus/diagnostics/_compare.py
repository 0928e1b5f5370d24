"""Compare runs from the archive: config differences, final-window statistics, significance.

For each metric, each run's *final window* is its last ``window`` finite values (default: the
last tenth, at least 5). Against the baseline run (the first, or ``baseline=``), the verdict is
Welch's t-test on the two final windows (``scipy.stats.ttest_ind(equal_var=False)``: the runs'
variances differ as a rule, and the windows are short), with Hedges' g as the effect size.

One decision, one interval: every verdict comes with the 95 % confidence interval of the
difference of means that its test implies (Welch's, ``ttest_ind(...).confidence_interval()``),
so the verdict is "better" or "worse" exactly when that interval leaves out 0 (p < ``alpha``),
in the metric's direction (lower is better for names with loss, kl, time, memory, variance or
std, as the stream's trend direction; higher for everything else). When it does not, the
answer says how many runs a group would take to tell the difference seen apart (80 % power
at the observed effect size) instead of "no change": with three seeds and unequal variances a
real difference is often not yet separable.

Values within one window are consecutive points of one run, not independent samples: the test
says whether the two windows differ beyond their own noise, which is what "did this change move
the metric" asks of one seed each.

Across seeds: runs whose configs differ only in seed keys (``seed``, ``env_seed``, ...) form a
group, named by the config keys that do differ (``lr=0.001``); ``group_by`` names the keys
instead. Each run's final-window mean is one observation. Each group gets its interquartile
mean with a bootstrap interval (``_groups``: a description of the group, not a decision), and
the group with the best IQM by the metric's direction is named. When the baseline's group and
another hold two or more runs each, they are compared with Welch's t-test on those means
(seeds are independent runs, so here the test's assumption holds), and its interval of the
difference of means is printed beside the verdict; those verdicts decide the exit status.

Runs are aligned on an axis: the step, the wall time since each run's start, or a logged
metric such as env steps or tokens; every run is cut at the largest x that all of them reached
(the same budget), then its final window taken.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metricbus.diagnostics._groups import grouped, iqm, iqm_interval
from metricbus.diagnostics._series import Series, on_axis, scalars, split, up_to
from metricbus.schemas import Event, run_config
from metricbus.stream_jobs import StreamConfig

#: Config keys that name a seed: runs that differ only in these are one group.
SEED_KEY = re.compile(r"(^|[/_.])seed$", re.IGNORECASE)


@dataclasses.dataclass
class MetricComparison:
    """One metric of one run against the baseline."""

    metric: str
    run: str
    mean: float
    std: float
    n: int
    baseline_mean: float
    p_value: float
    effect_size: float  #: Hedges' g, (run - baseline) / pooled std, bias-corrected
    verdict: str  #: "better" | "worse" | "cannot tell"
    #: of mean - baseline mean, 95 %, Welch's: the verdict is "cannot tell" exactly when it holds 0
    interval: tuple[float, float] = (math.nan, math.nan)
    needed: int | None = None  #: values a side that would tell the difference seen apart (80 % power)
    said: str = ""  #: the verdict in words, with its interval


@dataclasses.dataclass(frozen=True)
class Welch:
    """Welch's t-test of ``b`` against ``a``: the verdict and the interval it implies, together."""

    p_value: float
    effect_size: float  #: Hedges' g
    verdict: str  #: "better" | "worse" | "cannot tell"
    difference: float  #: mean(b) - mean(a)
    interval: tuple[float, float]  #: 95 % (1 - alpha) confidence interval of the difference
    needed: int | None  #: per side, to separate the difference seen at 80 % power; None: separated
    said: str


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config keys as ``a/b`` (the way TensorBoard's HParams shows them)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_diff(configs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Only the keys whose values differ between the runs: key -> run -> value (missing: None)."""
    flat = {run: flatten(c) for run, c in configs.items()}
    keys = sorted({k for c in flat.values() for k in c})
    return {
        k: {run: c.get(k) for run, c in flat.items()}
        for k in keys
        if len({repr(c.get(k)) for c in flat.values()}) > 1
    }


def final_window(values: Sequence[float], window: int | None = None) -> list[float]:
    """The last ``window`` finite values (default: the last tenth, at least 5)."""
    array = np.asarray(values, dtype=np.float64)
    finite = array[np.isfinite(array)]
    size = window or max(5, len(finite) // 10)
    return finite[-size:].tolist()


def stdev(values: Sequence[float]) -> float:
    """The sample standard deviation; inf past float's range, as the arithmetic gives.

    numpy's two passes: ``statistics.stdev``'s exact fractions took half a second for a
    10,000-value window.
    """
    with np.errstate(all="ignore"):
        return float(np.std(np.asarray(values, dtype=np.float64), ddof=1))


@dataclasses.dataclass
class GroupComparison:
    """One metric of one group of seeds against the baseline's group: Welch on per-run means."""

    metric: str
    group: str
    runs: list[str]
    means: list[float]  #: each run's final-window mean
    baseline_group: str
    baseline_means: list[float]
    mean: float
    baseline_mean: float
    p_value: float
    effect_size: float
    verdict: str  #: "better" | "worse" | "cannot tell"
    iqm: float = math.nan
    baseline_iqm: float = math.nan
    #: of mean - baseline mean over the runs, 95 %, Welch's: "cannot tell" exactly when it holds 0
    interval: tuple[float, float] = (math.nan, math.nan)
    needed: int | None = None  #: runs a group that would separate the difference seen (80 % power)
    said: str = ""  #: the verdict in words, with its interval


@dataclasses.dataclass
class GroupScore:
    """One metric of one group: its runs' final-window means and their IQM with its interval."""

    metric: str
    group: str
    runs: list[str]
    means: list[float]
    mean: float
    std: float  #: sample std of the runs' means (NaN for one run)
    iqm: float
    interval: tuple[float, float]  #: 95% percentile bootstrap of the IQM over the runs
    higher_is_better: bool
    best: bool = False  #: the best IQM of the metric's groups, in its direction


@dataclasses.dataclass
class Comparison:
    """What ``metricbus compare`` reports."""

    baseline: str
    axis: str
    budget: float | None  #: the largest x every run reached (None on the step axis: no cut)
    config_diff: dict[str, dict[str, Any]]
    metrics: list[MetricComparison]
    groups: dict[str, list[str]]  #: group name -> its runs (one group per distinct config)
    group_metrics: list[GroupComparison]
    group_scores: list[GroupScore] = dataclasses.field(default_factory=list)
    group_by: list[str] = dataclasses.field(default_factory=list)  #: the keys grouped by
    baseline_group: str = ""

    def regressions(self) -> list[MetricComparison | GroupComparison]:
        """The worse verdicts that decide the exit status: the groups', when there are groups."""
        judged = self.group_metrics or self.metrics
        return [r for r in judged if r.verdict == "worse"]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def welch(
    metric: str, a: Sequence[float], b: Sequence[float], alpha: float = 0.05, runs: bool = False
) -> Welch:
    """Welch's t-test of ``b`` against ``a`` (:func:`welch_p`), with its interval and its words.

    The verdict is decided by the same statistic as the interval: "better"/"worse" exactly when
    the (1 - ``alpha``) interval of mean(b) - mean(a) leaves out 0. ``runs``: ``a`` and ``b`` are
    runs' means (a group each), which the words say, rather than values of a window.
    """
    from scipy.special import stdtrit

    sa, sb = stdev(a), stdev(b)
    diff = statistics.fmean(b) - statistics.fmean(a)
    if sa == 0 and sb == 0:  # two constant windows: the t statistic is undefined, the answer is not
        p = 0.0 if diff != 0 else 1.0
        interval = (diff, diff)
    else:
        p = welch_p(a, b, sa, sb)
        va, vb = sa * sa / len(a), sb * sb / len(b)
        with np.errstate(all="ignore"):
            df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
            half = float(stdtrit(df, 1 - alpha / 2)) * math.sqrt(va + vb)
        interval = (diff - half, diff + half) if math.isfinite(half) else (-math.inf, math.inf)
    pooled = math.sqrt(
        ((len(a) - 1) * sa * sa + (len(b) - 1) * sb * sb) / (len(a) + len(b) - 2)
    )  # ** raised past 1e154
    correction = 1 - 3 / (4 * (len(a) + len(b)) - 9)
    g = diff / pooled * correction if pooled > 0 else (math.inf if diff else 0.0) * (1 if diff >= 0 else -1)
    separated = diff != 0 and (interval[0] > 0 or interval[1] < 0)
    verdict, needed = "cannot tell", None
    if separated:
        up = StreamConfig().higher_is_better(split(metric)[0])
        verdict = "better" if (diff > 0) == up else "worse"
    else:
        needed = runs_needed(diff, sa, sb, alpha)
    said = _said(verdict, interval, len(a), len(b), needed, alpha, "runs" if runs else "values")
    return Welch(p, g, verdict, diff, interval, needed, said)


#: the power :func:`runs_needed` plans for
POWER = 0.8


def runs_needed(diff: float, sa: float, sb: float, alpha: float = 0.05) -> int | None:
    """Values a side that a two-sided test at ``alpha`` needs to separate ``diff`` with 80 % power.

    The normal approximation with Guenther's correction for the t test, at the effect seen
    (``diff`` over the two sides' root-mean-square sd). None when nothing separates it: no
    difference, or no spread to measure it against.
    """
    from scipy.special import ndtri

    spread = math.sqrt((sa * sa + sb * sb) / 2)
    if diff == 0 or not math.isfinite(spread) or spread == 0:
        return None
    d = abs(diff) / spread
    za, zb = float(ndtri(1 - alpha / 2)), float(ndtri(POWER))
    n = 2 * ((za + zb) / d) ** 2 + za * za / 4
    return max(2, math.ceil(n)) if math.isfinite(n) and n < 1e9 else None


def _said(
    verdict: str,
    interval: tuple[float, float],
    na: int,
    nb: int,
    needed: int | None,
    alpha: float,
    unit: str,
) -> str:
    """The verdict as a sentence that agrees with its interval (``unit``: "runs" or "values")."""
    level = f"{round((1 - alpha) * 100)} %"
    where = f"[{interval[0]:.4g}, {interval[1]:.4g}]"
    if verdict != "cannot tell":
        return f"{verdict}: the {level} interval of the difference, {where}, leaves out 0"
    sizes = f"{na} vs {nb} {unit}"
    if needed is None:
        return f"no difference to speak of: {sizes}, {level} interval {where}"
    each = "a group" if unit == "runs" else "a side"
    return (
        f"cannot tell at {level}: {sizes} leave 0 in the interval {where}; "
        f"about {needed} {unit} {each} would separate a difference this size (80 % power)"
    )


def welch_p(a: Sequence[float], b: Sequence[float], sa: float, sb: float) -> float:
    """The two-sided p of Welch's t-test of ``b`` against ``a`` (sample stds ``sa``, ``sb``).

    ``scipy.stats.ttest_ind(b, a, equal_var=False)``'s statistic, degrees of freedom
    (Welch-Satterthwaite) and p, from the t distribution in ``scipy.special``: importing
    ``scipy.stats`` took half a second of every ``compare``. 1.0 when not finite (values past
    float's range), as before. Equal to scipy's (tests/unit/test_compare.py).
    """
    from scipy.special import stdtr

    na, nb = len(a), len(b)
    with np.errstate(all="ignore"):
        va, vb = sa * sa / na, sb * sb / nb
        t = (statistics.fmean(b) - statistics.fmean(a)) / math.sqrt(va + vb) if va + vb > 0 else math.nan
        df = (va + vb) ** 2 / (va * va / (na - 1) + vb * vb / (nb - 1)) if va + vb > 0 else math.nan
        p = float(2 * stdtr(df, -abs(t))) if math.isfinite(t) and math.isfinite(df) else math.nan
    return p if math.isfinite(p) else 1.0


def compare_metric(
    metric: str,
    baseline: tuple[str, Sequence[float]],
    other: tuple[str, Sequence[float]],
    window: int | None = None,
    alpha: float = 0.05,
) -> MetricComparison | None:
    """Welch's t-test of ``other``'s final window against the baseline's; None if too short."""
    a, b = final_window(baseline[1], window), final_window(other[1], window)
    if len(a) < 2 or len(b) < 2:
        return None
    w = welch(metric, a, b, alpha)
    return MetricComparison(
        metric,
        other[0],
        statistics.fmean(b),
        stdev(b),
        len(b),
        statistics.fmean(a),
        w.p_value,
        w.effect_size,
        w.verdict,
        w.interval,
        w.needed,
        w.said,
    )


def group_keys(configs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The config keys that differ between the runs, seed keys left out."""
    return [k for k in config_diff(configs) if not SEED_KEY.search(k)]


def group_runs(
    configs: Mapping[str, Mapping[str, Any]], keys: Sequence[str] | None = None
) -> dict[str, list[str]]:
    """Runs by the values of ``keys`` (default: the keys that differ but seeds), named ``lr=0.001``."""
    chosen = group_keys(configs) if keys is None else keys
    return grouped({run: flatten(c) for run, c in configs.items()}, chosen)


def compare_runs(
    runs: Mapping[str, Sequence[Event]],
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    window: int | None = None,
    axis: str = "step",
    alpha: float = 0.05,
    group_by: Sequence[str] | None = None,
    baseline_group: str | None = None,
) -> Comparison:
    """Compare archived runs (``runs``: run id -> its logged events) against ``baseline``.

    Metrics: those given, else every one the runs share (per-label series included, system
    metrics left out). KeyError when a run never logged the ``axis`` metric.
    """
    configs = {run: run_config(events) for run, events in runs.items()}
    series = {run: scalars(events, samples=True) for run, events in runs.items()}
    return compare_series(configs, series, baseline, metrics, window, axis, alpha, group_by, baseline_group)


def compare_series(
    configs: Mapping[str, Mapping[str, Any]],
    series: Mapping[str, Series],
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    window: int | None = None,
    axis: str = "step",
    alpha: float = 0.05,
    group_by: Sequence[str] | None = None,
    baseline_group: str | None = None,
    per_run: bool = True,
) -> Comparison:
    """:func:`compare_runs` of runs already read: each one's config and :func:`scalars` series.

    ``group_by``: the config keys runs are grouped by (default: those that differ but seeds);
    ``baseline_group``: the group the others are compared with (default: the baseline run's);
    ``per_run=False``: the groups only, no run against the baseline run.
    """
    names = list(series)
    baseline = baseline or names[0]
    budget = None
    values: dict[str, dict[str, Any]]  #: run -> metric -> its values (an array or a list)
    if axis == "step":  # every value, in order: no line to build (a view of each series' array)
        values = {
            run: {m: np.frombuffer(pts.values, dtype=np.float64) for m, pts in s.items()}
            for run, s in series.items()
        }
    else:
        lines = {run: on_axis(run_series, axis) for run, run_series in series.items()}
        budget = min(
            max((x for pts in line.values() for x, _ in pts), default=0.0) for line in lines.values()
        )
        values = {run: {m: up_to(pts, budget) for m, pts in line.items()} for run, line in lines.items()}
    common = set.intersection(*(set(v) for v in values.values()))
    chosen = list(metrics) if metrics else sorted(m for m in common if not m.startswith("System/"))
    results = []
    for metric in chosen if per_run else ():
        for run in names:
            if run == baseline or metric not in values[run] or metric not in values[baseline]:
                continue
            found = compare_metric(
                metric, (baseline, values[baseline][metric]), (run, values[run][metric]), window, alpha
            )
            if found is not None:
                results.append(found)
    keys = list(group_by) if group_by else group_keys(configs)
    groups = group_runs(configs, keys)
    if baseline_group is not None and baseline_group not in groups:
        raise KeyError(baseline_group)
    home = baseline_group or next(g for g, members in groups.items() if baseline in members)
    compared, scores = [], []
    for metric in chosen:
        means = {
            run: statistics.fmean(w)
            for run in names
            if metric in values[run] and (w := final_window(values[run][metric], window))
        }
        up = StreamConfig().higher_is_better(split(metric)[0])
        mine_of = {g: [r for r in members if r in means] for g, members in groups.items()}
        metric_scores = [
            GroupScore(
                metric,
                group,
                members,
                [means[r] for r in members],
                statistics.fmean(means[r] for r in members),
                stdev([means[r] for r in members]) if len(members) > 1 else math.nan,
                iqm([means[r] for r in members]),
                iqm_interval([means[r] for r in members]),
                up,
            )
            for group, members in mine_of.items()
            if members
        ]
        finite = [sc for sc in metric_scores if math.isfinite(sc.iqm)]
        if len(finite) > 1:
            (max if up else min)(finite, key=lambda sc: sc.iqm).best = True
        scores.extend(metric_scores)
        base = [means[r] for r in mine_of.get(home, [])]
        for group, members in mine_of.items():
            mine = [means[r] for r in members]
            if group == home or len(mine) < 2 or len(base) < 2:
                continue
            test = welch(metric, base, mine, alpha, runs=True)
            compared.append(
                GroupComparison(
                    metric,
                    group,
                    members,
                    mine,
                    home,
                    base,
                    statistics.fmean(mine),
                    statistics.fmean(base),
                    test.p_value,
                    test.effect_size,
                    test.verdict,
                    iqm(mine),
                    iqm(base),
                    test.interval,
                    test.needed,
                    test.said,
                )
            )
    return Comparison(
        baseline, axis, budget, config_diff(configs), results, groups, compared, scores, keys, home
    )
