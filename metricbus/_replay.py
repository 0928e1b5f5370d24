"""Replay archived runs into a sink or a Kafka topic, and back-test alert rules on them."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from schemas import MetricbusError, Settings, default_codec, ensure_topics

log = logging.getLogger("metricbus.replay")


def archived_runs(archive: Path, run: str | None, project: str | None) -> list[str]:
    """Run ids to replay: the one named, or every run of a project."""
    from schemas import path_segment

    if run is not None:
        return [run]
    runs = sorted(
        p.name[4:] for p in (Path(archive) / f"project={path_segment(project or '')}").glob("run=*")
    )
    if not runs:
        raise MetricbusError(f"project {project!r} has no runs in the archive at {archive}")
    return runs


def make_sink(kind: str, out: Path, include: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> Any:
    """A sink writing to ``out`` (a fresh directory for a replay)."""
    from sinks import ParquetArchive, TensorBoardSink

    if kind == "tensorboard":
        _require("tensorboard")
        return TensorBoardSink(out)
    if kind == "wandb":
        _require("wandb")
        from sinks.wandb import WandbSink

        return WandbSink(out, include=include or ("*",), exclude=exclude)
    if kind == "parquet":
        return ParquetArchive(out)
    raise MetricbusError(f"cannot replay into {kind!r}; choose tensorboard, wandb, parquet or kafka")


def events_from_kafka(settings: Settings, run_id: str) -> list[Any]:
    """A run's events read from the events topic (as far as its retention reaches), deduplicated."""
    from schemas import Deduper, decode_events

    from ._read import read_topic

    codec, dedupe = default_codec(), Deduper()
    out: list[Any] = []
    for record in read_topic(settings, settings.topics.events):
        if record.key == run_id.encode():
            out.extend(e for e in decode_events(codec, record.value) if dedupe.is_new(e.producer_id, e.seq))
    return out


def replay_to_sink(
    settings: Settings, runs: Iterable[str], sink: Any, chunk: int = 50_000, source: str = "archive"
) -> int:
    """Feed each run's events (archive or events topic) to ``sink``, as live consumption does."""
    from sinks import read_events

    sink.open()
    total = 0
    try:
        for run_id in runs:
            if source == "kafka":
                events = events_from_kafka(settings, run_id)
            else:
                events = read_events(settings.archive_dir, run_id)
            if not events:
                where = settings.topics.events if source == "kafka" else settings.archive_dir
                raise MetricbusError(f"run {run_id!r} is not in {where}")
            for start in range(0, len(events), chunk):
                sink.write(events[start : start + chunk])
            sink.flush()
            total += len(events)
    finally:
        sink.close()
    return total


def replay_to_kafka(settings: Settings, target: Settings, runs: Iterable[str]) -> int:
    """Republish archived runs, as EventBatch records keyed by run id, into ``target``'s topics."""
    from kafka import KafkaProducer

    from schemas import client_options
    from sinks import read_events

    ensure_topics(target)
    codec = default_codec()
    producer = KafkaProducer(
        **client_options(target), enable_idempotence=False, acks=1, max_in_flight_requests_per_connection=1
    )
    total = 0
    try:
        for run_id in runs:
            events = read_events(settings.archive_dir, run_id)
            by_producer: dict[str, list[Any]] = {}
            for e in events:
                by_producer.setdefault(e.producer_id, []).append(e)
            for producer_id, evs in by_producer.items():
                for start in range(0, len(evs), 500):
                    batch = {
                        "run_id": run_id,
                        "producer_id": producer_id,
                        "sdk_version": None,
                        "events": [
                            {"seq": e.seq, "ts_ms": e.ts_ms, "body": (e.kind, e.body)}
                            for e in evs[start : start + 500]
                        ],
                    }
                    producer.send(
                        target.topics.events, key=run_id.encode(), value=codec.encode("EventBatch", batch)
                    )
            total += len(events)
        producer.flush(timeout=60)
    finally:
        producer.close()
    return total


def backtest(
    settings: Settings, rules_path: Path, run_id: str, config_path: Path | None = None
) -> list[dict[str, Any]]:
    """Alerts ``rules_path`` would have raised on an archived run, in order."""
    from sinks import read_events
    from stream_jobs import StreamProcessor, load_config, load_rules

    events = read_events(settings.archive_dir, run_id)
    if not events:
        raise MetricbusError(f"run {run_id!r} is not in the archive at {settings.archive_dir}")
    cfg = load_config(config_path) if config_path is not None else None
    processor = StreamProcessor(cfg, rules=load_rules(rules_path))
    alerts: list[dict[str, Any]] = []
    for start in range(0, len(events), 100):  # records of ~100 events, as live
        alerts.extend(processor.process(events[start : start + 100]).alerts)
    return alerts


def describe_alert(alert: dict[str, Any]) -> str:
    """One line: when, at which step, what."""
    when = datetime.datetime.fromtimestamp(alert["ts_ms"] / 1000, tz=datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S"
    )
    step = "-" if alert["step"] is None else alert["step"]
    what = f"{alert['state']:<9}{alert['rule']} [{alert['severity']}] {alert['metric']}: {alert['message']}"
    return f"{when}Z  step {step:>8}  {what}"


def _require(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        raise MetricbusError(f"this needs {module}: pip install 'metricbus[{module}]'") from None
