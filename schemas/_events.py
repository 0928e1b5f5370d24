"""Decoded events as sinks see them: one flat tuple per event, envelope fields included."""

from __future__ import annotations

from typing import Any, NamedTuple

from ._codec import Codec
from ._errors import SchemaError

#: Full Avro names of the event body kinds (union branches of RunEvent.body).
METRICS = "metricbus.Metrics"
HISTOGRAM = "metricbus.Histogram"
RUN_STARTED = "metricbus.RunStarted"
RUN_FINISHED = "metricbus.RunFinished"
HEARTBEAT = "metricbus.Heartbeat"
TABLE = "metricbus.Table"


class Event(NamedTuple):
    """One event of the events topic, with where it came from."""

    run_id: str
    producer_id: str
    seq: int
    ts_ms: int
    kind: str  #: full Avro name of the body, e.g. "metricbus.Metrics"
    body: dict[str, Any]
    fingerprint: bytes  #: writer schema of the record it arrived in


def decode_events(codec: Codec, value: bytes) -> list[Event]:
    """Decode one EventBatch record into its events; raises SchemaError for anything else."""
    name, batch = codec.decode(value)
    if name != "EventBatch":
        raise SchemaError(f"expected an EventBatch record on the events topic, got a {name}")
    run_id = batch["run_id"]
    producer_id = batch["producer_id"]
    fingerprint = bytes(value[2:10])
    new = tuple.__new__  # skips the NamedTuple's Python-level __new__: a third of this loop's time
    return [
        new(Event, (run_id, producer_id, e["seq"], e["ts_ms"], e["body"][0], e["body"][1], fingerprint))
        for e in batch["events"]
    ]


#: producer_id of events decoded from the aggregates topic (derived series): they carry no
#: seq of their own, so sinks neither deduplicate nor track them.
DERIVED_PRODUCER = "metricbus.stream"


def decode_aggregates(codec: Codec, value: bytes, offset: int = 0) -> list[Event]:
    """Decode one AggregateBatch record into events that sinks take like logged ones.

    Points become Metrics events, one per (step, epoch); each derived histogram a Histogram
    event and each derived table a Table event.
    """
    name, batch = codec.decode(value)
    if name != "AggregateBatch":
        raise SchemaError(f"expected an AggregateBatch record on the aggregates topic, got a {name}")
    run_id = batch["run_id"]
    fingerprint = bytes(value[2:10])
    by_step: dict[tuple[int, int | None], Event] = {}
    for p in batch["points"]:
        key = (p["step"], p["epoch"])
        event = by_step.get(key)
        if event is None:
            body = {"step": p["step"], "epoch": p["epoch"], "rank": 0, "scalars": {}, "samples": {}}
            event = by_step[key] = Event(
                run_id, DERIVED_PRODUCER, offset, p["ts_ms"], METRICS, body, fingerprint
            )
        event.body["scalars"][p["name"]] = p["value"]
    out = list(by_step.values())
    for h in batch["histograms"]:  # v1 records read as v2: empty
        body = {"step": h["step"], "name": h["name"], "edges": h["edges"], "counts": h["counts"], "rank": 0}
        out.append(Event(run_id, DERIVED_PRODUCER, offset, h["ts_ms"], HISTOGRAM, body, fingerprint))
    for t in batch["tables"]:
        body = {"step": t["step"], "name": t["name"], "columns": t["columns"], "rows": t["rows"]}
        out.append(Event(run_id, DERIVED_PRODUCER, offset, t["ts_ms"], TABLE, body, fingerprint))
    return out
