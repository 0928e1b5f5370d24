"""Constructors for event bodies whose shape every writer must agree on."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from ._events import CONFIG_UPDATE, RUN_STARTED


def run_started(
    project: str,
    name: str,
    config: Mapping[str, Any] | None = None,
    *,
    tags: Iterable[str] = (),
    host: str = "",
    pid: int = 0,
    git: str | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> dict[str, Any]:
    """A RunStarted body (the config is stored as a JSON object, keys sorted)."""
    return {
        "project": project,
        "name": name,
        "config_json": json.dumps(dict(config or {}), default=str, sort_keys=True),
        "tags": [str(t) for t in tags],
        "host": host,
        "pid": pid,
        "git": git,
        "rank": rank,
        "world_size": world_size,
    }


def config_update(changes: Mapping[str, Any], step: int | None = None) -> dict[str, Any]:
    """A ConfigUpdate body: the keys set after the run started (JSON object, keys sorted)."""
    return {"config_json": json.dumps(dict(changes), default=str, sort_keys=True), "step": step}


def merge_config(config: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with ``changes`` merged in, nested mappings key by key (how readers apply updates)."""
    out = dict(config)
    for key, value in changes.items():
        old = out.get(key)
        out[key] = merge_config(old, value) if isinstance(old, dict) and isinstance(value, Mapping) else value
    return out


def config_object(raw: str) -> dict[str, Any]:
    """The JSON object of a ``config_json`` (RunStarted, ConfigUpdate); ValueError if it is not one."""
    try:
        value = json.loads(raw or "{}")
    except RecursionError:  # "[[[[...": a topic is untrusted, and callers expect a ValueError
        raise ValueError("config_json is nested too deeply to read") from None
    if not isinstance(value, dict):
        raise ValueError(f"config_json must be a JSON object, got {type(value).__name__}")
    return value


def strict_json(value: Any, indent: int | None = None) -> str:
    """``value`` as JSON any parser reads: NaN and infinities null, what JSON cannot hold text.

    Python writes ``NaN``, which jq, JavaScript, DuckDB and Slack's webhooks refuse.
    """
    loose = json.dumps(value, default=str)
    return json.dumps(json.loads(loose, parse_constant=lambda _: None), indent=indent, allow_nan=False)


def run_config(events: Iterable[Any]) -> dict[str, Any]:
    """A run's config from its events: every RunStarted's and ConfigUpdate's, merged in time order.

    One attempt's ranks start with the same config; a resumed run's new attempt (``run_id=``)
    and ``run.config.update`` change it. An unreadable config is skipped.
    """
    changes = sorted(
        (e for e in events if e.kind in (RUN_STARTED, CONFIG_UPDATE)),
        key=lambda e: (e.ts_ms, e.producer_id, e.seq),
    )
    out: dict[str, Any] = {}
    for e in changes:
        try:
            out = merge_config(out, config_object(e.body["config_json"]))
        except ValueError:
            continue
    return out


def histogram(values: Any, bins: int) -> tuple[list[int], list[float]]:
    """``(counts, edges)`` of the finite ``values`` in ``bins`` equal bins (a Histogram body's).

    NaN and inf have no bin and are left out (no finite value: one empty bin at 0). Values whose
    range passes float's (1e308 and -1e308) made numpy refuse to bin them ("Too many bins for
    data range"): the producer's log_histogram skipped the call, the TensorBoard sink refused
    the event and the stream worker's reward histogram raised; they are binned at half scale.
    numpy refuses too when the range is narrower than ``bins`` distinct floats (1.0 and
    1.0 + 2**-52; 0.0 and 5e-324; 1e308 twice): those values get one bin.
    """
    import numpy as np

    arr = np.asarray(values, dtype=float).ravel()
    finite = arr[np.isfinite(arr)]
    if not finite.size:
        return [0], [0.0, 1.0]
    lo, hi = float(finite.min()), float(finite.max())
    scale = 1.0 if math.isfinite(hi - lo) else 2.0
    try:
        counts, edges = np.histogram(finite / scale, bins=max(1, int(bins)))
    except ValueError:  # too narrow a range for that many bins
        if lo == hi:
            up = math.nextafter(hi, math.inf)
            lo, hi = (lo, up) if math.isfinite(up) else (math.nextafter(lo, -math.inf), hi)
        return [int(finite.size)], [lo, hi]
    return counts.tolist(), (edges * scale).tolist()


def histogram_bins(body: Mapping[str, Any]) -> tuple[list[float], list[int]]:
    """A Histogram body's ``(edges, counts)``; ValueError naming what is wrong when they cannot be drawn.

    A topic is untrusted: edges must be len(counts) + 1 finite, ascending numbers, counts not
    negative (the producer's ``log_histogram`` sends nothing else).
    """
    edges, counts = list(body["edges"]), list(body["counts"])
    if not counts or len(edges) != len(counts) + 1:
        raise ValueError(f"a histogram needs one edge more than counts: {len(edges)} for {len(counts)}")
    if not all(map(math.isfinite, edges)) or any(b < a for a, b in zip(edges, edges[1:], strict=False)):
        raise ValueError("a histogram's edges must be finite and ascending")
    if min(counts) < 0:
        raise ValueError("a histogram's counts must not be negative")
    return edges, counts
