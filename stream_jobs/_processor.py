"""The whole stream job as one plain object: events in, derived points and alert transitions out.

The Faust agent is a thin adapter around it; tests and back-tests drive it directly.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Iterable
from typing import Any

from metricbus.schemas import (
    RUN_FINISHED,
    RUN_STARTED,
    Deduper,
    Event,
    ScalarColumns,
    all_events,
    derived_event_count,
)

from ._alerts import AlertEngine
from ._config import StreamConfig
from ._derive import Column, Point, RunDeriver
from ._rules import Rule

log = logging.getLogger("metricbus.stream")

_RUN_AND_PRODUCER = operator.attrgetter("run_id", "producer_id")
_SEQ = operator.attrgetter("seq")
_STEP_EPOCH = operator.itemgetter(3, 4)  # a Point's (step, epoch)


@dataclasses.dataclass
class Output:
    """What one batch of events produced."""

    points: dict[str, list[Point]] = dataclasses.field(default_factory=dict)
    alerts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: run -> derived histograms / tables (AggregateBatch ``histograms`` / ``tables`` records)
    histograms: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    #: run -> seq of the first derived event of its record (the derived identity)
    first_seq: dict[str, int] = dataclasses.field(default_factory=dict)
    #: runs whose RunFinished these events held: their derived series are complete
    closing: set[str] = dataclasses.field(default_factory=set)

    def aggregate_batches(self) -> list[dict[str, Any]]:
        """One AggregateBatch record per run with anything derived (or closing)."""
        runs = dict.fromkeys([*self.points, *self.histograms, *self.tables, *sorted(self.closing)])
        return [
            {
                "run_id": run,
                "points": self.points.get(run, []),
                "histograms": self.histograms.get(run, []),
                "tables": self.tables.get(run, []),
                "first_seq": self.first_seq.get(run, 0),
                "closes_run": run in self.closing,
            }
            for run in runs
        ]


#: Finished runs whose derivation state is kept (the most recently finished): a run resumed
#: after this many others finished on its partition derives its windows afresh. Measured: a
#: finished run of 21 metrics and a samples series holds ~120 kB, pickled ~20 kB.
FINISHED_KEPT = 64
#: Runs whose derivation state is kept at all, the most recently active: a run killed without
#: its RunFinished never finishes, and is forgotten once this many others logged after it.
RUNS_KEPT = 1024


class StreamProcessor:
    """Derivation and alerting for every run; drops duplicate events by (producer_id, seq)."""

    def __init__(self, cfg: StreamConfig | None = None, rules: Iterable[Rule] = ()) -> None:
        self.cfg = cfg or StreamConfig()
        self.alerts = AlertEngine(list(rules))
        self._timed = {r.name for r in self.alerts.rules if r.kind == "absent"}
        self.dedupe = Deduper()
        self._runs: dict[str, RunDeriver] = {}  #: the least recently active first (RUNS_KEPT)
        #: finished runs, the most recently finished last (see FINISHED_KEPT)
        self._finished: dict[str, None] = {}
        #: run -> seq of its next derived event: derived output is a function of the input
        #: records, so a worker that rebuilt its state numbers re-derived events the same way
        self._out_seq: dict[str, int] = {}
        #: run -> seq of its next alert derived from its events (Alert.seq), for the same reason
        self._alert_seq: dict[str, int] = {}
        self.events = 0
        #: run -> its series (RunDeriver.series) when last counted; their sum is kept within
        #: cfg.max_partition_series by forgetting the least recently active runs
        self._series_of: dict[str, int] = {}
        self._series_total = 0
        #: runs whose derivation state was forgotten to keep within cfg.max_partition_series
        self.forgotten_for_memory = 0

    def process(self, events: Iterable[Event]) -> Output:
        """Feed events (one producer's in seq order); return what they derived and fired."""
        out = Output()
        for run, stretch in self._new_by_run(events).items():
            kinds = {e.kind for e in stretch}
            out.alerts.extend(
                self.alerts.seen(
                    run, max([e.ts_ms for e in stretch]), RUN_FINISHED in kinds, RUN_STARTED in kinds
                )
            )
            deriver = self._deriver(run)
            points, columns = deriver.feed_many(stretch)
            self._derived(out, run, deriver, points, columns, closes=RUN_FINISHED in kinds)
            if deriver.finished and RUN_FINISHED in kinds:  # after the run's last derived points
                out.alerts.extend(self.alerts.end(run, max(e.ts_ms for e in stretch), deriver.last_step))
        return self._ordered(out)

    def process_record(self, events: list[Event], columns: ScalarColumns | None) -> Output:
        """:meth:`process` of one input record as :func:`schemas.decode_record` gives it.

        A record of columns alone (what a training loop sends most) is taken a column at a time,
        with no object per event, when its seqs are one new contiguous range and its run takes
        columns (:meth:`RunDeriver.takes_columns`); the same output as :meth:`process` of its
        events (tests/unit/test_columns.py). Anything else goes event by event.
        """
        if columns is None:
            return self.process(events)
        if events:
            return self.process(all_events(events, columns))
        seqs = columns.seqs
        run = columns.run_id
        deriver = self._deriver(run)
        if not (deriver.takes_columns(columns) and self._new_range(columns.producer_id, seqs)):
            return self.process(columns.events())
        out = Output()
        out.alerts.extend(self.alerts.seen(run, max(columns.ts_ms), False, False))
        points, derived = deriver.feed_columns(columns)
        self._derived(out, run, deriver, points, derived, closes=False)
        return self._ordered(out)

    def _deriver(self, run: str) -> RunDeriver:
        deriver = self._runs.pop(run, None)
        if deriver is None:
            deriver = RunDeriver(run, self.cfg)
            while len(self._runs) >= RUNS_KEPT:  # the least recently active first
                self._forget(next(iter(self._runs)))
        self._runs[run] = deriver  # the most recently active last
        return deriver

    def _derived(
        self,
        out: Output,
        run: str,
        deriver: RunDeriver,
        points: list[Point],
        columns: list[Column],
        closes: bool,
    ) -> None:
        """Rules over what a run's events logged and derived; ``out`` gets it all, numbered."""
        roles = deriver.role_of
        for c in columns:
            fired = self.alerts.observe_many(run, c.name, c.values, c.steps, c.ts_ms, roles.get(c.name))
            if fired:
                out.alerts.extend(fired)
        self._emit(out, run, points, roles)
        histograms, tables = deriver.take_objects()
        if histograms:
            out.histograms.setdefault(run, []).extend(histograms)
        if tables:
            out.tables.setdefault(run, []).extend(tables)
        if deriver.finished and closes:
            out.closing.add(run)
        self._number_derived(out, run)
        self._count_series(run, deriver)
        if deriver.finished:
            self._retire(run)

    def _count_series(self, run: str, deriver: RunDeriver) -> None:
        """Count ``run``'s series; past cfg.max_partition_series forget the least recently active runs.

        Each series holds ~1-2.5 kB (a logged name's windows, a label series): within a run
        they are bounded by ``max_series``, and runs by RUNS_KEPT, but 1,024 runs of 10,000
        names each would be ~20 GB. A forgotten run that logs again derives its windows afresh (as
        one forgotten for RUNS_KEPT does; see :meth:`_forget`).
        """
        n = deriver.series()
        self._series_total += n - self._series_of.get(run, 0)
        self._series_of[run] = n
        while self._series_total > self.cfg.max_partition_series and next(iter(self._runs)) != run:
            oldest = next(iter(self._runs))
            self._forget(oldest)
            self.forgotten_for_memory += 1
            if self.forgotten_for_memory % 100 == 1:
                log.warning(
                    "the runs of a partition derive from more than %d series "
                    "(max_partition_series): the state of run %s, the least recently active, is "
                    "forgotten (%d runs so far; each derives afresh if it logs again)",
                    self.cfg.max_partition_series,
                    oldest,
                    self.forgotten_for_memory,
                )

    def _forget(self, run: str) -> None:
        """Drop ``run``'s derivation state, and of a finished run its rules' state too.

        Its seqs and dedupe stay (a re-delivered event is still dropped, a resumed run's
        derived events numbered after what went before); so do a live run's rules' states,
        whose 'absent' rule still watches it.
        """
        if self._runs.pop(run).finished:
            self.alerts.forget(run)
        self._finished.pop(run, None)
        self._series_total -= self._series_of.pop(run, 0)

    def _retire(self, run: str) -> None:
        """Note ``run`` finished; forget the derivation state of the oldest beyond FINISHED_KEPT.

        Its seqs (derived and alerts) and what the dedupe knows stay: a late or resumed event
        of a forgotten run is derived afresh, numbered after what went before (:meth:`_forget`).
        """
        self._finished.pop(run, None)
        self._finished[run] = None
        while len(self._finished) > FINISHED_KEPT:
            oldest = next(iter(self._finished))
            del self._finished[oldest]
            deriver = self._runs.get(oldest)
            if deriver is not None and deriver.finished:  # not resumed since
                self._forget(oldest)

    def _ordered(self, out: Output) -> Output:
        if len(out.alerts) > 1:  # rules ran a column at a time: put the alerts back in event order
            out.alerts.sort(key=lambda a: (a["ts_ms"], -1 if a["step"] is None else a["step"]))
        self._number(out.alerts)
        return out

    def _number_derived(self, out: Output, run: str) -> None:
        """Give the run's derived events in ``out`` their seqs (the derived identity)."""
        count = derived_event_count(
            map(_STEP_EPOCH, out.points.get(run, ())),
            out.histograms.get(run, ()),
            out.tables.get(run, ()),
        )
        if count or run in out.closing:
            out.first_seq[run] = self._out_seq.get(run, 0)
            self._out_seq[run] = out.first_seq[run] + count

    def _number(self, alerts: list[dict[str, Any]]) -> None:
        """Give each alert its identity: per run, in order, for alerts that follow from events alone.

        An 'absent' rule's alerts depend on the wall clock: they get -1, so that a restarted
        worker that sees time differently does not shift the others.
        """
        timed = self._timed
        for alert in alerts:
            run = alert["run_id"]
            if alert["rule"] in timed:
                alert["seq"] = -1
                continue
            alert["seq"] = self._alert_seq.get(run, 0)
            self._alert_seq[run] = alert["seq"] + 1

    def _new_range(self, producer_id: str, seqs: list[int]) -> bool:
        """Whether ``seqs`` are one run of consecutive seqs, none seen before.

        If so they are all recorded as seen and counted; False changes nothing.
        """
        if not self.dedupe.add_run(producer_id, seqs):
            return False
        self.events += len(seqs)
        return True

    def _new_by_run(self, events: Iterable[Event]) -> dict[str, list[Event]]:
        """The events not seen before, by run, in order.

        One input record is one producer's run of consecutive seqs: that is checked and
        recorded as one interval; anything else goes event by event.
        """
        batch = events if isinstance(events, list) else list(events)
        if not batch:
            return {}
        first = batch[0]
        if len(set(map(_RUN_AND_PRODUCER, batch))) == 1 and self._new_range(
            first.producer_id, list(map(_SEQ, batch))
        ):
            return {first.run_id: batch}
        by_run: dict[str, list[Event]] = {}
        for e in batch:
            if self.dedupe.is_new(e.producer_id, e.seq):
                self.events += 1
                by_run.setdefault(e.run_id, []).append(e)
        return by_run

    def _emit(self, out: Output, run: str, points: list[Point], roles: dict[str, str]) -> None:
        """Add derived points to the output; rules watch derived series like logged ones."""
        if not points:
            return
        alerts = self.alerts
        i, n = 0, len(points)
        while i < n:  # in order; a stretch of one series' points at once (a statistic's column)
            name = points[i].name
            j = i + 1
            while j < n and points[j].name == name:
                j += 1
            role = roles.get(name)  # e.g. the mean of per-sample rewards is the run's reward
            if alerts.watches(name, role):
                stretch = points[i:j]
                values, steps, stamps = (
                    [p.value for p in stretch],
                    [p.step for p in stretch],
                    [p.ts_ms for p in stretch],
                )
                fired = alerts.observe_many(run, name, values, steps, stamps, role)
                if fired:
                    out.alerts.extend(fired)
            i = j
        out.points.setdefault(run, []).extend(points)

    def state(self) -> dict[str, Any]:
        """Everything learned from the events so far (for checkpoints); not the rules or config."""
        return {
            "runs": self._runs,
            "finished": self._finished,
            "alerts": self.alerts.state(),
            "dedupe": self.dedupe,
            "events": self.events,
            "out_seq": self._out_seq,
            "alert_seq": self._alert_seq,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` of an earlier processor, with this one's rules and config."""
        self._runs = state["runs"]
        self._finished = state["finished"]
        for deriver in self._runs.values():
            deriver.cfg = self.cfg
        self._series_of = {run: deriver.series() for run, deriver in self._runs.items()}
        self._series_total = sum(self._series_of.values())
        self.alerts.load_state(state["alerts"])
        self.dedupe = state["dedupe"]
        self.events = state["events"]
        self._out_seq = state["out_seq"]
        self._alert_seq = state["alert_seq"]

    def tick(self, now_ms: int) -> Output:
        """What time alone decides; call about once a second.

        Time-driven rules (a stalled run; alerts without identity) and multi-rank runs whose
        unfinished ranks fell silent (see ``RunDeriver.expire``).
        """
        out = Output(alerts=self.alerts.check_absent(now_ms))
        self._number(out.alerts)
        finished: list[str] = []
        for run, deriver in self._runs.items():
            if deriver.finished:
                continue
            points = deriver.expire(now_ms)
            if deriver.finished:
                finished.append(run)
                self._emit(out, run, points, deriver.role_of)
                ended = self.alerts.end(run, now_ms, deriver.last_step)
                self._number(ended)
                out.alerts.extend(ended)
                histograms, tables = deriver.take_objects()
                if histograms:
                    out.histograms[run] = histograms
                if tables:
                    out.tables[run] = tables
                out.closing.add(run)
                self._number_derived(out, run)
        for run in finished:
            self._retire(run)
        return out
