"""The dashboard's experiments view: the runs table of the archive and grouped charts of its runs.

Both read the Parquet archive (every run ever logged, not only those the topics still hold).
The runs table is one row per run with its config flattened (``model/width``) and its summary;
a grouped chart is one metric of chosen runs as group means with bands (``diagnostics._groups``)
and, per group, the IQM of the runs' final-window means with its interval and Welch's verdict
against a baseline group: what ``metricbus compare --group-by`` says, for the same runs.

The rows come from the dashboard's :class:`~metricbus.ops._archived.ArchivedRuns`, which
reads a run again only once its files changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def runs_table(every: list[dict[str, Any]], project: str | None = None) -> dict[str, Any]:
    """The runs table of ``every`` run row (``_runs.run_rows``; of ``project`` only, if given).

    ``keys``: every flattened config key of the rows; ``differ``: those whose values differ
    between them, seed keys left out (the default grouping, as ``compare``'s).
    """
    from metricbus.diagnostics._compare import SEED_KEY, config_diff, flatten

    rows = [r for r in every if project is None or r["project"] == project]
    flat = {r["run_id"]: flatten(r["config"]) for r in rows}
    differ = [k for k in config_diff(flat) if not SEED_KEY.search(k)] if len(rows) > 1 else []
    return {
        "projects": sorted({r["project"] for r in every}),
        "project": project,
        "keys": sorted({k for c in flat.values() for k in c}),
        "differ": differ,
        "runs": [
            {
                "run_id": r["run_id"],
                "project": r["project"],
                "name": r["name"],
                "state": r["state"],
                "last_step": r["last_step"],
                "events": r["events"],
                "started_ms": r["first_ts_ms"],
                "config": flat[r["run_id"]],
                "summary": r["summary"],
            }
            for r in rows
        ],
    }


def metric_names(archive: Path, runs: Sequence[str], project: str | None = None) -> list[str]:
    """The scalar and sample names the runs logged (system metrics last)."""
    import pyarrow.compute as pc

    from metricbus.schemas import METRICS
    from metricbus.sinks import read_table

    coded = ("run_id", "name")  # a few distinct values each: read as indices, compared as such
    if len(runs) == 1:
        table = read_table(archive, runs[0], columns=["name"], ordered=False, kinds={METRICS}, logged=True)
    else:
        table = read_table(
            archive,
            project=project,
            columns=["run_id", "name"],
            ordered=False,
            kinds={METRICS},
            logged=True,
            dictionary=coded,
        )
        table = table.filter(pc.is_in(table["run_id"], value_set=_strings(runs)))
    names = [n for n in pc.unique(table["name"].combine_chunks()).to_pylist() if n]
    return sorted(names, key=lambda n: (n.startswith("System/"), n))


def grouped_chart(
    archive: Path,
    every: list[dict[str, Any]],
    runs: Sequence[str],
    metric: str,
    group_by: Sequence[str] | None = None,
    band: str = "std",
    baseline_group: str | None = None,
) -> dict[str, Any]:
    """One metric of ``runs``: each group's mean and band, and the groups' statistics.

    For JSON through ``schemas.strict_json`` (an IQM of one run has no interval: NaN, null).
    ``every``: the run rows (``_runs.run_rows``), for the runs' names and configs.

    ``group_by``: config keys (None: every key that differs but seeds; empty: a group per run).
    """
    from metricbus.diagnostics._columnar import rows_metric_points
    from metricbus.diagnostics._compare import compare_series, group_runs
    from metricbus.diagnostics._groups import bands, curve

    archive = Path(archive)
    rows = {r["run_id"]: r for r in every if r["run_id"] in set(runs)}
    chosen = [r for r in runs if r in rows]
    points = rows_metric_points(archive, metric, [rows[r] for r in chosen])
    have = [r for r in chosen if r in points and len(points[r])]
    configs = {r: rows[r]["config"] for r in have}
    keys = list(group_by) if group_by is not None else None
    result: dict[str, Any] = {
        "metric": metric,
        "runs": {r: rows[r]["name"] for r in have},
        "bands": [],
        "scores": [],
        "compared": [],
        "groups": {},
    }
    curves = {r: curve(points[r].steps, points[r].values) for r in have}
    if len(have) < 2:  # one run (or none): its curve, nothing to compare
        keys = []
    if keys == []:
        groups = {rows[r]["name"] + f" ({r})": [r] for r in have}
        comparison = None
    else:
        if baseline_group not in group_runs(configs, keys):  # not among these runs: the first run's
            baseline_group = None
        comparison = compare_series(
            configs,
            {r: {metric: points[r]} for r in have},
            have[0],
            [metric],
            group_by=keys,
            baseline_group=baseline_group,
            per_run=False,
        )
        groups = comparison.groups
        result["group_by"] = comparison.group_by
        result["baseline_group"] = comparison.baseline_group
        result["config_diff"] = comparison.config_diff
        result["scores"] = [vars(s) for s in comparison.group_scores]
        result["compared"] = [vars(c) for c in comparison.group_metrics]
    result["groups"] = groups
    drawn = bands(curves, groups, band)
    for b in drawn:
        if len(b.runs) == 1:  # a run alone: its band is its curve, not sent three times
            b.lower = b.upper = []
    result["bands"] = [vars(b) for b in drawn]
    return result


def _strings(values: Sequence[str]) -> Any:
    import pyarrow as pa

    return pa.array(list(values), pa.string())
