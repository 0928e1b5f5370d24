"""Numerically careful statistics as plain objects: update one value at a time, read any time.

No Faust, no Kafka: the stream job feeds these, the tests compare them with numpy.
NaN and inf are counted (``nonfinite``) but never enter a mean or a variance: one diverged
step must not poison a window; the NaN rule in the alerts sees it instead.
"""

from __future__ import annotations

import collections
import copy
import math
from collections.abc import Iterable, Sequence

import numpy as np


def fsum(values: Iterable[float]) -> float:
    """:func:`math.fsum` of ``values``; where it cannot be had, the IEEE sum: inf, -inf or nan.

    math.fsum raises OverflowError when its partial sums pass float's range (two values of
    1e308) and ValueError on inf and -inf together: a training job's finite values must not
    stop the statistics (the stream worker dead-lettered the record; a report stopped).
    """
    values = values if isinstance(values, list) else list(values)
    try:
        return math.fsum(values)
    except (OverflowError, ValueError):
        with np.errstate(over="ignore", invalid="ignore"):
            return float(np.sum(np.asarray(values, dtype=float)))


class Welford:
    """Running count, mean, variance (population and sample), min and max; mergeable (Chan et al.).

    Accumulates ``x - shift`` (shift: the first value seen), so a series with a large offset
    and a tiny spread (a timestamp, a loss of 1e9 + noise) keeps its precision.
    """

    __slots__ = ("count", "_shift", "_mean", "_m2", "min", "max", "nonfinite")

    def __init__(self) -> None:
        self.count = 0
        self._shift: float | None = None
        self._mean = 0.0  # of the shifted values
        self._m2 = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.nonfinite = 0

    def add(self, x: float) -> None:
        """Fold in one value."""
        if not math.isfinite(x):
            self.nonfinite += 1
            return
        if x < self.min:  # before the shift: min and max are the values themselves, to the bit
            self.min = x
        if x > self.max:
            self.max = x
        if self._shift is None:
            self._shift = x
        x -= self._shift
        self.count += 1
        delta = x - self._mean
        self._mean += delta / self.count
        self._m2 += delta * (x - self._mean)

    def extend(self, xs: Iterable[float]) -> None:
        """Fold in many values (one batch is merged as a block: exact and fast)."""
        if not isinstance(xs, np.ndarray):
            xs = list(xs)
            if len(xs) < 8:  # numpy's fixed cost is larger than a few adds
                for x in xs:
                    self.add(x)
                return
        arr = np.asarray(xs, dtype=float)
        finite = arr[np.isfinite(arr)]
        self.nonfinite += int(arr.size - finite.size)
        if finite.size:
            other = Welford()
            other._shift = float(finite[0])
            shifted = finite - other._shift
            other.count = int(finite.size)
            other._mean = float(shifted.mean())
            other._m2 = float(((shifted - other._mean) ** 2).sum())
            other.min, other.max = float(finite.min()), float(finite.max())
            self.merge(other)

    def merge(self, other: Welford) -> None:
        """Combine with statistics of another part of the data (Chan's parallel formulas)."""
        if other.count == 0:
            self.nonfinite += other.nonfinite
            return
        if self._shift is None or other._shift is None or self.count == 0:
            self._shift = other._shift
            self._mean = 0.0 if self.count == 0 else self._mean
        n = self.count + other.count
        # other's mean expressed against our shift; the shifts' difference is formed first
        delta = (other._shift - self._shift) + other._mean - self._mean  # type: ignore[operator]
        self._mean += delta * other.count / n
        self._m2 += other._m2 + delta * delta * self.count * other.count / n
        self.count = n
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.nonfinite += other.nonfinite

    @property
    def mean(self) -> float:
        """Mean of the finite values; NaN when empty."""
        return (self._shift or 0.0) + self._mean if self.count else math.nan

    @property
    def variance(self) -> float:
        """Population variance (numpy's ``var``, ddof=0); NaN when empty."""
        return self._m2 / self.count if self.count else math.nan

    @property
    def sample_variance(self) -> float:
        """Sample variance (ddof=1); NaN below two values."""
        return self._m2 / (self.count - 1) if self.count > 1 else math.nan

    @property
    def std(self) -> float:
        """Population standard deviation."""
        return math.sqrt(self.variance) if self.count else math.nan


class Blocks:
    """A :class:`Welford` fed in fixed blocks of ``BLOCK`` values, counted from the first.

    The same bits however a stream of values is batched (``Welford.extend`` merges each batch
    as a block, which rounds by the batch), at numpy's speed: the values of an unfinished block
    wait in ``pending`` (at most ``BLOCK - 1``), and a statistic read merges them into a copy.
    For an epoch's reward and loss, which a derived series must not make depend on batching.
    """

    __slots__ = ("done", "pending")

    BLOCK = 1024

    def __init__(self) -> None:
        self.done = Welford()
        self.pending: list[float] = []

    def extend(self, xs: Sequence[float]) -> None:
        pending = self.pending
        pending.extend(xs)
        if len(pending) >= self.BLOCK:
            whole = len(pending) - len(pending) % self.BLOCK
            for i in range(0, whole, self.BLOCK):
                self.done.extend(pending[i : i + self.BLOCK])
            del pending[:whole]

    def total(self) -> Welford:
        """Every value so far, as one Welford (the pending block merged in a copy)."""
        if not self.pending:
            return self.done
        total = copy.copy(self.done)
        total.extend(self.pending)
        return total


class Window:
    """The last ``size`` finite values: mean, std, min, max, median, quantiles, slope."""

    __slots__ = ("size", "values", "nonfinite")

    def __init__(self, size: int) -> None:
        self.size = size
        self.values: collections.deque[float] = collections.deque(maxlen=size)
        self.nonfinite = 0

    def add(self, x: float) -> None:
        """Append a value (NaN/inf are counted and skipped)."""
        if math.isfinite(x):
            self.values.append(x)
        else:
            self.nonfinite += 1

    def extend(self, xs: Sequence[float]) -> None:
        """Append many values (the deque does the work when all are finite, the usual case)."""
        if math.isfinite(sum(xs)):
            self.values.extend(xs)
        else:
            for x in xs:
                self.add(x)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def full(self) -> bool:
        """True once ``size`` values are held."""
        return len(self.values) == self.size

    def mean(self) -> float:
        """Mean of the window (windows are short: plain summation is accurate to an ulp or two)."""
        return sum(self.values) / len(self.values) if self.values else math.nan

    def std(self) -> float:
        """Population standard deviation of the window (two-pass around a shifted mean).

        The values are taken relative to the first one before the mean is formed, so a
        series of 1e9 + 1e-3 noise keeps its digits (the plain mean rounds at 1e-7).
        """
        n = len(self.values)
        if not n:
            return math.nan
        shift = self.values[0]
        d = [v - shift for v in self.values]
        m = fsum(d) / n
        return math.sqrt(fsum([(x - m) * (x - m) for x in d]) / n)  # x*x: inf past float's range, ** raised

    def quantile(self, q: float) -> float:
        """Linear-interpolated quantile, as numpy's default, to the bit; q in [0, 1].

        numpy's arithmetic (its ``_lerp``), except where the two neighbours' difference is past
        float's range (-1e308 and 1e308): numpy's median of those is -inf, here it is 0.0.
        """
        if not self.values:
            return math.nan
        v = sorted(self.values)
        h = (len(v) - 1) * q
        lo = math.floor(h)
        t = h - lo
        a = v[lo]
        if t == 0:
            return float(a)
        b = v[lo + 1]
        d = b - a
        if math.isinf(d):  # the window holds finite values only: an overflow
            return a * (1 - t) + b * t
        return b - d * (1 - t) if t >= 0.5 else a + d * t

    def median(self) -> float:
        """Median of the window."""
        return self.quantile(0.5)

    def slope(self) -> float:
        """Least-squares slope per value over the window (0 with fewer than two values)."""
        n = len(self.values)
        if n < 2:
            return 0.0
        with np.errstate(invalid="ignore", over="ignore"):  # inf or nan past float's range, not a warning
            y = np.fromiter(self.values, float)
            y -= y[0]  # shift first: a large offset would swamp the centring below
            x = np.arange(n, dtype=float)
            x -= x.mean()
            return float((x * (y - y.mean())).sum() / (x * x).sum())


class RollingMoments:
    """Mean and std of the last ``size`` finite values in O(1) per value.

    Keeps sums of ``x - shift`` and their squares (shift: the first value), adding the new
    value and subtracting the evicted one, for hot paths such as a z-score rule evaluated on
    every value; :class:`Window` recomputes exactly and is the reference in the tests.
    """

    __slots__ = ("size", "values", "_shift", "_sum", "_sumsq")

    def __init__(self, size: int) -> None:
        self.size = size
        self.values: collections.deque[float] = collections.deque()
        self._shift: float | None = None
        self._sum = 0.0
        self._sumsq = 0.0

    def add(self, x: float) -> None:
        """Append a finite value (others are ignored), evicting the oldest when full."""
        if not math.isfinite(x):
            return
        if self._shift is None:
            self._shift = x
        d = x - self._shift
        self.values.append(d)
        self._sum += d
        self._sumsq += d * d
        if len(self.values) > self.size:
            old = self.values.popleft()
            self._sum -= old
            self._sumsq -= old * old
            if not math.isfinite(self._sumsq):  # a square past float's range left (inf - inf): sum again
                self._sum, self._sumsq = sum(self.values), sum(d * d for d in self.values)

    def scores(self, xs: Sequence[float], min_count: int) -> np.ndarray:
        """The z-score of each finite value against the window just before it, as if added in turn.

        NaN where that window holds fewer than ``min_count`` values or has no spread. Nothing
        is added: a caller that acts on no score then calls :meth:`extend`. ``xs`` must be finite.
        """
        shift = self._shift if self._shift is not None else (float(xs[0]) if len(xs) else 0.0)
        held = len(self.values)
        a = np.concatenate([np.fromiter(self.values, float, held), np.asarray(xs, dtype=float) - shift])
        p = np.arange(held, a.size)  # where each new value sits
        lo = np.maximum(p - self.size, 0)
        n = p - lo
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # inf and nan past float's range
            c1 = np.concatenate([[0.0], np.cumsum(a)])
            c2 = np.concatenate([[0.0], np.cumsum(a * a)])
            mean = (c1[p] - c1[lo]) / n
            std = np.sqrt(np.maximum((c2[p] - c2[lo]) / n - mean * mean, 0.0))
            z = (a[held:] - mean) / std
        z[(n < min_count) | ~(std > 0)] = np.nan
        return z

    def extend(self, xs: Sequence[float]) -> None:
        """Add many finite values; the sums are recomputed from the window (no drift carried on)."""
        if not len(xs):
            return
        if self._shift is None:
            self._shift = float(xs[0])
        shift, values = self._shift, self.values
        values.extend(x - shift for x in xs[-self.size :])
        while len(values) > self.size:
            values.popleft()
        self._sum = sum(values)
        self._sumsq = sum(d * d for d in values)

    def __len__(self) -> int:
        return len(self.values)

    def mean(self) -> float:
        """Mean of the window."""
        n = len(self.values)
        return (self._shift or 0.0) + self._sum / n if n else math.nan

    def std(self) -> float:
        """Population standard deviation of the window (never negative from rounding)."""
        n = len(self.values)
        if not n:
            return math.nan
        m = self._sum / n
        return math.sqrt(max(self._sumsq / n - m * m, 0.0))


class EMA:
    """Exponential moving average with TensorBoard's smoothing and debiasing.

    ``weight`` is TensorBoard's smoothing slider (0.6 by default there): the first values
    are not biased toward zero because the estimate is divided by ``1 - weight**n``.
    """

    __slots__ = ("weight", "_last", "_n")

    def __init__(self, weight: float = 0.6) -> None:
        if not 0.0 <= weight < 1.0:
            raise ValueError(f"EMA weight must be in [0, 1), got {weight}")
        self.weight = weight
        self._last = 0.0
        self._n = 0

    def add(self, x: float) -> float:
        """Fold in a value and return the debiased average (NaN/inf leave it unchanged)."""
        if math.isfinite(x):
            self._last = self._last * self.weight + (1 - self.weight) * x
            self._n += 1
        return self.value

    def extend(self, xs: Sequence[float]) -> None:
        """Fold in many values, in order: bit for bit what :meth:`add` one by one gives.

        No closed form over a block (``w**k`` and a dot product round differently): a derived
        series must not depend on how its values were batched.
        """
        w, c = self.weight, 1 - self.weight
        last, n = self._last, self._n
        finite = math.isfinite(sum(xs))
        for x in xs:
            if finite or math.isfinite(x):
                last = last * w + c * x
                n += 1
        self._last, self._n = last, n

    @property
    def value(self) -> float:
        """The debiased average; NaN before any finite value."""
        if not self._n:
            return math.nan
        return self._last / (1 - self.weight**self._n)


IMPROVING, STABLE, DECLINING = 1, 0, -1


def trend_class(slope: float, scale: float, higher_is_better: bool, tolerance: float = 0.01) -> int:
    """Classify a slope as IMPROVING (+1), STABLE (0) or DECLINING (-1).

    ``tolerance`` is relative: a slope smaller than ``tolerance * scale`` per value (scale:
    the window's typical magnitude, e.g. its std or mean) is stable. Direction matters:
    loss falling is improving, reward rising is improving.
    """
    if not math.isfinite(slope) or abs(slope) <= tolerance * max(abs(scale), 1e-12):
        return STABLE
    rising = slope > 0
    return IMPROVING if rising == higher_is_better else DECLINING


class Convergence:
    """A series that has stopped moving.

    Converged when, for ``patience`` consecutive full windows, |slope| and the window's std
    are both under their tolerances (relative to the window's mean magnitude).
    """

    __slots__ = ("slope_tol", "std_tol", "patience", "streak")

    def __init__(self, slope_tol: float = 1e-3, std_tol: float = 0.05, patience: int = 3) -> None:
        self.slope_tol = slope_tol
        self.std_tol = std_tol
        self.patience = patience
        self.streak = 0

    def update(self, window: Window) -> bool:
        """Evaluate one (full) window; return whether the series has converged."""
        if not window.full:
            return False
        scale = max(abs(window.mean()), 1e-12)
        calm = abs(window.slope()) <= self.slope_tol * scale and window.std() <= self.std_tol * scale
        self.streak = self.streak + 1 if calm else 0
        return self.streak >= self.patience
