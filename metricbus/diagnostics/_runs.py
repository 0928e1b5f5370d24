"""The runs of the archive: one row each, and a run found by its id, an id prefix or its name.

Every command that takes a run resolves it here (:func:`find_run`), so ``metricbus health
ppo-lr3e-4``, ``metricbus report 20261126-0130`` and ``metricbus export <full id>`` all work.
Reads the Parquet archive only; a run's metrics are counted by Arrow, never turned into Python
objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metricbus.schemas import CONFIG_UPDATE, RUN_FINISHED, RUN_STARTED, MetricbusError, run_config

#: the events a run's row is read from (besides its extent)
CONTROL = frozenset({RUN_STARTED, RUN_FINISHED, CONFIG_UPDATE})


class AmbiguousRun(MetricbusError):
    """A run reference that names several runs (the candidates are in the message)."""


def run_rows(
    archive: Path, project: str | None = None, cache: dict[str, tuple[Any, dict[str, Any]]] | None = None
) -> list[dict[str, Any]]:
    """A row per archived run (of ``project`` only, if given), oldest first.

    Keys: run_id, project, name, state, first_step, last_step, events, first_ts_ms,
    last_ts_ms, config, summary. ``state`` is the RunFinished status, else "running or crashed".
    ``cache`` (run id -> (its files' names and times, its row)), kept by a long-lived caller
    such as the dashboard: a run whose files did not change is not read again.
    """
    from metricbus.sinks import iter_events, run_extent
    from metricbus.sinks._archive import might_be_of, project_of, run_files, run_folders

    rows = []
    for run_id, folders in run_folders(archive).items():
        if project is not None and not might_be_of(folders, project):
            continue
        stamp = None
        if cache is not None:
            stamp = tuple((p.name, p.stat().st_mtime_ns) for p in run_files(archive, run_id))
            kept = cache.get(run_id)
            if kept is not None and kept[0] == stamp:
                if project is None or kept[1]["project"] == project:
                    rows.append(kept[1])
                continue
        try:
            control = [e for c in iter_events(archive, run_id, kinds=CONTROL) for e in c]
            run_project = project_of(folders, [e for e in control if e.kind == RUN_STARTED])
            row = _row(run_id, run_project, run_extent(archive, run_id), control)
        except (OSError, ValueError):
            continue  # a run directory being written right now
        if cache is not None:
            cache[run_id] = (stamp, row)
        if project is None or run_project == project:
            rows.append(row)
    return sorted(rows, key=lambda r: (r["first_ts_ms"] is None, r["first_ts_ms"] or 0, r["run_id"]))


def _row(run_id: str, project: str, extent: dict[str, Any] | None, control: list[Any]) -> dict[str, Any]:
    started = [e for e in control if e.kind == RUN_STARTED]
    finished = [e for e in control if e.kind == RUN_FINISHED]
    summary: dict[str, Any] = {}
    for e in finished:
        summary.update(e.body.get("summary") or {})
    extent = extent or {}
    return {
        "run_id": run_id,
        "project": project,
        "name": started[0].body["name"] if started else run_id,
        "state": finished[-1].body["status"] if finished else "running or crashed",
        "first_step": extent.get("first_step"),
        "last_step": extent.get("last_step"),
        "events": extent.get("events", 0),
        "first_ts_ms": extent.get("first_ts_ms"),
        "last_ts_ms": extent.get("last_ts_ms"),
        "finished": bool(finished),
        "config": run_config(control),
        "summary": summary,
    }


def find_run(archive: Path, ref: str) -> str:
    """The id of the archived run ``ref`` names: its id, a unique id prefix, name or name prefix.

    Raises MetricbusError naming the archive when none matches, and :class:`AmbiguousRun`
    listing the candidates when several do.
    """
    from metricbus.sinks import iter_events
    from metricbus.sinks._archive import run_folders

    ids = list(run_folders(archive))
    if ref in ids:
        return ref
    prefixed = [i for i in ids if i.startswith(ref)]
    if len(prefixed) == 1:
        return prefixed[0]
    named, name_prefixed = [], []
    for run_id in ids:
        try:
            names = {e.body["name"] for c in iter_events(archive, run_id, kinds={RUN_STARTED}) for e in c}
        except (OSError, ValueError):
            continue
        if ref in names:
            named.append(run_id)
        elif any(str(n).startswith(ref) for n in names):
            name_prefixed.append(run_id)
    if len(named) == 1:
        return named[0]
    if not named and not prefixed and len(name_prefixed) == 1:
        return name_prefixed[0]
    candidates = sorted(set(prefixed) | set(named) | set(name_prefixed))
    if candidates:
        raise AmbiguousRun(
            f"{ref!r} names {len(candidates)} runs: {', '.join(candidates[:10])}"
            + (" ..." if len(candidates) > 10 else "")
            + "; give more of the id (`metricbus runs` lists them)"
        )
    raise MetricbusError(
        f"no run {ref!r} in the archive {archive} (by id, id prefix or name); `metricbus runs` lists them"
    )
