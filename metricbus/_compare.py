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
the metric" asks of one seed each; across seeds, group runs by config and compare the groups.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from stream_jobs import StreamConfig


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
    finite = [v for v in values if math.isfinite(v)]
    size = window or max(5, len(finite) // 10)
    return finite[-size:]


def compare_metric(
    metric: str,
    baseline: tuple[str, Sequence[float]],
    other: tuple[str, Sequence[float]],
    window: int | None = None,
    alpha: float = 0.05,
) -> MetricComparison | None:
    """Welch's t-test of ``other``'s final window against the baseline's; None if too short."""
    from scipy import stats

    a, b = final_window(baseline[1], window), final_window(other[1], window)
    if len(a) < 2 or len(b) < 2:
        return None
    result = stats.ttest_ind(b, a, equal_var=False)
    p = float(result.pvalue) if math.isfinite(result.pvalue) else 1.0
    sa, sb = statistics.stdev(a), statistics.stdev(b)
    pooled = math.sqrt(((len(a) - 1) * sa**2 + (len(b) - 1) * sb**2) / (len(a) + len(b) - 2))
    correction = 1 - 3 / (4 * (len(a) + len(b)) - 9)
    diff = statistics.fmean(b) - statistics.fmean(a)
    g = diff / pooled * correction if pooled > 0 else (math.inf if diff else 0.0) * (1 if diff >= 0 else -1)
    verdict = "no significant change"
    if p < alpha and diff != 0:
        up = StreamConfig().higher_is_better(metric)
        verdict = "better" if (diff > 0) == up else "worse"
    return MetricComparison(
        metric, other[0], statistics.fmean(b), sb, len(b), statistics.fmean(a), p, g, verdict
    )
