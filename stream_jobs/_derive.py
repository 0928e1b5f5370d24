"""Per-run derivation: logged events in, derived points out.

Plain Python; the Faust agent and the back-tests feed it the same way.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Iterable
from itertools import islice, repeat
from typing import Any

from metricbus.schemas import (
    HEARTBEAT,
    METRICS,
    NO_EPOCH,
    RUN_FINISHED,
    RUN_STARTED,
    Event,
    ScalarColumns,
    printable,
)

from ._config import StreamConfig
from ._epochs import Epoch, Roles, epoch_points
from ._labels import LabelSeries
from ._points import Column, Point, point_of
from ._ranks import RankMerger
from ._roles import RoleBinding
from ._samples import final_points, sample_histogram
from ._statistics import STATISTICS, Series
from ._stats import Welford, Window, fsum

log = logging.getLogger("metricbus.stream")


#: checkpoints written before the epoch's class moved to ``_epochs`` name it here
_Epoch = Epoch


class RunDeriver:
    """All derived series of one run. Feed events in (producer, seq) order per producer."""

    def __init__(self, run_id: str, cfg: StreamConfig | None = None) -> None:
        self.run_id = run_id
        self.cfg = cfg or StreamConfig()
        self._series: dict[str, Series] = {}
        #: name -> whether it gets metric_stats (cfg.smoothed), and whether higher is better
        #: (cached: computed per point they cost more than the statistics; names are bounded)
        self._smoothed: dict[str, tuple[bool, bool]] = {}
        self._sample_windows: dict[str, Window] = {}
        self._sample_totals: dict[str, Welford] = {}
        self._throughput: dict[str, tuple[Welford, Window]] = {}
        self._epoch: Epoch | None = None
        self._epoch_no: int | None = None
        self._previous: dict[str, float] = {}
        self._last_step = 0
        self._ranks: RankMerger | None = None
        self._producer_rank: dict[str, int] = {}  # from each producer's RunStarted
        self._rank_producer: dict[int, str] = {}  # the producer each rank's events come from
        self._finished_producers: set[str] = set()
        self._hist_recent: dict[str, Window] = {}  # samples name -> its last hist_window scores
        self._hist_step: dict[str, int] = {}  # samples name -> step of its last histogram
        self._histograms: list[dict[str, Any]] = []
        self._tables: list[dict[str, Any]] = []
        self.finished = False
        # the run's reward and loss series (the alias catalog), bound on first sight
        self._reward = RoleBinding(self.cfg.reward_catalog())
        self._reward_samples = RoleBinding(self.cfg.reward_catalog())
        #: the per-step means of the reward's samples (their trend and convergence at epoch ends)
        self._reward_steps = Series(self.cfg.window, self.cfg.ema_weight, self.cfg.trend_window)
        self._loss = RoleBinding(self.cfg.loss_catalog())
        self.labels = LabelSeries(run_id, self.cfg)
        #: logged or derived series -> the role it plays in this run ("@reward", "@loss"), for
        #: the rules scoped to a role
        self.role_of: dict[str, str] = {}

    #: logged values of names past ``cfg.max_series`` (not derived); class defaults, so a
    #: deriver from a checkpoint written before them has them too
    refused = 0
    _said = False

    def series(self) -> int:
        """The series this run derives from (names logged, label series): what its state grows with."""
        return len(self._series) + len(self._sample_windows) + self.labels.series()

    def _over(self, name: str) -> bool:
        """Whether ``name`` is new and the run has its ``max_series`` series: then count it."""
        if self.series() < self.cfg.max_series:
            return False
        self.refused += 1
        if not self._said:
            self._said = True
            log.warning(
                "run %s: %s: more than %d series; later names are not derived (counted; said once per run)",
                self.run_id,
                printable(name[:100]),
                self.cfg.max_series,
            )
        return True

    @property
    def last_step(self) -> int:
        """The highest step the run logged so far."""
        return self._last_step

    def feed(self, kind: str, body: dict[str, Any], ts_ms: int, producer: str = "") -> list[Point]:
        """Derived points caused by one event (``producer``: who sent it, for multi-rank runs)."""
        if kind == METRICS:
            out: list[Point] = []
            self._stretch([body], [ts_ms], out, None)
            if body["samples"]:
                self._samples(body, ts_ms, out)
            if body.get("labels"):
                labelled = self.labels.feed(
                    body["labels"],
                    body["scalars"],
                    body["step"],
                    body["epoch"],
                    ts_ms,
                    self.cfg.max_series - self.series(),
                )
                out.extend(Point(*p) for p in labelled)
            if self._ranks is not None:
                self._rank_producer[body["rank"]] = producer
                merged = (
                    self._ranks.feed(body["rank"], body["step"], body["scalars"], ts_ms)
                    if body["scalars"]
                    else self._ranks.seen(body["rank"], ts_ms)
                )
                out.extend(_rank_points(merged, body["epoch"], ts_ms))
            return out
        if kind == RUN_STARTED:
            if self.finished and producer not in self._finished_producers:
                self.finished = False  # a resumed run: a new attempt of a finished run goes on
            rank = int(body.get("rank", 0) or 0)
            self._producer_rank[producer] = rank
            self._rank_producer[rank] = producer
            world = RankMerger.world_size_of(body)
            if world > 1 and (self._ranks is None or self._ranks.world_size < world):
                self._ranks = RankMerger(world, self.cfg.rank_timeout_s)
            return []
        if kind == HEARTBEAT and self._ranks is not None and producer in self._producer_rank:
            return _rank_points(self._ranks.seen(self._producer_rank[producer], ts_ms), self._epoch_no, ts_ms)
        if kind == RUN_FINISHED and not self.finished:
            self._finished_producers.add(producer)
            if self._ranks is None:
                return self._finish(ts_ms)
            merged = self._ranks.seen(self._producer_rank.get(producer, -1), ts_ms)
            out = _rank_points(merged, self._epoch_no, ts_ms)
            # a rank not finished and not silent (never seen counts as not finished) is still
            # sending: its RunFinished ends the run
            finished = {r for r, p in self._rank_producer.items() if p in self._finished_producers}
            if self._ranks.running(finished):
                return out
            return out + self._finish(ts_ms)
        return []

    def _finish(self, ts_ms: int) -> list[Point]:
        self.finished = True
        out = self._last_stat_points()
        out.extend(Point(*p) for p in self.labels.flush())
        out.extend(self._close_epoch(ts_ms))
        if self._ranks is not None:
            out.extend(_rank_points(self._ranks.flush(), self._epoch_no, ts_ms))
        final, table = final_points(self.cfg, self._sample_totals, self._last_step, self._epoch_no, ts_ms)
        if table is not None:
            self._tables.append(table)
        out.extend(final)
        return out

    def expire(self, now_ms: int) -> list[Point]:
        """Finish a multi-rank run that some ranks finished while the rest fell silent.

        The one wall-clock decision of the merge: a rank that died within the timeout of the
        end sends no event that would tell, so once nothing of the run arrived for the rank
        timeout (``now_ms`` against the last event's time), the run ends with the ranks it has.
        """
        ranks = self._ranks
        if self.finished or ranks is None or not self._finished_producers:
            return []
        last = ranks.last_event_ms()
        if now_ms - last <= ranks.timeout_ms:
            return []
        return self._finish(last)

    def feed_many(self, events: list[Event] | Iterable[Event]) -> tuple[list[Point], list[Column]]:
        """Derived points of many events of this run, and the logged scalars as columns.

        Consecutive Metrics events of one epoch (with no samples, one rank) are taken a column
        per metric, so the per-value work runs in C (``deque.extend``, ``sum``); the result is
        the same as feeding them one by one. The columns are for the alert rules.
        """
        points: list[Point] = []
        columns: list[Column] = []
        events = events if isinstance(events, list) else list(events)
        bodies = [e.body for e in events]
        if (  # the usual record, one stretch: checked with comprehensions, cheaper than the loop below
            bodies
            and self._ranks is None
            and all(e.kind == METRICS for e in events)
            and not any(b["samples"] or b.get("labels") for b in bodies)
            and all(b["epoch"] == bodies[0]["epoch"] for b in bodies)
        ):
            self._stretch(bodies, [e.ts_ms for e in events], points, columns)
            return points, columns
        bodies = []
        stamps: list[int] = []
        for e in events:
            body = e.body
            if e.kind == METRICS and not body["samples"] and not body.get("labels") and self._ranks is None:
                if bodies and body["epoch"] != bodies[-1]["epoch"]:
                    self._stretch(bodies, stamps, points, columns)
                    bodies, stamps = [], []
                bodies.append(body)
                stamps.append(e.ts_ms)
                continue
            if bodies:
                self._stretch(bodies, stamps, points, columns)
                bodies, stamps = [], []
            points.extend(self.feed(e.kind, body, e.ts_ms, e.producer_id))
            if e.kind == METRICS:
                step = body["step"]
                columns.extend(Column(n, [v], [step], [e.ts_ms]) for n, v in body["scalars"].items())
        if bodies:
            self._stretch(bodies, stamps, points, columns)
        return points, columns

    # -- metrics ------------------------------------------------------------------------

    def _stretch(
        self,
        bodies: list[dict[str, Any]],
        stamps: list[int],
        out: list[Point],
        columns: list[Column] | None,
    ) -> None:
        """The scalars of consecutive Metrics events of one epoch, a column per metric."""
        steps = [b["step"] for b in bodies]
        scalars = [b["scalars"] for b in bodies]
        names = list(scalars[0])
        gathered: dict[str, tuple[list[float], list[int] | None]] = {}
        same = set(map(len, scalars)) == {len(names)}  # the usual case: every step logs these names
        if same:
            try:
                gathered = {name: ([d[name] for d in scalars], None) for name in names}
            except KeyError:  # as many names, but other ones
                same = False
        if not same:
            for i, d in enumerate(scalars):
                for name, value in d.items():
                    col = gathered.get(name)
                    if col is None:
                        col = gathered[name] = ([], [])
                    col[0].append(value)
                    col[1].append(i)  # type: ignore[union-attr]
        self._columns(bodies[0]["epoch"], steps, stamps, gathered, out, columns)

    def takes_columns(self, cols: ScalarColumns) -> bool:
        """Whether :meth:`feed_columns` takes these columns; if not, feed their events.

        Not: names that vary between the events, a multi-rank run.
        """
        return self._ranks is None and bool(cols.seqs) and cols.uniform

    def feed_columns(self, cols: ScalarColumns) -> tuple[list[Point], list[Column]]:
        """:meth:`feed_many` of a record's scalars-only events straight from its columns.

        No object per event: name ``j``'s values are a slice of the record's values. Only for
        columns that :meth:`takes_columns`.
        """
        k = len(cols.names)
        epochs = cols.epochs
        points: list[Point] = []
        columns: list[Column] = []
        # a stretch per epoch, as feed_many cuts its events (a record often spans two)
        cuts = [i for i in range(1, len(epochs)) if epochs[i] != epochs[i - 1]]
        for start, end in zip([0, *cuts], [*cuts, len(epochs)], strict=True):
            values = cols.values[start * k : end * k]
            gathered: dict[str, tuple[list[float], list[int] | None]] = {
                name: (values[j::k], None) for j, name in enumerate(cols.names)
            }
            epoch = None if epochs[start] == NO_EPOCH else epochs[start]
            steps, stamps = cols.steps[start:end], cols.ts_ms[start:end]
            self._columns(epoch, steps, stamps, gathered, points, columns)
        return points, columns

    def _columns(
        self,
        epoch: int | None,
        steps: list[int],
        stamps: list[int],
        gathered: dict[str, tuple[list[float], list[int] | None]],
        out: list[Point],
        columns: list[Column] | None,
    ) -> None:
        """Consecutive events of one epoch at ``steps``, their values gathered a column per name.

        ``gathered``: name -> (values, the events' positions that logged it; None for all).
        """
        cfg = self.cfg
        self._last_step = max(self._last_step, max(steps))
        if epoch is not None and self._epoch_no is not None and epoch != self._epoch_no:
            out.extend(self._close_epoch(stamps[0]))
        if epoch is not None:
            if self._epoch is None:
                self._epoch = Epoch()
            self._epoch_no = epoch
        ep = self._epoch
        if ep is not None:
            ep.steps += len(steps)
            ep.last_step = steps[-1]

        whole = len(steps)

        if self._reward.name is None and (bound := self._reward.bind(gathered)):
            self.role_of[bound] = "@reward"
        if self._loss.name is None and (bound := self._loss.bind(gathered)):
            self.role_of[bound] = "@loss"
        throughput = cfg.throughput_aliases
        for name, (values, where) in gathered.items():
            series = self._series.get(name)
            if series is None:
                if self._over(name):
                    continue
                series = self._series[name] = Series(cfg.window, cfg.ema_weight, cfg.trend_window)
            if where is None or len(where) == whole:
                col_steps, col_stamps = steps, stamps
            else:
                col_steps, col_stamps = [steps[i] for i in where], [stamps[i] for i in where]
            self._fold(name, series, values, col_steps, epoch, col_stamps, out)
            if name.endswith(cfg.throughput_suffix) or name in throughput:
                for value, step, ts in zip(values, col_steps, col_stamps, strict=True):
                    self._throughput_points(name, value, step, epoch, ts, out)
            if ep is not None:
                if name == self._reward.name:  # in fixed blocks: not by the batching of records
                    ep.reward.extend(values)
                elif name == self._loss.name:
                    ep.loss.extend(values)
                elif name == cfg.sample_count_metric:
                    ep.counted = _running_sum(ep.counted or 0.0, values)
                for suffix in cfg.epoch_sums:
                    if name.endswith(suffix):
                        ep.sums[suffix] = _running_sum(ep.sums.get(suffix, 0.0), values)
            if columns is not None:
                columns.append(Column(name, values, col_steps, col_stamps))

    def _fold(
        self,
        name: str,
        series: Series,
        values: list[float],
        steps: list[int],
        epoch: int | None,
        stamps: list[int],
        out: list[Point],
    ) -> None:
        """Fold a metric's values into its series; a ``metric_stats`` point every ``smooth_every``.

        Counted over the run, so where the points fall depends on the values alone, not on how
        they were batched into records.
        """
        known = self._smoothed.get(name)
        if known is None:
            known = self._smoothed[name] = (self.cfg.smoothed(name), self.cfg.higher_is_better(name))
        keep, up = known
        stats = self.cfg.stats_of(name) if keep else ()
        if stats and series.counter and self.cfg.detect_counters:  # whole numbers, never falling
            counting = _counting(series.recent.values[-1] if series.recent.values else None, values)
            if counting:
                series.extend(values[:counting])  # into its EMA too: smoothed from any value on
            if counting < len(values):  # the first value that is not: a metric, smoothed from here
                series.counter = False
                self._fold(name, series, values[counting:], steps[counting:], epoch, stamps[counting:], out)
            series.last = (steps[-1], epoch, stamps[-1])
            return
        if not stats:
            series.extend(values, smooth=False)
        elif _COLUMN_STATS.issuperset(stats) and math.isfinite(sum(values)):
            self._fold_finite(name, series, stats, values, steps, epoch, stamps, out)
        else:
            every = self.cfg.smooth_every
            start = 0
            for i in range(every - 1 - series.seen % every, len(values), every):
                series.extend(values[start : i + 1])
                start = i + 1
                self._stat_points(name, series, stats, up, steps[i], epoch, stamps[i], out)
            if start < len(values):
                series.extend(values[start:])
        series.last = (steps[-1], epoch, stamps[-1])

    def _fold_finite(
        self,
        name: str,
        series: Series,
        stats: tuple[str, ...],
        values: list[float],
        steps: list[int],
        epoch: int | None,
        stamps: list[int],
        out: list[Point],
    ) -> None:
        """:meth:`_fold` of finite values for ``recent_mean`` and ``ema``, a column at a time.

        The same bits: each point's window is read from the column, no state updated per point.
        """
        every = self.cfg.smooth_every
        recent, ema = series.recent, series.ema
        tail = list(recent.values)
        joined, off, size = tail + values, len(tail), recent.size
        w, c = ema.weight, 1 - ema.weight
        last, n = ema._last, ema._n
        start = 0
        at = range(every - 1 - series.seen % every, len(values), every)
        smoothed = []
        for i in at:
            for x in values[start : i + 1]:  # as EMA.add, value by value
                last = last * w + c * x
            n += i + 1 - start
            start = i + 1
            smoothed.append(last / (1 - w**n))  # EMA.value
        k = len(at)
        if not k:
            stats = ()
        at_steps, at_stamps, same = [steps[i] for i in at], [stamps[i] for i in at], repeat(epoch, k)
        for stat in stats:  # a statistic's points together: the rules take them as a column
            if stat == "ema":
                found = smoothed
            else:  # Window.mean of the last ``size`` values up to each point's
                windows = (joined[max(0, off + i + 1 - size) : off + i + 1] for i in at)
                found = [sum(x) / len(x) for x in windows]
            derived, kind = repeat(f"{name}_{stat}", k), repeat(STATISTICS[stat].kind, k)
            columns = zip(derived, repeat(name, k), kind, at_steps, same, found, at_stamps, strict=True)
            out.extend(map(point_of, columns))
            same = repeat(epoch, k)
        for x in values[start:]:
            last = last * w + c * x
        ema._last, ema._n = last, n + len(values) - start
        series.count += len(values)
        recent.values.extend(values)
        series.trend.values.extend(values)

    def _stat_points(
        self,
        name: str,
        series: Series,
        stats: tuple[str, ...],
        up: bool,
        step: int,
        epoch: int | None,
        ts: int,
        out: list[Point],
    ) -> None:
        for stat in stats:
            statistic = STATISTICS[stat]
            value = statistic.value(series, up)
            out.append(Point(f"{name}_{stat}", name, statistic.kind, step, epoch, value, ts))

    def _last_stat_points(self) -> list[Point]:
        """At the run's end: a ``metric_stats`` point at the last value of each metric.

        For the metrics whose last values fell after their last point (fewer than
        ``smooth_every`` since).
        """
        out: list[Point] = []
        if not self.cfg.metric_stats:
            return out
        every = self.cfg.smooth_every
        for name, series in self._series.items():
            keep, up = self._smoothed.get(name, (False, True))
            stats = self.cfg.stats_of(name) if keep else ()
            counting = series.counter and self.cfg.detect_counters
            if series.seen % every and series.last is not None and stats and not counting:
                self._stat_points(name, series, stats, up, *series.last, out)
        return out

    def _samples(self, body: dict[str, Any], ts: int, out: list[Point]) -> None:
        """Per-sample arrays of one Metrics event: batch statistics, recent means, totals."""
        cfg = self.cfg
        step, epoch = body["step"], body["epoch"]
        ep = self._epoch

        def point(name: str, source: str, kind: str, value: float) -> None:
            out.append(Point(name, source, kind, step, epoch, value, ts))

        if self._reward_samples.name is None and (bound := self._reward_samples.bind(body["samples"])):
            self.role_of[cfg.sample_aliases.get(bound, {}).get("mean", f"{bound}_mean")] = "@reward"
        total_means: list[float] = []
        batch_size = 0  # one batch logs several sample series of the same samples: count it once
        for name, values in body["samples"].items():
            if name not in self._sample_windows and self._over(name):
                continue
            batch = Welford()
            batch.extend(values)
            aliases = cfg.sample_aliases.get(name, {})
            stats = {
                "mean": batch.mean,
                "std": batch.std,
                "min": batch.min,
                "max": batch.max,
                "variance": batch.variance,
            }
            if batch.count:
                for stat, value in stats.items():
                    point(aliases.get(stat, f"{name}_{stat}"), name, stat, value)
            window = self._sample_windows.get(name)
            if window is None:
                window = self._sample_windows[name] = Window(cfg.window)
                self._sample_totals[name] = Welford()
            window.extend(values)
            self._sample_totals[name].extend(values)
            if len(window):
                point(aliases.get("recent_mean", f"{name}_recent_mean"), name, "rolling_mean", window.mean())
            hist = aliases.get("hist", f"{name}_hist")
            made = sample_histogram(cfg, self._hist_recent, self._hist_step, name, values, hist, step, ts)
            if made is not None:
                self._histograms.append(made)
            if name.startswith("rewards/") and batch.count:
                total_means.append(batch.mean)
            batch_size = max(batch_size, batch.count + batch.nonfinite)
            if batch.count and name == self._reward_samples.name:
                self._reward_steps.trend.add(batch.mean)  # the reward's per-step value, for its trend
                if ep is not None:
                    ep.reward_samples.add(batch.mean)
        if total_means:
            point("rewards/total_mean", "rewards/*", "sum_of_means", fsum(total_means))
        if ep is not None:
            ep.samples += batch_size

    def take_objects(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Derived histograms and tables made since the last call (AggregateBatch records)."""
        out = self._histograms, self._tables
        self._histograms, self._tables = [], []
        return out

    def _throughput_points(
        self, name: str, value: float, step: int, epoch: int | None, ts: int, out: list[Point]
    ) -> None:
        suffix = self.cfg.throughput_suffix
        avg, recent = self._throughput.setdefault(name, (Welford(), Window(self.cfg.p99_window)))
        avg.add(value)
        recent.add(value)
        if name.endswith(suffix):  # seed 004: Generation_TokensPerSec -> Generation_AvgTokensPerSec
            stem = name[: -len(suffix)]
            mean_name, p99_name = f"{stem}Avg{suffix}", f"{stem}P99{suffix}"
        else:  # a catalog name: seed 002's suffix pattern
            mean_name, p99_name = f"{name}_avg", f"{name}_p99"
        out.append(Point(mean_name, name, "mean", step, epoch, avg.mean, ts))
        out.append(Point(p99_name, name, "p99", step, epoch, recent.quantile(0.99), ts))

    # -- epochs and the end ---------------------------------------------------------------

    def _close_epoch(self, ts: int) -> list[Point]:
        ep, number = self._epoch, self._epoch_no
        if ep is None or number is None or ep.steps == 0:
            return []
        self._epoch = Epoch()
        roles = Roles(self._reward, self._reward_samples, self._reward_steps, self._loss, self._series.get)
        return epoch_points(ep, number, ts, self.cfg, roles, self._previous)


def _rank_points(merged: list[tuple[str, int, float]], epoch: int | None, ts_ms: int) -> list[Point]:
    return [Point(n, "ranks", "rank_merge", s, epoch, v, ts_ms) for n, s, v in merged]


def _counting(last: float | None, values: list[float]) -> int:
    """How many of ``values`` keep a counter counting: whole numbers, none below the one before."""
    try:  # the usual answer, all of them, checked at C speed
        if (
            (last is None or values[0] >= last)
            and all(map(float.is_integer, values))
            and all(map(operator.le, values, islice(values, 1, None)))
        ):
            return len(values)
    except TypeError:  # an int among them (a test's body): the loop below takes it
        pass
    for k, x in enumerate(values):
        if not (math.isfinite(x) and x.is_integer()) or (last is not None and x < last):
            return k
        last = x
    return len(values)


#: the metric_stats :meth:`RunDeriver._fold_finite` computes a column at a time
_COLUMN_STATS = frozenset({"recent_mean", "ema"})


def _running_sum(total: float, values: list[float]) -> float:
    """``total`` plus the finite ``values``, added one by one (the same bits in any batching)."""
    for v in values:
        if math.isfinite(v):
            total += v
    return total


def derive_all(
    events: Iterable[tuple[str, dict[str, Any], int]], run_id: str = "run", cfg: StreamConfig | None = None
) -> list[Point]:
    """Every point one run's events derive (for back-tests and tests)."""
    deriver = RunDeriver(run_id, cfg)
    out = []
    for kind, body, ts in events:
        out.extend(deriver.feed(kind, body, ts))
    return out
