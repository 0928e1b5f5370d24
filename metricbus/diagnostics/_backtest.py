"""Back-tests: what alert rules raise on an archived run, fed to the stream worker as live."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from metricbus.schemas import Event, MetricbusError, Settings


def backtest(
    settings: Settings, rules_path: Path, run_id: str, config_path: Path | None = None
) -> list[dict[str, Any]]:
    """Alerts ``rules_path`` would have raised on an archived run, in order (read a chunk at a time)."""
    events = (e for chunk in archived(settings, run_id) for e in chunk)
    return rule_alerts(events, rules_path, config_path)


def archived(settings: Settings, run: str, derived: bool = False) -> Iterator[list[Any]]:
    """A run's events from the archive, a chunk at a time; a clear error when it has none.

    A long run is never held as events at once (a 200,000-step run's report held 1.3 GB).
    """
    from metricbus.schemas import check_run_id
    from metricbus.sinks import iter_events

    found = False
    try:
        for chunk in iter_events(settings.archive_dir, check_run_id(run), derived=derived):
            found = found or bool(chunk)
            yield chunk
    except (FileNotFoundError, ValueError):  # no such run, or no usable run id
        if found:
            raise
    if not found:
        raise MetricbusError(f"run {run!r} is not in the archive at {settings.archive_dir}")


def rule_alerts(
    events: Iterable[Event], rules_path: Path, config_path: Path | None = None
) -> list[dict[str, Any]]:
    """Alerts the rules raise on a run's logged events, fed as the live worker takes them."""
    alerts: list[dict[str, Any]] = []
    for _ in raising(events, alerts, rules_path, config_path):
        pass
    return alerts


def raising(
    events: Iterable[Event], alerts: list[dict[str, Any]], rules_path: Path, config_path: Path | None = None
) -> Iterator[Event]:
    """Yield ``events``, adding to ``alerts`` what the rules raise on them (in records of ~100, as live).

    For a reader that reads a run once for more than the alerts (``metricbus report``): the
    last alerts are added when the events run out, so read it to its end.
    """
    from metricbus.stream_jobs import StreamProcessor, load_config, load_rules

    cfg = load_config(config_path) if config_path is not None else None
    processor = StreamProcessor(cfg, rules=load_rules(rules_path))
    batch: list[Event] = []
    for e in events:
        yield e
        batch.append(e)
        if len(batch) == 100:
            alerts.extend(processor.process(batch).alerts)
            batch = []
    if batch:
        alerts.extend(processor.process(batch).alerts)
