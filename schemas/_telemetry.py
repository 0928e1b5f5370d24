"""Metrics of the pipeline itself, through prometheus_client: the one home of their names.

Every long-running process (each sink, the stream worker, each alert consumer) counts here.
Under ``metricbus up`` they share one ``PROMETHEUS_MULTIPROC_DIR`` (set by ``up`` before they
start), and the dashboard serves them all on one ``/metrics``. A process in a container of its
own (compose, Kubernetes: every process is pid 1 there, so a shared directory would mix them
up) serves its own: ``METRICBUS_METRICS_PORT=9100`` starts prometheus_client's HTTP server on
``METRICBUS_METRICS_ADDR`` (default 0.0.0.0 in that case: the container's own network) with
the first counter; the compose file's health checks use it.

Counters are fed from each loop's own statistics after a flush, never per record: the cost
on a consumer is a few dictionary lookups a flush. Names (all ``metricbus_`` prefixed):

- ``metricbus_consumer_<counter>_total{group}``: records, events, written, duplicates,
  deadlettered, rejected, flushes, flush_failures, unavailable, commits (see SinkStats);
- ``metricbus_consumer_flush_seconds{group}``: histogram of flush durations;
- ``metricbus_consumer_failing{group}``: 1 while the group's last flush failed or its
  destination takes nothing (a live process's; 0 once a flush succeeds again);
- ``metricbus_consumer_last_commit_timestamp_seconds{group}``: when the group last committed;
- ``metricbus_worker_<counter>_total{group}``: the stream worker's records, events, outputs,
  alerts, dead letters; ``metricbus_worker_processing_seconds{group}`` per record batch;
  ``metricbus_worker_checkpoint_timestamp_seconds{group}``;
- ``metricbus_process_restarts_total{process}``: restarts made by ``metricbus up``.

Scrape-time gauges (lag, consumer status, runs, dead letters) come from the dashboard's
own collector (``metricbus/_metrics.py``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

#: Counters each consumer loop reports (names of SinkStats fields).
CONSUMER_COUNTERS = (
    "records",
    "events",
    "written",
    "duplicates",
    "deadlettered",
    "forged",
    "rejected",
    "flushes",
    "flush_failures",
    "unavailable",
    "commits",
)
#: forgotten_runs: runs whose derivation state was dropped to keep within max_partition_series
#: forged: records repeating taken events with other bytes (schemas.RecordDigests), dead-lettered
WORKER_COUNTERS = ("records", "events", "outputs", "alerts", "deadlettered", "forged", "forgotten_runs")
FLUSH_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_metrics: dict[str, Any] = {}


def multiprocess_dir() -> str | None:
    """The shared directory of every process's samples under ``up`` (None: one process)."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def _serve_once() -> None:
    port = os.environ.get("METRICBUS_METRICS_PORT")
    if _metrics or not port or multiprocess_dir():
        return
    import prometheus_client

    prometheus_client.start_http_server(int(port), addr=os.environ.get("METRICBUS_METRICS_ADDR", "0.0.0.0"))


def _metric(kind: str, name: str, doc: str, labels: tuple[str, ...], **kw: Any) -> Any:
    found = _metrics.get(name)
    if found is None:
        import prometheus_client

        _serve_once()
        found = _metrics[name] = getattr(prometheus_client, kind)(name, doc, labels, **kw)
    return found


class LoopMetrics:
    """One loop's counters (``kind``: "consumer" or "worker"), fed from its cumulative stats."""

    def __init__(self, kind: str, group: str) -> None:
        self.kind = kind
        self.group = group
        names = CONSUMER_COUNTERS if kind == "consumer" else WORKER_COUNTERS
        self.names = names
        self._counters = {
            n: _metric(
                "Counter", f"metricbus_{kind}_{n}", f"{n.replace('_', ' ')} of a metricbus {kind}", ("group",)
            ).labels(group)
            for n in names
        }
        self._seen: dict[str, int] = dict.fromkeys(names, 0)
        seconds = "flush" if kind == "consumer" else "processing"
        self._duration = _metric(
            "Histogram",
            f"metricbus_{kind}_{seconds}_seconds",
            f"{seconds} durations of a metricbus {kind}",
            ("group",),
            buckets=FLUSH_BUCKETS,
        ).labels(group)
        stamp = "last_commit" if kind == "consumer" else "checkpoint"
        self._stamp = _metric(
            "Gauge",
            f"metricbus_{kind}_{stamp}_timestamp_seconds",
            f"unix time of the last {stamp.replace('_', ' ')} of a metricbus {kind}",
            ("group",),
            multiprocess_mode="max",
        ).labels(group)
        self._failing = _metric(
            "Gauge",
            f"metricbus_{kind}_failing",
            f"1 while a metricbus {kind}'s last flush failed or its destination takes nothing",
            ("group",),
            multiprocess_mode="livemax",
        ).labels(group)
        self._failing_now = False
        self._failing.set(0.0)
        back_files()  # every sample this loop writes exists now

    def failing(self, now: bool) -> bool:
        """Whether the loop's destination refuses now (set on a change only); True on a change."""
        if now == self._failing_now:
            return False
        self._failing_now = now
        self._failing.set(1.0 if now else 0.0)
        return True

    def update(self, stats: Mapping[str, int]) -> None:
        """Bring the counters up to the loop's cumulative ``stats``."""
        for name, counter in self._counters.items():
            value = int(stats.get(name, 0))
            delta = value - self._seen[name]
            if delta > 0:
                counter.inc(delta)
                self._seen[name] = value

    def observe(self, seconds: float) -> None:
        self._duration.observe(seconds)

    def stamp(self, at: float | None = None) -> None:
        self._stamp.set(time.time() if at is None else at)


def count_restart(process: str, by: int = 1) -> None:
    """One restart of ``process`` by ``metricbus up`` (``by=0``: its counter made, at start)."""
    _metric(
        "Counter", "metricbus_process_restarts", "restarts of a process by metricbus up", ("process",)
    ).labels(process).inc(by)
    if not by:
        back_files()


_backed: set[str] = set()


def back_files() -> None:
    """Give this process's metrics files real blocks, once each, while the disk has room.

    prometheus_client keeps them as sparse files written through mmap: a write to a page the
    disk has no block for is a SIGBUS, which killed `metricbus up` and every child with it the
    first time a full data disk met a new sample (a restart counted). Called once the samples a
    process will write exist; a later new one in the same (already backed) file is safe.
    """
    shared = multiprocess_dir()
    if not shared:
        return
    suffix = f"_{os.getpid()}.db"
    try:
        names = [n for n in os.listdir(shared) if n.endswith(suffix) and n not in _backed]
    except OSError:
        return
    for name in names:
        try:
            fd = os.open(os.path.join(shared, name), os.O_RDWR)
            try:
                os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            _backed.add(name)
        except OSError:  # a full disk already: nothing to back them with now; tried again later
            continue
