"""Replay archived runs into a sink or a Kafka topic, as live consumption wrote them."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from metricbus.schemas import MetricbusError, Settings, default_codec

log = logging.getLogger("metricbus.replay")


def archived_runs(archive: Path, run: str | None, project: str | None) -> list[str]:
    """Run ids to replay: the one named, or every run of a project."""
    from metricbus.sinks import run_projects

    if run is not None:
        return [run]
    runs = list(run_projects(archive, project or ""))
    if not runs:
        raise MetricbusError(f"project {project!r} has no runs in the archive at {archive}")
    return runs


def events_from_kafka(settings: Settings, run_id: str) -> list[Any]:
    """A run's logged and derived events from its topics (as far as retention reaches), deduplicated."""
    from metricbus.schemas import Deduper, SchemaError, decode_aggregates, decode_events, read_topic

    codec, logged, derived = default_codec(), Deduper(), Deduper()
    signer = settings.signer
    key = run_id.encode()
    out: list[Any] = []
    skipped = 0
    for record in read_topic(settings, settings.topics.events):
        if record.key == key:
            try:
                signer.check(record.value)
                events = decode_events(codec, record.value)
            except SchemaError:  # the live consumers dead-lettered it; a replay skips it, and says so
                skipped += 1
                continue
            out.extend(e for e in events if logged.is_new(e.producer_id, e.seq))
    for record in read_topic(settings, settings.topics.aggregates):
        if record.key == key:
            try:
                events = decode_aggregates(codec, record.value).events
            except SchemaError:
                skipped += 1
                continue
            out.extend(e for e in events if e.seq < 0 or derived.is_new(run_id, e.seq))
    if skipped:
        log.warning("run %s: %d records under its key cannot be decoded and were skipped", run_id, skipped)
    return out


def replay_to_sink(
    settings: Settings, runs: Iterable[str], sink: Any, chunk: int = 50_000, source: str = "archive"
) -> tuple[int, int]:
    """Feed each run's logged and derived events (archive or topics) to ``sink``, as live does.

    Idempotent per output: what the sink already holds there (its ``recover``) is skipped, so a
    second replay into the same place writes nothing. Returns (events read, events written).
    From the archive a run is read a chunk at a time (``iter_events``), so a long run does not
    have to fit in memory as Python objects.
    """
    from metricbus.sinks import Feeder, iter_events

    feeder = Feeder(sink)
    sink.open()
    read = written = 0
    try:
        for run_id in runs:
            if source == "kafka":
                events = events_from_kafka(settings, run_id)
                chunks: Iterable[list[Any]] = (events[i : i + chunk] for i in range(0, len(events), chunk))
            else:
                chunks = iter_events(settings.archive_dir, run_id, derived=True, rows=chunk * 2)
            found = 0
            for events in chunks:
                found += len(events)
                fresh = feeder.fresh(events)
                rejected = feeder.write(fresh)
                for event, reason in rejected:
                    log.error(
                        "replay: %s seq %d of run %s not written: %s", event.kind, event.seq, run_id, reason
                    )
                written += len(fresh) - len(rejected)
            if not found:
                where = settings.topics.events if source == "kafka" else settings.archive_dir
                raise MetricbusError(f"run {run_id!r} is not in {where}")
            sink.derived_complete(run_id)
            sink.flush()
            read += found
    finally:
        sink.close()
    return read, written


def replay_to_kafka(settings: Settings, target: Settings, runs: Iterable[str]) -> int:
    """Republish archived runs, as EventBatch records keyed by run id, into ``target``'s topics.

    Only what was logged: the stream worker on the target topics derives the rest again. Sent
    as the producer hook sends (its transport: compressed batches, records cut to fit
    MAX_RECORD_BYTES, each send acknowledged before the next). Returns the events republished;
    an archived event that does not encode again is left out with an error naming it.
    """
    from metricbus.producers import KafkaTransport
    from metricbus.schemas import MAX_RECORD_BYTES, SIGNATURE_BYTES, encode_fitting
    from metricbus.sinks import iter_events

    codec, signer = default_codec(), target.signer  # signed under the target's key, if it has one
    transport = KafkaTransport(target, send_timeout_s=30.0)
    total = 0

    def rejected(event: tuple[int, int, str, Any], why: Exception | int) -> None:
        nonlocal total
        total -= 1
        what = f"{why / 1e6:.1f} MB encoded, over the record limit" if isinstance(why, int) else str(why)
        log.error("run %s: archived event seq %d is not republished: %s", run_id, event[0], what)

    try:
        for run_id in runs:
            for events in iter_events(settings.archive_dir, run_id):  # in (producer, seq) order
                by_producer: dict[str, list[Any]] = {}
                for e in events:
                    by_producer.setdefault(e.producer_id, []).append(e)
                for producer_id, evs in by_producer.items():
                    for start in range(0, len(evs), 500):
                        batch = [(e.seq, e.ts_ms, e.kind, e.body) for e in evs[start : start + 500]]
                        records = encode_fitting(
                            codec, run_id, producer_id, batch, MAX_RECORD_BYTES - SIGNATURE_BYTES, rejected
                        )
                        transport.send(run_id.encode(), [signer.sign(r) for r in records])
                total += len(events)
    finally:
        transport.close()
    return total
