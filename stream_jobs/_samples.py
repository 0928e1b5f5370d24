"""What a run's per-sample arrays make beyond each batch's statistics.

Histograms of each series' recent samples, and at the run's end its ``final/{name}_*``
statistics over every sample and the rubric table. The run's deriver (``_derive.RunDeriver``)
keeps the windows and totals and passes them in.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from metricbus.schemas import histogram

from ._config import StreamConfig
from ._points import Point
from ._stats import Welford, Window


def sample_histogram(
    cfg: StreamConfig,
    recent: dict[str, Window],
    last_steps: dict[str, int],
    source: str,
    values: list[float],
    name: str,
    step: int,
    ts: int,
) -> dict[str, Any] | None:
    """``values`` of ``source`` added to its recent window; its histogram when one is due.

    Due every ``cfg.hist_every`` steps once the window holds ``cfg.hist_min_samples``;
    ``recent`` and ``last_steps`` (the step of each source's last histogram) are updated.
    """
    window = recent.get(source)
    if window is None:
        window = recent[source] = Window(cfg.hist_window)
    window.extend(values)
    last = last_steps.get(source)
    if len(window) < cfg.hist_min_samples or (last is not None and step - last < cfg.hist_every):
        return None
    last_steps[source] = step
    counts, edges = histogram(np.fromiter(window.values, float, len(window)), cfg.hist_bins)
    return {"name": name, "source": source, "step": step, "edges": edges, "counts": counts, "ts_ms": ts}


def final_points(
    cfg: StreamConfig, totals: dict[str, Welford], step: int, epoch: int | None, ts: int
) -> tuple[list[Point], dict[str, Any] | None]:
    """Seed 002's ``final/{name}_*`` points and the rubric table, over every sample of the run.

    ``total_samples`` counts every sample processed, NaN-scored ones included (seed 002);
    ``nonfinite_samples`` says how many of them had no finite score. The statistics are over
    the finite scores. The table is None when no series has the summary prefix.
    """
    prefix = cfg.summary_prefix
    rows: list[list[Any]] = [
        [name[len(prefix) :], total.mean, total.std, total.min, total.max, total.count + total.nonfinite]
        for name, total in sorted(totals.items())
        if name.startswith(prefix) and total.count + total.nonfinite
    ]
    table = None
    if rows:
        table = {
            "name": cfg.summary_table,
            "step": step,
            "columns": ["criterion", "mean", "std", "min", "max", "samples"],
            "rows": rows,
            "ts_ms": ts,
        }
    out = []
    for name, total in sorted(totals.items()):
        if not total.count + total.nonfinite:
            continue
        short = name[len("rewards/") :] if name.startswith("rewards/") else name
        stats = [("total_samples", float(total.count + total.nonfinite))]
        stats.append(("nonfinite_samples", float(total.nonfinite)))
        if total.count:
            stats += [("mean", total.mean), ("std", total.std), ("max", total.max), ("min", total.min)]
        for stat, value in stats:
            out.append(Point(f"final/{short}_{stat}", name, "final", step, epoch, value, ts))
    return out, table
