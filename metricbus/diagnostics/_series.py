"""A run's logged scalars as the diagnostics read them: per metric, per label, on a chosen axis.

A labelled event's values (``run.log(..., labels={"task": "logo_a"})``, ``run.log_episode``)
count toward the metric and also toward ``<metric> [<key>=<value>]``, one series per label,
which health, compare and the report break results down by.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from metricbus.schemas import METRICS, Event

Point = tuple[int, float, int]  #: (step, value, ts_ms)


class Points(Sequence[Point]):
    """One series' points in event order, kept as three typed arrays.

    24 bytes a point, where a tuple of three objects took about 100: the two million points of a
    200,000-step run of ten metrics held ~200 MB while health or a report read it. Iterating,
    indexing and slicing give ``(step, value, ts_ms)`` tuples, made as they are read.
    """

    __slots__ = ("steps", "values", "stamps")

    def __init__(self, points: Iterable[Point] = ()) -> None:
        self.steps, self.values, self.stamps = array("q"), array("d"), array("q")
        for point in points:
            self.append(point)

    def append(self, point: Point) -> None:
        step, value, ts = point
        self.steps.append(step)
        self.values.append(value)
        self.stamps.append(ts)

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[Point]:
        return zip(self.steps, self.values, self.stamps, strict=True)

    @overload
    def __getitem__(self, i: int) -> Point: ...

    @overload
    def __getitem__(self, i: slice) -> list[Point]: ...

    def __getitem__(self, i: int | slice) -> Point | list[Point]:
        if isinstance(i, slice):
            return list(zip(self.steps[i], self.values[i], self.stamps[i], strict=True))
        return self.steps[i], self.values[i], self.stamps[i]

    def __repr__(self) -> str:
        return f"Points({list(self)!r})"


#: name -> its points in event order
Series = dict[str, Points]

#: The axes every run has; any logged metric (env steps, tokens) is an axis too.
AXES = ("step", "time")


def labelled(metric: str, key: str, value: str) -> str:
    """The name of ``metric``'s series over the events labelled ``key=value``."""
    return f"{metric} [{key}={value}]"


def split(name: str) -> tuple[str, str | None]:
    """``(metric, "key=value")`` of a labelled series' name, ``(name, None)`` of a plain one."""
    if name.endswith("]") and " [" in name:
        metric, _, label = name[:-1].rpartition(" [")
        return metric, label
    return name, None


def scalars(events: Iterable[Event], labels: bool = True, samples: bool = False) -> Series:
    """Every logged scalar series of a run; with ``labels``, the per-label series too.

    With ``samples``, a per-sample array (``run.log({"Train/Reward": [...]})``) is a series of
    its per-step means of finite samples under its own name, as the worker reads it for a run's
    reward (the alias catalog names ``Train/Reward`` and SB3's ``rollout/episode_return``):
    health and compare judge a reward logged as samples like one logged as a scalar.
    """
    out: Series = {}
    for e in events:
        if e.kind != METRICS:
            continue
        step, tags = e.body["step"], e.body.get("labels") if labels else None
        for name, values in (e.body.get("samples") or {}).items() if samples else ():
            finite = [v for v in values if math.isfinite(v)]
            if finite:
                mean = sum(finite) / len(finite)  # inf past float's range, as a scalar would be
                (out.get(name) or out.setdefault(name, Points())).append((step, mean, e.ts_ms))
        for name, value in e.body["scalars"].items():
            point = (step, value, e.ts_ms)
            (out.get(name) or out.setdefault(name, Points())).append(point)
            for key, tag in (tags or {}).items():
                series = labelled(name, key, tag)
                (out.get(series) or out.setdefault(series, Points())).append(point)
    return out


def on_axis(series: Series, axis: str = "step") -> dict[str, list[tuple[float, float]]]:
    """Each series as ``(x, value)`` on the step, time or a logged metric's axis.

    x is the step, the seconds since the run's first value (``time``), or the last value of the
    metric ``axis`` logged at or before the step (env steps, tokens: runs that log at different
    rates line up on the budget they spent). KeyError when the run never logged ``axis``;
    values before the axis' first point are left out.
    """
    if axis == "step":
        return {n: [(float(s), v) for s, v, _ in pts] for n, pts in series.items()}
    if axis == "time":
        start = min((ts for pts in series.values() for _, _, ts in pts), default=0)
        return {n: [((ts - start) / 1000, v) for _, v, ts in pts] for n, pts in series.items()}
    budget = sorted((s, v) for s, v, _ in series[axis] if math.isfinite(v))
    steps = [s for s, _ in budget]
    out: dict[str, list[tuple[float, float]]] = {}
    for name, pts in series.items():
        line = []
        for s, v, _ in pts:
            i = bisect.bisect_right(steps, s)
            if i:
                line.append((budget[i - 1][1], v))
        out[name] = line
    return out


def up_to(points: Sequence[tuple[float, float]], x: float) -> list[float]:
    """The values at x at most ``x`` (a run cut at the budget every compared run reached)."""
    return [v for px, v in points if px <= x]
