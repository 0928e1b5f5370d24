"""Groups of runs: which runs are one configuration, their curves as one, their scores across seeds.

A *group* is the runs whose configs agree on the keys grouped by (``--group-by lr``), or,
when no keys are named, on every key but the seed keys: three seeds of one configuration are
one group, named ``lr=0.001``.

A group's *curve* is the mean of its runs at each step of a common grid, with a band: the
sample standard deviation either side, or the runs' minimum and maximum. Runs that logged at
the same steps keep those steps; otherwise each run is interpolated linearly onto the steps
any of them logged within the range every run covers (from the latest first step to the
earliest last step: nothing is extrapolated, so a run that stopped early cuts the grid).
Either way at most :data:`GRID_POINTS` steps, evenly thinned, the ends kept.

A group's *score* on a metric is the interquartile mean (IQM) of its runs' final-window
means, with a 95% percentile-bootstrap interval over the runs (Agarwal et al., 2021,
"Deep RL at the Edge of the Statistical Precipice"; rliable's recommended aggregate: robust
to one outlying seed, less noisy than the median). With fewer than four runs the IQM trims
nothing and is the mean. The score describes a group; comparing two groups is ``_compare``'s
Welch test, whose interval decides: a bootstrap over three seeds has ten distinct resamples
to draw from, so its interval of a difference is narrower than the test's and would
contradict the verdict beside it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: Points of the common grid runs are interpolated onto (when they did not log at the same steps).
GRID_POINTS = 400
#: Bootstrap resamples; the generator is seeded, so a comparison reads the same every time.
RESAMPLES = 2000
CONFIDENCE = 0.95


def group_name(config: Mapping[str, Any], keys: Sequence[str]) -> str:
    """``lr=0.001, batch=64``: the group a flattened config belongs to (missing keys: None)."""
    return ", ".join(f"{k}={config.get(k)!r}" for k in keys) or "all runs"


def grouped(flat_configs: Mapping[str, Mapping[str, Any]], keys: Sequence[str]) -> dict[str, list[str]]:
    """Runs by the values of ``keys`` in their (flattened) configs, in the runs' order."""
    groups: dict[str, list[str]] = {}
    for run, config in flat_configs.items():
        groups.setdefault(group_name(config, keys), []).append(run)
    return groups


Curve = tuple[np.ndarray, np.ndarray]  #: (steps, values), one value per step, steps ascending


def curve(steps: Any, values: Any) -> Curve:
    """One value per step (the last logged at it, as the charts show), non-finite values dropped."""
    s = np.asarray(steps, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    keep = np.isfinite(v)
    s, v = s[keep], v[keep]
    order = np.argsort(s, kind="stable")
    s, v = s[order], v[order]
    last = np.r_[s[1:] != s[:-1], True] if len(s) else np.zeros(0, dtype=bool)
    return s[last], v[last]


def aligned(curves: Sequence[Curve], points: int = GRID_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """``(grid, matrix)``: every curve on one grid of steps, a row per curve (see the module)."""
    curves = [c for c in curves if len(c[0])]
    if not curves:
        return np.zeros(0), np.zeros((0, 0))
    first = curves[0][0]
    if all(len(c[0]) == len(first) and np.array_equal(c[0], first) for c in curves):
        keep = _thinned(len(first), points)
        return first[keep], np.vstack([c[1][keep] for c in curves])
    lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
    if hi < lo:  # no step that every run covers
        return np.zeros(0), np.zeros((len(curves), 0))
    union = np.unique(np.concatenate([c[0] for c in curves]))
    grid = union[(union >= lo) & (union <= hi)]
    grid = grid[_thinned(len(grid), points)]
    return grid, np.vstack([np.interp(grid, s, v) for s, v in curves])


def _thinned(n: int, points: int) -> np.ndarray:
    """Indices of at most ``points`` of ``n`` steps, evenly spread, the first and last kept."""
    if n <= points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, points).round().astype(np.int64))


@dataclasses.dataclass
class Band:
    """A group's curve: the mean of its runs at each grid step and the band around it."""

    group: str
    runs: list[str]
    steps: list[float]
    mean: list[float]
    lower: list[float]
    upper: list[float]
    band: str  #: "std" (mean ± sample std; none for one run) or "minmax"


def band_of(group: str, runs: Sequence[str], curves: Sequence[Curve], band: str = "std") -> Band:
    """The group's mean curve and its band (``band``: "std" or "minmax")."""
    grid, matrix = aligned(curves)
    if not grid.size:
        return Band(group, list(runs), [], [], [], [], band)
    mean = matrix.mean(axis=0)
    if band == "minmax":
        lower, upper = matrix.min(axis=0), matrix.max(axis=0)
    elif band == "std":
        spread = matrix.std(axis=0, ddof=1) if len(matrix) > 1 else np.zeros_like(mean)
        lower, upper = mean - spread, mean + spread
    else:
        raise ValueError(f"band {band!r}: std or minmax")
    return Band(group, list(runs), grid.tolist(), mean.tolist(), lower.tolist(), upper.tolist(), band)


def iqm(values: Sequence[float]) -> float:
    """The interquartile mean: the mean of the middle half, as ``scipy.stats.trim_mean(x, 0.25)``.

    int(n / 4) values cut from each end of the sorted values (none of fewer than four). numpy's:
    importing ``scipy.stats`` took half a second of every ``compare``.
    """
    data = np.sort(np.asarray(values, dtype=np.float64))
    cut = int(0.25 * len(data))
    return float(np.mean(data[cut : len(data) - cut])) if len(data) else math.nan


def interval_text(low: float, high: float) -> str:
    """`` [low, high]`` for a terminal or a page; nothing for no interval (NaN: one run)."""
    return "" if math.isnan(low) else f" [{low:.4g}, {high:.4g}]"


def _iqm_along(x: np.ndarray, axis: int = -1) -> Any:
    from scipy import stats

    return stats.trim_mean(x, 0.25, axis=axis)


def iqm_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the IQM over ``values`` (the runs); NaN for one run."""
    data = np.asarray(values, dtype=np.float64)
    if len(data) < 2:
        return math.nan, math.nan
    if np.all(data == data[0]):
        return float(data[0]), float(data[0])
    from scipy import stats  # half a second: only where there is something to resample

    found = stats.bootstrap(
        (data,),
        _iqm_along,
        n_resamples=RESAMPLES,
        confidence_level=CONFIDENCE,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return float(found.confidence_interval.low), float(found.confidence_interval.high)


def bands(curves: Mapping[str, Curve], groups: Mapping[str, Sequence[str]], band: str = "std") -> list[Band]:
    """Each group's :func:`band_of`, over the runs of it that have the curve."""
    out = []
    for group, members in groups.items():
        mine = [r for r in members if r in curves and len(curves[r][0])]
        if mine:
            out.append(band_of(group, mine, [curves[r] for r in mine], band))
    return out
