"""Compare runs from the archive: config differences, final-window statistics, significance.

For each metric, each run's *final window* is its last ``window`` finite values (default: the
last tenth, at least 5). Against the baseline run (the first, or ``baseline=``), the verdict is
Welch's t-test on the two final windows (``scipy.stats.ttest_ind(equal_var=False)``: the runs'
variances differ as a rule, and the windows are short), with Hedges' g as the effect size. A
change is a *regression* when it is significant (p < ``alpha``) and in the worse direction
(lower is better for names with loss, kl, time, memory, variance or std, as the stream's trend
direction; higher for everything else).

Values within one window are consecutive points of one run, not independent samples: the test
says whether the two windows differ beyond their own noise, which is what "did this change move
the metric" asks of one seed each.

Across seeds: runs whose configs differ only in seed keys (``seed``, ``env_seed``, ...) form a
group, named by the config keys that do differ (``lr=0.001``). When the baseline's group and
another hold two or more runs each, each run's final-window mean is one observation and the
groups are compared with Welch's t-test on those means: seeds are independent runs, so here the
test's assumption holds, and with three to five seeds per group a bootstrap interval would rest
on too few values to resample. The groups' verdicts then decide the exit status.

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
    verdict: str  #: "better" | "worse" | "no significant change"


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
    verdict: str


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

    def regressions(self) -> list[MetricComparison | GroupComparison]:
        """The worse verdicts that decide the exit status: the groups', when there are groups."""
        judged = self.group_metrics or self.metrics
        return [r for r in judged if r.verdict == "worse"]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def welch(
    metric: str, a: Sequence[float], b: Sequence[float], alpha: float = 0.05
) -> tuple[float, float, str]:
    """``(p, Hedges' g, verdict)`` of ``b`` against ``a`` (Welch's t-test, scipy)."""
    from scipy import stats

    sa, sb = stdev(a), stdev(b)
    if sa == 0 and sb == 0:  # two constant windows: the t statistic is undefined, the answer is not
        p = 0.0 if statistics.fmean(a) != statistics.fmean(b) else 1.0
    else:
        result = stats.ttest_ind(b, a, equal_var=False)
        p = float(result.pvalue) if math.isfinite(result.pvalue) else 1.0
    pooled = math.sqrt(
        ((len(a) - 1) * sa * sa + (len(b) - 1) * sb * sb) / (len(a) + len(b) - 2)
    )  # ** raised past 1e154
    correction = 1 - 3 / (4 * (len(a) + len(b)) - 9)
    diff = statistics.fmean(b) - statistics.fmean(a)
    g = diff / pooled * correction if pooled > 0 else (math.inf if diff else 0.0) * (1 if diff >= 0 else -1)
    verdict = "no significant change"
    if p < alpha and diff != 0:
        up = StreamConfig().higher_is_better(split(metric)[0])
        verdict = "better" if (diff > 0) == up else "worse"
    return p, g, verdict


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
    p, g, verdict = welch(metric, a, b, alpha)
    return MetricComparison(
        metric, other[0], statistics.fmean(b), stdev(b), len(b), statistics.fmean(a), p, g, verdict
    )


def group_runs(configs: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Runs whose configs are equal but for seed keys, named by the keys that differ (``lr=0.001``)."""
    diff = {k: v for k, v in config_diff(configs).items() if not SEED_KEY.search(k)}
    groups: dict[str, list[str]] = {}
    for run in configs:
        name = ", ".join(f"{k}={values[run]!r}" for k, values in diff.items()) or "all runs"
        groups.setdefault(name, []).append(run)
    return groups


def compare_runs(
    runs: Mapping[str, Sequence[Event]],
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    window: int | None = None,
    axis: str = "step",
    alpha: float = 0.05,
) -> Comparison:
    """Compare archived runs (``runs``: run id -> its logged events) against ``baseline``.

    Metrics: those given, else every one the runs share (per-label series included, system
    metrics left out). KeyError when a run never logged the ``axis`` metric.
    """
    configs = {run: run_config(events) for run, events in runs.items()}
    series = {run: scalars(events, samples=True) for run, events in runs.items()}
    return compare_series(configs, series, baseline, metrics, window, axis, alpha)


def compare_series(
    configs: Mapping[str, Mapping[str, Any]],
    series: Mapping[str, Series],
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    window: int | None = None,
    axis: str = "step",
    alpha: float = 0.05,
) -> Comparison:
    """:func:`compare_runs` of runs already read: each one's config and :func:`scalars` series."""
    names = list(series)
    baseline = baseline or names[0]
    budget = None
    if axis == "step":  # every value, in order: no line to build
        values = {run: {m: pts.values.tolist() for m, pts in s.items()} for run, s in series.items()}
    else:
        lines = {run: on_axis(run_series, axis) for run, run_series in series.items()}
        budget = min(
            max((x for pts in line.values() for x, _ in pts), default=0.0) for line in lines.values()
        )
        values = {run: {m: up_to(pts, budget) for m, pts in line.items()} for run, line in lines.items()}
    common = set.intersection(*(set(v) for v in values.values()))
    chosen = list(metrics) if metrics else sorted(m for m in common if not m.startswith("System/"))
    results = []
    for metric in chosen:
        for run in names:
            if run == baseline or metric not in values[run] or metric not in values[baseline]:
                continue
            found = compare_metric(
                metric, (baseline, values[baseline][metric]), (run, values[run][metric]), window, alpha
            )
            if found is not None:
                results.append(found)
    groups = group_runs(configs)
    home = next(g for g, members in groups.items() if baseline in members)
    grouped = []
    for metric in chosen:
        means = {
            run: statistics.fmean(w)
            for run in names
            if metric in values[run] and (w := final_window(values[run][metric], window))
        }
        base = [means[r] for r in groups[home] if r in means]
        for group, members in groups.items():
            mine = [means[r] for r in members if r in means]
            if group == home or len(mine) < 2 or len(base) < 2:
                continue
            p, g, verdict = welch(metric, base, mine, alpha)
            grouped.append(
                GroupComparison(
                    metric,
                    group,
                    [r for r in members if r in means],
                    mine,
                    home,
                    base,
                    statistics.fmean(mine),
                    statistics.fmean(base),
                    p,
                    g,
                    verdict,
                )
            )
    return Comparison(baseline, axis, budget, config_diff(configs), results, groups, grouped)
