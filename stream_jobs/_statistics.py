"""The per-metric statistics ``metric_stats`` can name: a registry, one entry per statistic.

Each logged scalar keeps one :class:`Series` of state; a :class:`Statistic` reads its value from
it. A new statistic is one new entry here (and its state in :class:`Series` when it needs its
own), not edits in several places. Plain Python, no Faust.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from ._stats import EMA, Convergence, Window, trend_class


class Series:
    """The state one logged scalar keeps for its statistics (windows, EMA, counts)."""

    __slots__ = ("recent", "ema", "trend", "convergence", "count", "nonfinite", "last", "counter")

    def __init__(self, window: int, ema_weight: float, trend_window: int) -> None:
        self.count = 0  # finite values, like every other statistic
        self.nonfinite = 0
        #: (step, epoch, ts_ms) of the last value folded in: where the run's end puts its last point
        self.last: tuple[int, int | None, int] | None = None
        #: every value so far a whole number, none below the one before (a step count, samples
        #: seen, a constant): no smoothing until a value is not (``RunDeriver._fold``)
        self.counter = True
        self.recent = Window(window)
        self.ema = EMA(ema_weight)
        self.trend = Window(trend_window)
        self.convergence = Convergence()

    @property
    def seen(self) -> int:
        """Values folded in so far, finite or not."""
        return self.count + self.nonfinite

    def extend(self, values: list[float], smooth: bool = True) -> None:
        """Fold in values, in order (each statistic the same as value by value, bit for bit).

        ``smooth=False``: not into the EMA (a series that gets no ``metric_stats``: a counter, a
        schedule), which costs a Python step per value.
        """
        if math.isfinite(sum(values)):
            self.count += len(values)
        else:
            finite = sum(map(math.isfinite, values))
            self.count += finite
            self.nonfinite += len(values) - finite
        self.recent.extend(values)
        self.trend.extend(values)
        if smooth:
            self.ema.extend(values)


@dataclasses.dataclass(frozen=True)
class Statistic:
    """How one statistic is read from a :class:`Series`.

    ``kind`` is the Aggregate record's kind; ``value(series, higher_is_better)`` the value now.
    """

    kind: str
    value: Callable[[Series, bool], float]


def _over_recent(read: Callable[[Window], float]) -> Callable[[Series, bool], float]:
    """A statistic of the last ``window`` finite values (NaN before the first)."""
    return lambda s, _: read(s.recent) if len(s.recent) else math.nan


def _trend(s: Series, higher_is_better: bool) -> float:
    window = s.trend
    if not len(window):
        return 0.0
    return float(trend_class(window.slope(), window.std() or abs(window.mean()), higher_is_better))


#: every statistic, by the name ``metric_stats`` uses; ``<M>_<name>`` is the derived series
STATISTICS: dict[str, Statistic] = {
    "recent_mean": Statistic("rolling_mean", lambda s, _: s.recent.mean()),
    "ema": Statistic("ema", lambda s, _: s.ema.value),
    "std": Statistic("std", _over_recent(Window.std)),
    "min": Statistic("min", _over_recent(lambda w: min(w.values))),
    "max": Statistic("max", _over_recent(lambda w: max(w.values))),
    "median": Statistic("median", _over_recent(lambda w: w.quantile(0.5))),
    "p99": Statistic("p99", _over_recent(lambda w: w.quantile(0.99))),
    "count": Statistic("count", lambda s, _: float(s.count)),
    "nonfinite": Statistic("nonfinite", lambda s, _: float(s.nonfinite)),
    "slope": Statistic("slope", lambda s, _: s.trend.slope()),
    "trend": Statistic("trend", _trend),
}
