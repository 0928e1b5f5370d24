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
    MetricbusError,
    Settings,
    check_run_id,
)


def _pandas(what: str) -> Any:
    """pandas, or the error that names ``what`` needs it and the pip line that brings it."""
    try:
        import pandas
    except ImportError:
        raise MetricbusError(f"metricbus.{what}() needs pandas: pip install 'metricbus[analysis]'") from None
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

    ``run`` is found as every command finds it: its id, a unique prefix of the id, its name or
    the start of its name. MetricbusError naming the archive when no run matches, listing the
    candidates when several do.
    """
    from metricbus.diagnostics._runs import find_run
    from metricbus.sinks import tidy

    pandas = _pandas("history")
    archive = _archive(settings)
    table = tidy(archive, check_run_id(find_run(archive, run)), derived=derived, labels=True)
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

    ``config`` is the run's config (its starts and updates merged) and ``summary`` what
    ``finish(summary=...)`` recorded, each also one column per key: ``config/lr``,
    ``config/model/width`` (nested keys flattened as compare names them), ``summary/<key>``:
    ``frame[frame["config/lr"] == 1e-3]``, ``frame.groupby("config/lr")``. A ``project`` the
    archive has no run of is a MetricbusError naming the archive and the projects it holds.
    """
    from metricbus.diagnostics._compare import flatten
    from metricbus.diagnostics._runs import run_rows

    pandas = _pandas("runs")
    _check_project(_archive(settings), project)
    columns = ["run_id", "project", "name", "state", "first_step", "last_step", "events", "started", "ended"]
    rows = [
        {
            **row,
            "started": _when(row["first_ts_ms"]) if row["first_ts_ms"] is not None else None,
            "ended": _when(row["last_ts_ms"]) if row["finished"] else None,
            **{f"config/{k}": v for k, v in flatten(row["config"]).items()},
            **{f"summary/{k}": v for k, v in row["summary"].items()},
        }
        for row in run_rows(_archive(settings), project)
    ]
    keys = sorted({k for row in rows for k in row if k.startswith(("config/", "summary/"))})
    return pandas.DataFrame(rows, columns=[*columns, "config", "summary", *keys])


def curves(
    project: str | None,
    metric: str,
    group_by: Sequence[str] | None = None,
    band: str = "std",
    runs: Sequence[str] | None = None,
    settings: Settings | None = None,
) -> Any:
    """One metric of a project's runs (or of ``runs``), grouped: the dashboard's grouped chart.

    Rows: group, step, mean, lower, upper, runs (how many runs the group's mean is over). Runs
    are grouped by the config keys ``group_by`` (default: every key that differs but seeds);
    ``band`` "std" (mean ± sample std) or "minmax". Runs that logged at other steps are
    interpolated onto shared ones (see ``metricbus.diagnostics._groups``).
    """
    from metricbus.diagnostics._columnar import rows_metric_points
    from metricbus.diagnostics._compare import group_runs
    from metricbus.diagnostics._groups import bands, curve
    from metricbus.diagnostics._runs import find_run, run_rows

    pandas = _pandas("curves")
    archive = _archive(settings)
    _check_project(archive, project)
    chosen = [find_run(archive, r) for r in runs] if runs is not None else None
    rows = [r for r in run_rows(archive, project) if chosen is None or r["run_id"] in chosen]
    groups = group_runs({r["run_id"]: r["config"] for r in rows}, group_by)
    points = rows_metric_points(archive, metric, rows)
    found = {run: curve(p.steps, p.values) for run, p in points.items()}
    out = [
        {"group": b.group, "step": step, "mean": m, "lower": lo, "upper": hi, "runs": len(b.runs)}
        for b in bands(found, groups, band)
        for step, m, lo, hi in zip(b.steps, b.mean, b.lower, b.upper, strict=True)
    ]
    return pandas.DataFrame(out, columns=["group", "step", "mean", "lower", "upper", "runs"])


def _check_project(archive: Path, project: str | None) -> None:
    """MetricbusError naming the archive and its projects when ``project`` has no run there."""
    from metricbus.sinks import run_projects

    if project is None or run_projects(archive, project):
        return
    held = sorted(set(run_projects(archive).values()))
    listed = ", ".join(held[:20]) + (" ..." if len(held) > 20 else "") if held else "none"
    raise MetricbusError(f"no run of project {project!r} in the archive {archive} (its projects: {listed})")


def _when(ts_ms: int) -> Any:
    return _pandas("runs").Timestamp(ts_ms, unit="ms", tz="UTC")
