"""Decoded events as sinks see them: one flat tuple per event, envelope fields included."""

from __future__ import annotations

from typing import Any, NamedTuple

from ._codec import Codec
from ._errors import SchemaError


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
    return [
        Event(run_id, producer_id, e["seq"], e["ts_ms"], e["body"][0], e["body"][1], fingerprint)
        for e in batch["events"]
    ]
