"""Runs the topics no longer hold, from the archive (the durable record): rows and run pages.

The embedded broker is memory-only: after ``metricbus up`` restarts, the topics hold only new
runs, so the dashboard lists every archived run beside the live ones and draws an archived
run's page from its archived events, folded exactly as the live board folds the topics (the
same bounded points per series), with the alerts that the stack's rules raise on them (the
alerts topic is no more durable than the events topic; the rules over the archive give the
alerts the live worker raised, as `metricbus backtest` shows). Memory stays bounded: the runs
table keeps one summary row a run (no points), and only the last few run pages asked for are
kept.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from metricbus.schemas import DERIVED_PRODUCER, MetricbusError, Settings, check_run_id

from ._board import MAX_COLUMNS, MAX_POINTS, RunBoard, flat_params

log = logging.getLogger("metricbus.board")

#: how often the list of archived runs is read again (seconds)
REFRESH_S = 30.0
#: archived run pages kept, the most recently asked for
PAGES_KEPT = 4
#: seconds a refresh may spend deriving archived runs' alerts (the rest wait for the next one)
ALERTS_BUDGET_S = 5.0
#: a run not finished whose last event is this recent is live: the topics hold its alerts
LIVE_FOR_S = 300.0


@dataclasses.dataclass(frozen=True)
class RuleFiles:
    """The alert rules (and the stream config their series follow) run over archived runs.

    The ones the stack's worker runs live.
    """

    rules: Path
    config: Path | None = None

    @classmethod
    def of(cls, rules: str | None = None, config: str | None = None) -> RuleFiles:
        """The files given, else the seed rule pack; checked now (a bad file is a clear error)."""
        from metricbus.stream_jobs import DEFAULT_RULES, load_config, load_rules

        files = cls(Path(rules) if rules else DEFAULT_RULES, Path(config) if config else None)
        load_rules(files.rules)
        if files.config is not None:
            load_config(files.config)
        return files


class ArchivedRuns:
    """The archive's runs as the dashboard shows them. Thread-safe; :meth:`start` refreshes rows."""

    def __init__(
        self, settings: Settings, refresh_s: float = REFRESH_S, rules: RuleFiles | None = None
    ) -> None:
        self.settings = settings
        self.rules = rules or RuleFiles.of()
        self.refresh_s = refresh_s
        self._rows: dict[str, dict[str, Any]] = {}
        self._read: dict[str, tuple[Any, dict[str, Any]]] = {}  #: run_rows' cache
        self._listing = threading.Lock()
        self._pages: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: set once the archive's runs were listed (the first listing can take seconds)
        self.listed = threading.Event()
        #: run -> (its files' stamp, its alerts as the board's rows), newest runs derived first
        self._alerts: dict[str, tuple[Any, list[dict[str, Any]]]] = {}
        #: run -> the last value of each logged scalar (read with its alerts)
        self._last: dict[str, dict[str, float | None]] = {}
        #: archived runs whose alerts are not derived yet
        self.alerts_pending = 0

    def start(self) -> ArchivedRuns:
        self._thread = threading.Thread(target=self._loop, name="metricbus-archived", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.refresh_s)

    def run_rows(self) -> list[dict[str, Any]]:
        """``diagnostics._runs.run_rows`` of the archive now, each unchanged run from the last read.

        A run whose files did not change is not read again (200 runs: 1.5 s the first time,
        10 ms after).
        """
        from metricbus.diagnostics._runs import run_rows

        with self._listing:  # one listing at a time keeps the cache whole
            return run_rows(self.settings.archive_dir, cache=self._read)

    def refresh(self) -> None:
        """List the archive's runs again (a row each: no points)."""
        try:
            rows = self.run_rows()
        except (OSError, ValueError) as exc:
            log.warning("archived runs: cannot list %s (%s)", self.settings.archive_dir, exc)
            return
        now = time.time() * 1000
        table = {r["run_id"]: _row(r, now) for r in rows}
        with self._lock:
            self._rows = table
        self.listed.set()
        self._derive_alerts(rows, now)

    def _derive_alerts(self, rows: list[dict[str, Any]], now_ms: float) -> None:
        """Derive the alerts of archived runs whose files changed, newest first, within the budget.

        A live run is left to the topics (its files change at every flush).
        """
        deadline = time.monotonic() + ALERTS_BUDGET_S
        with self._listing:
            stamps = {run_id: kept[0] for run_id, kept in self._read.items()}
        todo = []
        for row in sorted(rows, key=lambda r: -(r["last_ts_ms"] or 0)):
            live = not row["finished"] and now_ms - (row["last_ts_ms"] or 0) < LIVE_FOR_S * 1000
            kept = self._alerts.get(row["run_id"])
            if not live and (kept is None or kept[0] != stamps.get(row["run_id"])):
                todo.append(row["run_id"])
        done = 0
        for run_id in todo:
            if time.monotonic() > deadline or self._stop.is_set():
                break
            read = read_run(self.settings, run_id, self.rules)
            if read is not None:
                with self._lock:
                    self._alerts[run_id] = (stamps.get(run_id), read[0])
                    self._last[run_id] = read[1]
            done += 1
        with self._lock:
            for gone in set(self._alerts) - {r["run_id"] for r in rows}:
                del self._alerts[gone]
                self._last.pop(gone, None)
        self.alerts_pending = len(todo) - done

    def alerts(self) -> list[dict[str, Any]]:
        """The archived runs' alerts derived so far: the board's alert rows, with ``run_id``."""
        with self._lock:
            return [a for _, derived in self._alerts.values() for a in derived]

    def rows(self, columns: bool = False) -> dict[str, dict[str, Any]]:
        """Run id -> its runs-table row, in the live board's shape (``columns``: RunView.summary)."""
        with self._lock:
            if not columns:
                return {run_id: _slim(row) for run_id, row in self._rows.items()}
            return {run_id: {**row, "last": self._last.get(run_id, {})} for run_id, row in self._rows.items()}

    def holds(self, run_id: str) -> bool:
        """Whether the archive has rows of ``run_id`` (looked up on disk, not in the listing)."""
        try:
            run_id = check_run_id(run_id)
        except MetricbusError:
            return False
        return any(self.settings.archive_dir.glob(f"project=*/run={run_id}/"))

    def page(self, run_id: str) -> dict[str, Any] | None:
        """The run's page from its archived events (logged and derived), as the live board draws it."""
        with self._lock:
            page = self._pages.get(run_id)
            if page is not None:
                self._pages.move_to_end(run_id)
                return page
        if not self.holds(run_id):
            return None
        page = fold(self.settings, run_id, self.rules)
        if page is None:
            return None
        with self._lock:
            self._pages[run_id] = page
            while len(self._pages) > PAGES_KEPT:
                self._pages.popitem(last=False)
        return page


def fold(settings: Settings, run_id: str, rules: RuleFiles) -> dict[str, Any] | None:
    """The run's page: its archived events folded a chunk at a time into a board's bounded view.

    With the alerts ``rules`` raise on its logged events (one read of the archive for both).
    """
    from metricbus.diagnostics._backtest import raising
    from metricbus.sinks import iter_events

    board = RunBoard(settings)
    found = False

    def logged() -> Iterator[Any]:
        nonlocal found
        for chunk in iter_events(settings.archive_dir, run_id, derived=True):
            found = found or bool(chunk)
            board.fold(chunk)
            yield from (e for e in chunk if e.producer_id != DERIVED_PRODUCER)

    alerts: list[dict[str, Any]] = []
    try:
        for _ in raising(logged(), alerts, rules.rules, rules.config):
            pass
    except (OSError, ValueError) as exc:
        log.warning("archived run %s: cannot read it (%s)", run_id, exc)
        return None
    if not found:
        return None
    board.fold((), alerts)
    detail = board.run(run_id)
    if detail is not None:
        detail["archived"] = True  # the page says it is drawn from the archive
        detail["max_points"] = MAX_POINTS
    return detail


def read_run(
    settings: Settings, run_id: str, rules: RuleFiles
) -> tuple[list[dict[str, Any]], dict[str, float | None]] | None:
    """An archived run read once: its alerts and the last value of each scalar it logged.

    The alerts are those ``rules`` raise on it, as the board's rows; a NaN last value is None.
    None when the run cannot be read.
    """
    import math

    from metricbus.diagnostics._backtest import archived, raising
    from metricbus.schemas import METRICS

    last: dict[str, float | None] = {}
    alerts: list[dict[str, Any]] = []

    def logged() -> Iterator[Any]:
        for chunk in archived(settings, run_id):
            for e in chunk:
                if e.kind == METRICS:
                    for name, value in (e.body.get("scalars") or {}).items():
                        if name in last or len(last) < MAX_COLUMNS:
                            last[name] = value if math.isfinite(value) else None
                yield e

    board = RunBoard(settings)
    try:
        for _ in raising(logged(), alerts, rules.rules, rules.config):
            pass
        board.fold((), alerts)
    except (OSError, ValueError, MetricbusError) as exc:
        log.warning("archived run %s: cannot derive its alerts (%s)", run_id, exc)
        return None
    return board.alerts(), last


def _slim(row: dict[str, Any]) -> dict[str, Any]:
    """A row without its columns (what ``status`` and the overview stream carry)."""
    return {k: v for k, v in row.items() if k not in ("params", "final")}


def _row(row: dict[str, Any], now_ms: float) -> dict[str, Any]:
    """A runs-table row of an archived run (what ``RunView.summary`` gives a live one)."""
    last = row["last_ts_ms"]
    state = row["state"] if row["finished"] else "stopped"
    if row["finished"] and state in ("", "success", "ok"):
        state = "finished"
    return {
        "run_id": row["run_id"],
        "project": row["project"],
        "name": row["name"],
        "host": "",
        "state": state,
        "ranks": [0],
        "world_size": 1,
        "last_step": row["last_step"],
        "events": row["events"],
        "events_per_s": 0.0,
        "since_last_event_s": None if last is None else round(max(0.0, now_ms - last) / 1000, 1),
        "started_ms": row["first_ts_ms"],
        "firing": [],
        "archived": True,
        "params": flat_params(row["config"]),
        "final": {k: v for k, v in (row["summary"] or {}).items() if isinstance(v, (int, float, str))},
    }
