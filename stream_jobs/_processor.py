"""The whole stream job as one plain object: events in, derived points and alert transitions out.

The Faust agent is a thin adapter around it; tests and back-tests drive it directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from schemas import METRICS, RUN_FINISHED, Deduper, Event

from ._alerts import AlertEngine
from ._config import StreamConfig
from ._derive import Point, RunDeriver
from ._rules import Rule


@dataclasses.dataclass
class Output:
    """What one batch of events produced."""

    points: dict[str, list[Point]] = dataclasses.field(default_factory=dict)
    alerts: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class StreamProcessor:
    """Derivation and alerting for every run; drops duplicate events by (producer_id, seq)."""

    def __init__(self, cfg: StreamConfig | None = None, rules: Iterable[Rule] = ()) -> None:
        self.cfg = cfg or StreamConfig()
        self.alerts = AlertEngine(list(rules))
        self.dedupe = Deduper()
        self._runs: dict[str, RunDeriver] = {}
        self.events = 0

    def process(self, events: Iterable[Event]) -> Output:
        """Feed events (one producer's in seq order); return what they derived and fired."""
        out = Output()
        observe = self.alerts.observe
        touched: dict[str, RunDeriver] = {}
        for e in events:
            if not self.dedupe.is_new(e.producer_id, e.seq):
                continue
            self.events += 1
            run = e.run_id
            fired = self.alerts.seen(run, e.ts_ms, finished=e.kind == RUN_FINISHED)
            if fired:
                out.alerts.extend(fired)
            deriver = self._runs.get(run)
            if deriver is None:
                deriver = self._runs[run] = RunDeriver(run, self.cfg)
            touched[run] = deriver
            points = deriver.feed(e.kind, e.body, e.ts_ms)
            if e.kind == METRICS:
                step = e.body["step"]
                for name, value in e.body["scalars"].items():
                    fired = observe(run, name, value, step, e.ts_ms)
                    if fired:
                        out.alerts.extend(fired)
            self._emit(out, run, points)
        for run, deriver in touched.items():
            self._emit(out, run, deriver.rolling_points())
        return out

    def _emit(self, out: Output, run: str, points: list[Point]) -> None:
        """Add derived points to the output; rules watch derived series like logged ones."""
        if not points:
            return
        for p in points:
            fired = self.alerts.observe(run, p.name, p.value, p.step, p.ts_ms)
            if fired:
                out.alerts.extend(fired)
        out.points.setdefault(run, []).extend(points)

    def tick(self, now_ms: int) -> list[dict[str, Any]]:
        """Time-driven rules (a stalled run); call about once a second."""
        return self.alerts.check_absent(now_ms)
