"""The archive as pandas DataFrames, for data work: ``metricbus.history`` and ``metricbus.runs``.

Reads the Parquet archive only (no broker): every run ever logged, logged and derived series.
pandas is the ``analysis`` extra; a missing pandas fails with its pip line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metricbus.diagnostics._series import labelled
from metricbus.schemas import (
    CONFIG_UPDATE,
    RUN_FINISHED,
    RUN_STARTED,
    MetricbusError,
    Settings,
    check_run_id,
    run_config,
)


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise MetricbusError("metricbus.history() needs pandas: pip install 'metricbus[analysis]'") from None
    return pandas


def _archive(settings: Settings | None) -> Path:
    return (settings or Settings.from_env()).archive_dir


def history(
    run: str,
    metrics: Sequence[str] | None = None,
    derived: bool = True,
    wide: bool = True,
    settings: Settings | None = None,
) -> Any:
    """One run's scalars as a DataFrame.

    ``wide``: one row per step (the index), a column per metric (the last value logged at a
    step wins, as in TensorBoard's and W&B's charts); a labelled value (``run.log_episode``,
    ``labels=``) also fills its label's column, ``<metric> [<key>=<value>]``. Else tidy rows:
    run, step, name, value, wall_time, labels (a dict). ``metrics`` keeps only those names;
    ``derived=False`` leaves the stream worker's series out.
    """
    from metricbus.sinks import tidy

    pandas = _pandas()
    table = tidy(_archive(settings), check_run_id(run), derived=derived, labels=True)
    frame = table.to_pandas()
    frame["labels"] = [dict(v) if v is not None else {} for v in frame["labels"]]
    if metrics is not None:
        frame = frame[frame["name"].isin(list(metrics))]
    if not wide:
        return frame.reset_index(drop=True)
    tagged = frame[frame["labels"].map(bool)]
    if not tagged.empty:
        extra = [
            {"step": step, "name": labelled(name, key, tag), "value": value}
            for step, name, value, tags in zip(
                tagged["step"], tagged["name"], tagged["value"], tagged["labels"], strict=True
            )
            for key, tag in tags.items()
        ]
        frame = pandas.concat([frame, pandas.DataFrame(extra)], ignore_index=True)
    if frame.empty:
        return pandas.DataFrame(index=pandas.Index([], name="step"))
    out = frame.pivot_table(index="step", columns="name", values="value", aggfunc="last", dropna=False)
    out.columns.name = None
    return out


def runs(project: str | None = None, settings: Settings | None = None) -> Any:
    """Every run in the archive (or one project's): id, project, name, state, steps, times, config.

    ``config`` is the run's config (its starts and updates merged); the ``summary`` column holds
    what ``finish(summary=...)`` recorded.
    """
    from metricbus.sinks import iter_events, run_extent
    from metricbus.sinks._archive import might_be_of, project_of, run_folders

    pandas = _pandas()
    archive = _archive(settings)
    rows = []
    for run_id, folders in run_folders(archive).items():
        if project is not None and not might_be_of(folders, project):
            continue
        try:  # a run's metrics are counted by Arrow, never turned into Python objects
            control = [e for c in iter_events(archive, run_id, kinds=_CONTROL) for e in c]
            run_project = project_of(folders, [e for e in control if e.kind == RUN_STARTED])
            if project is not None and run_project != project:
                continue
            extent = run_extent(archive, run_id)
        except (OSError, ValueError):
            continue  # a run directory being written right now
        rows.append(_row(run_id, run_project, extent or _NOTHING, control))
    columns = ["run_id", "project", "name", "state", "first_step", "last_step", "events", "started", "ended"]
    return pandas.DataFrame(rows, columns=[*columns, "config", "summary"])


#: the events a run's row is read from (besides its extent)
_CONTROL = frozenset({RUN_STARTED, RUN_FINISHED, CONFIG_UPDATE})
#: the extent of a run with no logged event (only the stream's derived ones)
_NOTHING: dict[str, Any] = dict.fromkeys(("first_step", "last_step", "first_ts_ms", "last_ts_ms"))
_NOTHING["events"] = 0


def _row(run_id: str, project: str, extent: dict[str, Any], control: list[Any]) -> dict[str, Any]:
    """A run's row of :func:`runs`: ``extent`` (``sinks.run_extent``) and its ``_CONTROL`` events."""
    started = [e for e in control if e.kind == RUN_STARTED]
    finished = [e for e in control if e.kind == RUN_FINISHED]
    summary: dict[str, Any] = {}
    for e in finished:
        summary.update(e.body.get("summary") or {})
    return {
        "run_id": run_id,
        "project": project,
        "name": started[0].body["name"] if started else run_id,
        "state": finished[-1].body["status"] if finished else "running or crashed",
        "first_step": extent["first_step"],
        "last_step": extent["last_step"],
        "events": extent["events"],
        "started": _when(extent["first_ts_ms"]) if extent["first_ts_ms"] is not None else None,
        "ended": _when(extent["last_ts_ms"]) if finished else None,
        "config": run_config(control),
        "summary": summary,
    }


def _when(ts_ms: int) -> Any:
    return _pandas().Timestamp(ts_ms, unit="ms", tz="UTC")
