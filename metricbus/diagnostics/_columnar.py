"""A run's logged events as health and compare read them, straight from the archive's columns.

What :meth:`Seen.read` keeps of a run (its series, per-producer seqs, event times, ranks'
last steps, whether it finished) made from Arrow columns with numpy, never an object per
event: the events of a 100,000-step run of 20 scalars took seconds as Python objects (health
4.4 s, compare of two such runs 9.7 s). The same result as reading the events (tested against
:meth:`Seen.read` on a run with every feature); only the few events that carry a payload
(RunStarted, ConfigUpdate, RunFinished, ...) are decoded.
"""

from __future__ import annotations

import math
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from metricbus.diagnostics._health import Seen
from metricbus.diagnostics._series import Points, Series, labelled
from metricbus.schemas import (
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    Event,
    MetricbusError,
    default_codec,
)

COLUMNS = [
    *("producer_id", "seq", "ts_ms", "kind", "step", "rank"),
    *("labels", "name", "value", "samples", "payload"),
]


def read_logged(archive: Path, run_id: str, samples: bool = True) -> tuple[Seen, list[Event]]:
    """A run's :class:`Seen`, and its events that carry a payload, in order.

    ``samples``: sample arrays as series of their means, as ``scalars(..., samples=True)``.
    MetricbusError when the archive holds nothing of the run.
    """
    from metricbus.sinks import read_table

    try:  # in the files' order: sorted below only when it is not (producer, seq) order already
        table = read_table(
            archive,
            run_id,
            columns=COLUMNS,
            ordered=False,
            logged=True,
            dictionary=("name", "producer_id", "kind"),
        )
    except (FileNotFoundError, ValueError) as exc:
        raise MetricbusError(f"run {run_id!r} is not in the archive at {archive}") from exc
    if not len(table):
        raise MetricbusError(f"run {run_id!r} is not in the archive at {archive}")
    table = table.combine_chunks()
    n = len(table)
    producers = table["producer_id"].chunk(0)
    producer = producers.indices.to_numpy(zero_copy_only=False)
    seq = table["seq"].to_numpy()
    place = np.argsort(np.argsort(producers.dictionary.to_numpy(zero_copy_only=False)))[producer]
    if not ((place[1:] > place[:-1]) | ((place[1:] == place[:-1]) & (seq[1:] >= seq[:-1]))).all():
        order = np.lexsort((seq, place))  # stable: an event's rows keep their order
        table = table.take(order)
        producer, seq = producer[order], seq[order]
    ts = table["ts_ms"].to_numpy()
    has_payload = table["payload"].is_valid().to_numpy(zero_copy_only=False)
    # an event: consecutive rows of one (producer, seq) without a payload (a Metrics event's
    # scalars, an event archived twice read as one), or one row with its payload
    new = np.ones(n, dtype=bool)
    new[1:] = (producer[1:] != producer[:-1]) | (seq[1:] != seq[:-1]) | has_payload[1:] | has_payload[:-1]
    event = np.cumsum(new) - 1
    starts = np.flatnonzero(new)

    seen = Seen()
    names = producers.dictionary.to_pylist()
    start_producer = producer[starts]
    for code in np.unique(start_producer):
        seen.seqs[names[code]] = _ints(seq[starts][start_producer == code])
    seen.stamps = _ints(ts[starts])

    kinds = table["kind"].chunk(0)
    kind = kinds.indices.to_numpy(zero_copy_only=False)
    kind_names = kinds.dictionary.to_pylist()
    metrics = kind == (kind_names.index(METRICS) if METRICS in kind_names else -1)
    finished = kind_names.index(RUN_FINISHED) if RUN_FINISHED in kind_names else -1
    seen.finished = bool((kind[starts] == finished).any())
    steps = table["step"].fill_null(0).to_numpy()
    ranks = table["rank"].fill_null(0).to_numpy()
    metric_starts = starts[metrics[starts]]
    if len(metric_starts):
        order = np.lexsort((steps[metric_starts], ranks[metric_starts]))
        r, s = ranks[metric_starts][order], steps[metric_starts][order]
        last = np.flatnonzero(np.r_[r[1:] != r[:-1], True])  # each rank's highest step
        seen.last_step = {int(k): int(v) for k, v in zip(r[last], s[last], strict=True)}

    codec, carried = default_codec(), []
    for i in np.flatnonzero(has_payload):
        (e,) = codec.decode(table["payload"][int(i)].as_py())[1]["events"]
        kind_i, body = e["body"]
        carried.append(Event(run_id, names[producer[i]], int(seq[i]), int(ts[i]), kind_i, body, b""))
        if kind_i == RUN_STARTED:
            seen.world = max(seen.world, int(body.get("world_size") or 1))

    seen.series, twice = _series(table, metrics, event, steps, ts, samples)
    for i in twice:  # a Metrics event archived twice: its seq counted again, as completeness judges
        seen.seqs[names[producer[i]]].append(int(seq[i]))
    return seen, carried


def _series(
    table: Any, metrics: np.ndarray, event: np.ndarray, steps: np.ndarray, ts: np.ndarray, samples: bool
) -> tuple[Series, np.ndarray]:
    """Every logged series (and per-label one) in event order, as :func:`scalars` makes them.

    With a row of each Metrics event found archived twice.
    """
    name_column = table["name"].chunk(0)
    codes = name_column.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    names = name_column.dictionary.to_pylist()
    values = table["value"].fill_null(math.nan).to_numpy()
    sampled = table["samples"].is_valid().to_numpy(zero_copy_only=False)
    every = np.flatnonzero(metrics & (codes >= 0))
    # one value (or array) a name in an event: the last; an event holding a name twice was
    # archived twice (its rows read as one event), which the caller counts. A copy starts again
    # with its event's first name: only events where one does are looked at
    first = np.r_[True, event[every][1:] != event[every][:-1]]
    again = ~first & (
        codes[every] == codes[every][np.maximum.accumulate(np.where(first, np.arange(len(every)), 0))]
    )
    twice = every[:0]
    if again.any():
        doubled = np.isin(event[every], event[every][again])
        suspect = every[doubled]
        pairs = (event[suspect].astype(np.int64) * (len(names) + 1) + codes[suspect]) * 2 + sampled[suspect]
        _, last = np.unique(pairs[::-1], return_index=True)
        kept = np.sort(suspect[::-1][last])
        repeated = np.setdiff1d(suspect, kept, assume_unique=True)
        twice = repeated[np.unique(event[repeated], return_index=True)[1]]
        every = np.sort(np.concatenate([every[~doubled], kept]))
    rows = every[~sampled[every]]
    row_values = values[rows]
    if samples:  # a sample array: its mean of finite samples, a point where there is one
        extra_rows, extra_values = [], []
        lists = table["samples"]
        for i in every[sampled[every]]:
            finite = [v for v in lists[int(i)].as_py() if v is not None and math.isfinite(v)]
            if finite:
                extra_rows.append(i)
                extra_values.append(sum(finite) / len(finite))
        if extra_rows:
            rows = np.concatenate([rows, np.asarray(extra_rows, dtype=rows.dtype)])
            row_values = np.concatenate([row_values, np.asarray(extra_values)])
            order = np.argsort(rows, kind="stable")
            rows, row_values = rows[order], row_values[order]
    if not len(rows):
        return {}, twice
    # in the order the events first show each series: an event's samples, then each of its
    # scalars followed by its per-label series (as scalars() adds them)
    found: list[tuple[tuple[int, int, int, int], str, Points]] = []
    # by name, in event order within a name (a stable sort of small codes is a radix sort)
    grouped = np.argsort(codes[rows].astype(np.int16 if len(names) < 1 << 15 else np.int64), kind="stable")
    rows, row_values = rows[grouped], row_values[grouped]
    bounds = np.flatnonzero(np.r_[True, codes[rows][1:] != codes[rows][:-1], True])
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        points = Points()
        points.steps.frombytes(np.ascontiguousarray(steps[rows[a:b]], dtype=np.int64).tobytes())
        points.values.frombytes(np.ascontiguousarray(row_values[a:b], dtype=np.float64).tobytes())
        points.stamps.frombytes(np.ascontiguousarray(ts[rows[a:b]], dtype=np.int64).tobytes())
        first = int(rows[a])
        found.append(((int(event[first]), int(not sampled[first]), first, 0), names[codes[first]], points))
    tagged = table["labels"].is_valid().to_numpy(zero_copy_only=False)
    # the labelled scalars in row order: picked before the sort (sorting every row first cost
    # 0.2 s a 100k-step run of 20 metrics, a tenth of `compare`; most runs have no labels)
    by_label: dict[str, Points] = {}
    for i in np.sort(rows[tagged[rows] & ~sampled[rows]]):
        point = (int(steps[i]), float(values[i]), int(ts[i]))
        for k, (key, tag) in enumerate(table["labels"][int(i)].as_py() or ()):
            series = labelled(names[codes[i]], key, tag)
            if series not in by_label:
                by_label[series] = Points()
                found.append(((int(event[i]), 1, int(i), 1 + k), series, by_label[series]))
            by_label[series].append(point)
    return {name: points for _, name, points in sorted(found, key=lambda f: f[0])}, twice


def _ints(values: np.ndarray) -> array[int]:
    out = array("q")
    out.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())
    return out


def rows_metric_points(archive: Path, metric: str, rows: list[dict[str, Any]]) -> dict[str, Points]:
    """:func:`metric_points` of the runs of these run rows (``_runs.run_rows``).

    Only their project's files are read when they share one.
    """
    projects = {r["project"] for r in rows}
    project = projects.pop() if len(projects) == 1 else None
    return metric_points(archive, metric, [r["run_id"] for r in rows], project)


def metric_points(
    archive: Path, metric: str, runs: list[str] | None = None, project: str | None = None
) -> dict[str, Points]:
    """One metric of many runs, each run's points in event order, in one read of the archive.

    The runs of ``project`` (or of the whole archive), or only ``runs``. A metric logged as
    sample arrays is the mean of each event's finite samples, as :func:`read_logged` reads it,
    so :func:`~metricbus.diagnostics.compare_series` over these points answers as ``compare``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from metricbus.sinks import read_table

    columns = ["run_id", "producer_id", "seq", "ts_ms", "step", "value", "samples"]
    if runs is not None and len(runs) == 1:
        table = read_table(archive, runs[0], columns=columns, logged=True, names=[metric])
    else:
        table = read_table(archive, project=project, columns=columns, logged=True, names=[metric])
        if runs is not None:
            table = table.filter(pc.is_in(table["run_id"], value_set=pa.array(runs, pa.string())))
    coded = table["run_id"].combine_chunks().dictionary_encode()
    ids = coded.indices.to_numpy(zero_copy_only=False)
    steps = table["step"].to_numpy(zero_copy_only=False)
    stamps = table["ts_ms"].to_numpy(zero_copy_only=False)
    values = table["value"].to_numpy(zero_copy_only=False).astype(np.float64)  # null: NaN
    keep = np.ones(len(table), dtype=bool)
    if table["samples"].null_count < len(table):
        for i, samples in enumerate(table["samples"].to_pylist()):
            if samples is not None:
                finite = [v for v in samples if math.isfinite(v)]
                values[i] = sum(finite) / len(finite) if finite else math.nan
                keep[i] = bool(finite)  # no finite sample: no point, as read_logged has it
    order = np.argsort(ids, kind="stable")  # each run's rows together, in the order read
    order = order[keep[order]]
    bounds = np.searchsorted(ids[order], np.arange(len(coded.dictionary) + 1))
    out = {}
    for code, run in enumerate(coded.dictionary.to_pylist()):
        mine = order[bounds[code] : bounds[code + 1]]
        if len(mine):
            points = Points()
            points.steps, points.stamps = _ints(steps[mine]), _ints(stamps[mine])
            points.values.frombytes(np.ascontiguousarray(values[mine]).tobytes())
            out[str(run)] = points
    return out
