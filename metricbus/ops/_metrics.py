"""``/metrics``: every process's counters (multiprocess files) plus gauges read at scrape time.

Scrape-time gauges, from the dashboard's own snapshots (no Kafka call per scrape):

- ``metricbus_consumer_lag_records{group,topic,partition}`` and
  ``metricbus_consumer_lag_seconds{group,topic,partition}`` (age of the oldest waiting record);
- ``metricbus_consumer_status{group,status}``: 1 for the group's status (OK, SLOW, WARN,
  STALL, STOP, ERR), 0 for the others;
- ``metricbus_consumer_commit_rate{group}``: records committed per second over the window;
- ``metricbus_runs{state}``: runs on the topics by state (live, stalled, finished, ...);
- ``metricbus_alerts_firing{run,rule}``: 1 per firing alert (runs are few: bounded by the board);
- ``metricbus_dead_letter_records``; ``metricbus_spool_unsent_bytes{run}``;
- ``metricbus_board_records_total`` / ``metricbus_board_skipped_total``: what the dashboard read.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from metricbus.ops._lag import STATUSES
from metricbus.schemas import multiprocess_dir

if TYPE_CHECKING:
    from metricbus.ops._board import RunBoard
    from metricbus.ops._pipeline import Pipeline


class _Snapshot:
    """A prometheus_client collector over the board and the pipeline's latest sample."""

    def __init__(self, board: RunBoard, pipeline: Pipeline) -> None:
        self.board = board
        self.pipeline = pipeline

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        latest = self.pipeline.latest
        records = GaugeMetricFamily(
            "metricbus_consumer_lag_records",
            "records a group has not consumed",
            labels=["group", "topic", "partition"],
        )
        seconds = GaugeMetricFamily(
            "metricbus_consumer_lag_seconds",
            "age of the oldest record a group has not consumed",
            labels=["group", "topic", "partition"],
        )
        status = GaugeMetricFamily(
            "metricbus_consumer_status",
            "Burrow-style status of a group (1: current)",
            labels=["group", "status"],
        )
        rate = GaugeMetricFamily(
            "metricbus_consumer_commit_rate", "records committed per second", labels=["group"]
        )
        for g in latest.get("groups", []):
            for p in g["partitions"]:
                labels = [g["group"], p["topic"], str(p["partition"])]
                records.add_metric(labels, p["lag"])
                seconds.add_metric(labels, p["lag_s"] or 0.0)
            for name in STATUSES:
                status.add_metric([g["group"], name], 1.0 if g["status"] == name else 0.0)
            if g["commit_rate"] is not None:  # None: one sample so far, nothing measured
                rate.add_metric([g["group"]], g["commit_rate"])
        yield from (records, seconds, status, rate)

        runs = self.board.runs_table()
        by_state = GaugeMetricFamily("metricbus_runs", "runs on the topics by state", labels=["state"])
        for state, n in sorted(collections.Counter(r["state"] for r in runs).items()):
            by_state.add_metric([state], n)
        yield by_state
        firing = GaugeMetricFamily("metricbus_alerts_firing", "firing alerts", labels=["run", "rule"])
        for r in runs:
            for rule in r["firing"]:
                firing.add_metric([r["run_id"], rule], 1.0)
        yield firing
        count = (latest.get("dead_letters") or {}).get("count")
        if count is not None:
            yield GaugeMetricFamily(
                "metricbus_dead_letter_records", "records on the dead-letter topic", count
            )
        spooled = GaugeMetricFamily(
            "metricbus_spool_unsent_bytes", "bytes in local spools not yet published", labels=["run"]
        )
        for s in latest.get("spools", []):
            spooled.add_metric([s["run_id"]], s["unsent_bytes"])
        yield spooled
        yield CounterMetricFamily("metricbus_board_records", "records the dashboard read", self.board.records)
        yield CounterMetricFamily(
            "metricbus_board_skipped", "records the dashboard could not read", self.board.skipped
        )


def render_metrics(board: RunBoard, pipeline: Pipeline) -> tuple[bytes, str]:
    """The text exposition of every metricbus process of this stack, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    shared = multiprocess_dir()
    if shared:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry, path=shared)
    registry.register(_Snapshot(board, pipeline))  # type: ignore[arg-type]
    return generate_latest(registry), CONTENT_TYPE_LATEST
