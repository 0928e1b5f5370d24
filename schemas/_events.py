"""Events as every component sees them: one flat tuple per event, envelope fields included.

The one home of the records' shapes: :func:`encode_events` / :func:`decode_events` for the
events topic, :func:`encode_aggregates` / :func:`decode_aggregates` for the aggregates topic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ._codec import HEADER_SIZE, Codec
from ._errors import SchemaError
from ._names import checked_ids

#: Full Avro names of the event body kinds (union branches of RunEvent.body).
METRICS = "metricbus.Metrics"
HISTOGRAM = "metricbus.Histogram"
RUN_STARTED = "metricbus.RunStarted"
RUN_FINISHED = "metricbus.RunFinished"
HEARTBEAT = "metricbus.Heartbeat"
TABLE = "metricbus.Table"
CONFIG_UPDATE = "metricbus.ConfigUpdate"

#: producer_id of the events decoded from the aggregates topic (derived series). Their seqs
#: count per run (not per producer, as logged events' do): deduplicate them by (run, seq).
DERIVED_PRODUCER = "metricbus.stream"


class Event(NamedTuple):
    """One event of the events topic, with where it came from."""

    run_id: str
    producer_id: str
    seq: int
    ts_ms: int
    kind: str  #: full Avro name of the body, e.g. "metricbus.Metrics"
    body: dict[str, Any]
    fingerprint: bytes  #: writer schema of the record it arrived in


#: Events encoded per fastavro call. fastavro holds the GIL for a whole call: a batch of 500
#: twenty-scalar events is ~5 ms in one C call, and a training loop's log() waiting for the GIL
#: meanwhile stalls as long. Cut into chunks, a call is ~0.3 ms and the interpreter can switch
#: between them. The chunks are Avro array blocks of one record, which every reader takes.
#: Each call has a fixed cost (measured, 500 ten-scalar events: 5.2 us/event whole, 5.6 in
#: chunks of 64, 6.0 in chunks of 32: background CPU, not the caller's); 32 because with 64 the
#: log() calls over 1 ms at 20k events/s (GC off, 0.2 ms switch interval) rose from 2-4 to 15.
ENCODE_CHUNK = 32


def encode_events(
    codec: Codec,
    run_id: str,
    producer_id: str,
    events: Iterable[tuple[int, int, str, dict[str, Any]]],
    sdk_version: str | None = None,
) -> bytes:
    """One EventBatch record from ``(seq, ts_ms, kind, body)`` tuples of one producer of one run.

    Raises EncodeError (naming the schema) when a body does not fit its kind.
    """
    items = [{"seq": s, "ts_ms": t, "body": (k, b)} for s, t, k, b in events]
    batch = {"run_id": run_id, "producer_id": producer_id, "sdk_version": sdk_version, "events": items}
    if len(items) <= ENCODE_CHUNK:
        return codec.encode("EventBatch", batch)
    # The envelope with no events ends in the empty array's 0 and then sdk_version; a chunk
    # encoded with empty ids is header, two empty strings, one array block, 0, a null union.
    envelope = codec.encode("EventBatch", {**batch, "events": []})
    tail = (
        1
        + len(codec.encode("EventBatch", {**batch, "run_id": "", "producer_id": "", "events": []}))
        - (HEADER_SIZE + 3)
    )
    blocks = [
        codec.encode("EventBatch", {"run_id": "", "producer_id": "", "sdk_version": None, "events": chunk})[
            HEADER_SIZE + 2 : -2
        ]
        for chunk in (items[i : i + ENCODE_CHUNK] for i in range(0, len(items), ENCODE_CHUNK))
    ]
    return envelope[:-tail] + b"".join(blocks) + envelope[-tail:]


def encode_event(codec: Codec, event: Event) -> bytes:
    """One event as an EventBatch record of its own (archive payloads, dead letters)."""
    return encode_events(codec, event.run_id, event.producer_id, [event[2:6]])  # type: ignore[list-item]


def decode_events(codec: Codec, value: bytes) -> list[Event]:
    """Decode one EventBatch record into its events; raises SchemaError for anything else."""
    name, batch = codec.decode(value)
    if name != "EventBatch":
        raise SchemaError(f"expected an EventBatch record on the events topic, got a {name}")
    run_id = batch["run_id"]
    producer_id = batch["producer_id"]
    checked_ids(run_id, producer_id)
    fingerprint = bytes(value[2:10])
    new = tuple.__new__  # skips the NamedTuple's Python-level __new__: a third of this loop's time
    return [
        new(Event, (run_id, producer_id, e["seq"], e["ts_ms"], e["body"][0], e["body"][1], fingerprint))
        for e in batch["events"]
    ]


def derived_event_count(
    step_epochs: Iterable[tuple[int, int | None]], histograms: Sequence[Any] = (), tables: Sequence[Any] = ()
) -> int:
    """How many events (so how many seqs) an AggregateBatch decodes into.

    ``step_epochs``: the (step, epoch) of each of its points; one Metrics event per distinct pair.
    """
    return len(set(step_epochs)) + len(histograms) + len(tables)


def encode_aggregates(
    codec: Codec,
    run_id: str,
    points: Sequence[Mapping[str, Any]],
    histograms: Sequence[Mapping[str, Any]] = (),
    tables: Sequence[Mapping[str, Any]] = (),
    *,
    first_seq: int,
    closes_run: bool = False,
) -> bytes:
    """One AggregateBatch record; its events are numbered from ``first_seq`` (see the schema)."""
    record = {
        "run_id": run_id,
        "points": list(points),
        "histograms": list(histograms),
        "tables": list(tables),
        "first_seq": first_seq,
        "closes_run": closes_run,
    }
    return codec.encode("AggregateBatch", record)


class DerivedRecord(NamedTuple):
    """One AggregateBatch record, decoded: its events and what the record says of the run."""

    run_id: str
    events: list[Event]
    #: the worker's output for the run's RunFinished: the run's derived series are complete
    closes_run: bool
    #: False for v1/v2 records: their events have seq -1 and cannot be deduplicated
    identified: bool


def decode_aggregates(codec: Codec, value: bytes) -> DerivedRecord:
    """Decode one AggregateBatch record into events that sinks take like logged ones.

    Points become Metrics events, one per (step, epoch) in order of first appearance; then
    each derived histogram a Histogram event and each derived table a Table event. Event i
    has seq ``first_seq + i`` (``-1`` for records written before v3).
    """
    name, batch = codec.decode(value)
    if name != "AggregateBatch":
        raise SchemaError(f"expected an AggregateBatch record on the aggregates topic, got a {name}")
    run_id = batch["run_id"]
    checked_ids(run_id, DERIVED_PRODUCER)
    first = batch["first_seq"]
    fingerprint = bytes(value[2:10])
    by_step: dict[tuple[int, int | None], dict[str, Any]] = {}
    stamps: dict[tuple[int, int | None], int] = {}
    for p in batch["points"]:
        key = (p["step"], p["epoch"])
        body = by_step.get(key)
        if body is None:
            body = by_step[key] = {
                "step": p["step"],
                "epoch": p["epoch"],
                "rank": 0,
                "scalars": {},
                "samples": {},
                "labels": {},
            }
            stamps[key] = p["ts_ms"]
        body["scalars"][p["name"]] = p["value"]
    parts: list[tuple[int, str, dict[str, Any]]] = [(stamps[k], METRICS, b) for k, b in by_step.items()]
    for h in batch["histograms"]:  # v1 records read as v2+: empty
        body = {"step": h["step"], "name": h["name"], "edges": h["edges"], "counts": h["counts"], "rank": 0}
        parts.append((h["ts_ms"], HISTOGRAM, body))
    for t in batch["tables"]:
        body = {"step": t["step"], "name": t["name"], "columns": t["columns"], "rows": t["rows"]}
        parts.append((t["ts_ms"], TABLE, body))
    identified = first >= 0
    events = [
        Event(run_id, DERIVED_PRODUCER, first + i if identified else -1, ts, kind, body, fingerprint)
        for i, (ts, kind, body) in enumerate(parts)
    ]
    return DerivedRecord(run_id, events, batch["closes_run"], identified)
