"""Events as every component sees them: one flat tuple per event, envelope fields included.

The one home of the records' shapes: :func:`encode_events` / :func:`decode_events` for the
events topic, :func:`encode_aggregates` / :func:`decode_aggregates` for the aggregates topic.
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain, repeat
from operator import itemgetter
from typing import Any, NamedTuple

from ._codec import HEADER_SIZE, Codec
from ._errors import EncodeError, SchemaError
from ._names import checked_ids

#: Full Avro names of the event body kinds (union branches of RunEvent.body).
METRICS = "metricbus.Metrics"
HISTOGRAM = "metricbus.Histogram"
RUN_STARTED = "metricbus.RunStarted"
RUN_FINISHED = "metricbus.RunFinished"
HEARTBEAT = "metricbus.Heartbeat"
TABLE = "metricbus.Table"
CONFIG_UPDATE = "metricbus.ConfigUpdate"
#: an image, video, audio clip or text sample, by reference (its bytes are in the media store)
MEDIA = "metricbus.Media"

#: A Metrics event of scalars only as the producer queues it, a tuple rather than a dict per
#: event: body ``(step, epoch, rank, scalars, labels or None)``. :func:`encode_events` writes
#: it as a Metrics event (into the columns when it has no labels); it never leaves the producer.
SCALARS = "metricbus.Metrics#scalars"


class ScalarRows(NamedTuple):
    """A batch of scalars-only Metrics events of one rank, no labels, held as columns.

    What the producer's spooler hands :func:`encode_events` for its common batch (log()'s plain
    numbers): no tuple per event, so encoding a batch leaves the garbage collector nothing to
    promote. :meth:`events` is the same batch as SCALARS events, for the general path.
    """

    seqs: Sequence[int]
    ts_ms: Sequence[int]
    steps: Sequence[int]
    epochs: Sequence[int | None]
    rank: int
    scalars: Sequence[dict[str, float]]
    #: each event's names, ``tuple(scalars[i])``, when the caller has them already (one tuple
    #: object repeated for a batch of one set of names: then it is checked by identity)
    names: Sequence[tuple[str, ...]] | None = None
    #: every event's values in order, ``chain.from_iterable(map(dict.values, scalars))``, when
    #: the caller has them already
    values: Sequence[float] | None = None

    def events(self) -> list[tuple[int, int, str, Any]]:
        """The batch as ``(seq, ts_ms, SCALARS, (step, epoch, rank, scalars, None))`` events."""
        rows = zip(self.steps, self.epochs, repeat(self.rank), self.scalars, repeat(None))
        return list(zip(self.seqs, self.ts_ms, repeat(SCALARS), rows))


#: producer_id of the events decoded from the aggregates topic (derived series). Their seqs
#: count per run (not per producer, as logged events' do): deduplicate them by (run, seq).
DERIVED_PRODUCER = "metricbus.stream"
#: producer_id of the alerts a sink takes from the alerts topic (``sink wandb --alerts``), as
#: events of kind ALERT; their seqs count per run, as derived ones do (seq < 0: none)
ALERTS_PRODUCER = "metricbus.alerts"
#: the kind of such an event (the Alert record's name); never on the events topic
ALERT = "metricbus.Alert"


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
    events: Iterable[tuple[int, int, str, Any]] | ScalarRows,
    sdk_version: str | None = None,
    columnar: bool = True,
) -> bytes:
    """One EventBatch record from ``(seq, ts_ms, kind, body)`` tuples of one producer of one run.

    With ``columnar`` (the default), Metrics events with scalars only (no samples, no labels:
    what training loops log most) go into the record's ``columns`` as packed arrays (about a
    fifth of the CPU to encode and far less to decode than one Avro record per event); the
    rest into ``events``. ``events`` may also be a :class:`ScalarRows` batch (columns as they
    are). Raises EncodeError (naming the schema) when a body does not fit its kind.
    """
    columns = None
    if isinstance(events, ScalarRows):
        if columnar:
            n = len(events.scalars)
            columns = _packed_columns(
                events.seqs,
                events.ts_ms,
                events.steps,
                events.epochs,
                [events.rank] * n,
                events.scalars,
                events.names,
                events.values,
            )
            events = []
        else:
            events = events.events()
    events = events if isinstance(events, list) else list(events)
    if columnar and events:
        flat = [_flat(e) for e in events]
        if any(flat):
            columns = _columns([e for e, f in zip(events, flat, strict=True) if f])
            events = [e for e, f in zip(events, flat, strict=True) if not f]
    events = [(s, t, METRICS, _metrics_body(b)) if k is SCALARS else (s, t, k, b) for s, t, k, b in events]
    items = [{"seq": s, "ts_ms": t, "body": (k, b)} for s, t, k, b in events]
    batch = {
        "run_id": run_id,
        "producer_id": producer_id,
        "sdk_version": sdk_version,
        "events": items,
        "columns": columns,
    }
    if len(items) <= ENCODE_CHUNK:
        return codec.encode("EventBatch", batch)
    # The envelope with no events ends in the empty array's 0, then sdk_version and columns; a
    # chunk encoded with empty ids is header, two empty strings, one array block, 0, two nulls.
    envelope = codec.encode("EventBatch", {**batch, "events": []})
    tail = (
        1
        + len(codec.encode("EventBatch", {**batch, "run_id": "", "producer_id": "", "events": []}))
        - (HEADER_SIZE + 3)
    )
    blocks = [
        codec.encode(
            "EventBatch",
            {"run_id": "", "producer_id": "", "sdk_version": None, "events": chunk, "columns": None},
        )[HEADER_SIZE + 2 : -3]
        for chunk in (items[i : i + ENCODE_CHUNK] for i in range(0, len(items), ENCODE_CHUNK))
    ]
    return envelope[:-tail] + b"".join(blocks) + envelope[-tail:]


#: MetricColumns' epoch of an event logged without one.
NO_EPOCH = -(2**63)
_NO_EPOCH_PACKED = NO_EPOCH.to_bytes(8, "little", signed=True)
_SWAP = sys.byteorder != "little"


def encode_fitting(
    codec: Codec,
    run_id: str,
    producer_id: str,
    events: list[tuple[int, int, str, Any]] | ScalarRows,
    max_bytes: int,
    rejected: Callable[[tuple[int, int, str, Any], EncodeError | int], None],
    sdk_version: str | None = None,
    columnar: bool = True,
) -> list[bytes]:
    """:func:`encode_events` as records of at most ``max_bytes``, in order; none is lost silently.

    A batch that encodes too large is cut in halves until each part fits (a ScalarRows batch
    goes as its events), and one that does not encode is encoded event by event, so one bad
    event does not take its batch with it. An event that cannot be encoded, or is larger than
    ``max_bytes`` alone, is left out and given to ``rejected`` with its EncodeError or its size.
    """

    def fitting(part: list[tuple[int, int, str, Any]]) -> list[bytes]:
        return encode_fitting(codec, run_id, producer_id, part, max_bytes, rejected, sdk_version, columnar)

    try:
        record = encode_events(codec, run_id, producer_id, events, sdk_version, columnar)
    except EncodeError as exc:
        events = events.events() if isinstance(events, ScalarRows) else events
        if len(events) == 1:
            rejected(events[0], exc)
            return []
        return [r for e in events for r in fitting([e])]
    if len(record) <= max_bytes:
        return [record]
    events = events.events() if isinstance(events, ScalarRows) else events
    if len(events) == 1:
        rejected(events[0], len(record))
        return []
    half = len(events) // 2
    return fitting(events[:half]) + fitting(events[half:])


def _packed(code: str, values: Sequence[Any]) -> bytes:
    """``values`` as little-endian ``code``s ("q", "i", "d"): struct packs twice as fast as array.

    Raises TypeError, with struct's reason, for a value that is not such a number or is out of
    its range.
    """
    try:
        return struct.pack(f"<{len(values)}{code}", *values)
    except struct.error as exc:
        raise TypeError(f"{code!r} column: {exc}") from None


def _unpacked(code: str, raw: bytes, what: str) -> list[Any]:
    packed = array.array(code)
    try:
        packed.frombytes(raw)
    except ValueError:
        raise SchemaError(f"columns.{what}: {len(raw)} bytes is not a whole number of values") from None
    if _SWAP:
        packed.byteswap()
    return packed.tolist()


def _flat(event: tuple[int, int, str, Any]) -> bool:
    """Whether an event goes into the columns: scalars only, no labels."""
    kind, body = event[2], event[3]
    if kind is SCALARS:
        return not body[4]
    return kind == METRICS and not body["samples"] and not body.get("labels")


def _metrics_body(
    row: tuple[int, int | None, int, dict[str, float], dict[str, str] | None],
) -> dict[str, Any]:
    step, epoch, rank, scalars, labels = row
    return {
        "step": step,
        "epoch": epoch,
        "rank": rank,
        "scalars": scalars,
        "samples": {},
        "labels": labels or {},
    }


def _columns(events: list[tuple[int, int, str, Any]]) -> dict[str, Any]:
    """The MetricColumns record of Metrics events with scalars only (SCALARS rows or bodies).

    Column by column, each a C-level loop over the events (a Python loop over the events
    building every column at once cost 1.5 us per ten-scalar event; this, 0.6).
    """
    rows = [
        e[3] if e[2] is SCALARS else (e[3]["step"], e[3]["epoch"], e[3]["rank"], e[3]["scalars"], None)
        for e in events
    ]
    seqs, stamps = list(map(itemgetter(0), events)), list(map(itemgetter(1), events))
    steps, epochs, ranks, scalars = (list(map(itemgetter(i), rows)) for i in range(4))
    return _packed_columns(seqs, stamps, steps, epochs, ranks, scalars)


def _packed_columns(
    seqs: Sequence[int],
    stamps: Sequence[int],
    steps: Sequence[int],
    epochs: Sequence[int | None],
    ranks: Sequence[int],
    scalars: Sequence[dict[str, float]],
    keys: Sequence[tuple[str, ...]] | None = None,
    values: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The MetricColumns record of these columns, one value per event in each.

    ``keys``: each event's names (``tuple(scalars[i])``), and ``values``: all their values in
    order, if the caller has them. The name indices of each set of names are packed once per
    batch and repeated.
    """
    names: dict[str, int] = {}
    known: dict[tuple[str, ...], bytes] = {}  # the packed name indices of each set of names seen

    def positions(event_names: tuple[str, ...]) -> bytes:
        found = known.get(event_names)
        if found is None:
            found = known[event_names] = _packed("i", [names.setdefault(k, len(names)) for k in event_names])
        return found

    try:
        keys = list(map(tuple, scalars)) if keys is None else keys
        n = len(keys)
        if keys and keys.count(keys[0]) == n:  # the usual batch: one set of names
            index, counts = positions(keys[0]) * n, _packed("i", [len(keys[0])]) * n
        else:
            index, counts = b"".join(map(positions, keys)), _packed("i", list(map(len, keys)))
        if values is None:
            values = list(chain.from_iterable(map(dict.values, scalars)))
        uniform_rank = ranks.count(ranks[0]) == n if n else True
        return {
            "names": list(names),
            "seq": _packed("q", seqs),
            "ts_ms": _packed("q", stamps),
            "step": _packed("q", steps),
            "epoch": (
                _NO_EPOCH_PACKED * n
                if epochs.count(None) == n
                else _packed("q", [NO_EPOCH if e is None else e for e in epochs])
            ),
            "rank": _packed("i", ranks[:1]) * n if uniform_rank else _packed("i", ranks),
            "counts": counts,
            "name_index": index,
            "values": _packed("d", values),
        }
    except (TypeError, OverflowError) as exc:
        raise EncodeError(f"cannot encode a Metrics event as columns: {exc}") from exc


class ScalarColumns(NamedTuple):
    """The scalars-only Metrics events of one EventBatch record as its columns (decoded, checked).

    For consumers that work a column at a time (the stream worker): no object per event.
    :meth:`events` is the per-event view, what :func:`decode_events` returns for them.
    """

    run_id: str
    producer_id: str
    fingerprint: bytes
    names: list[str]
    seqs: list[int]
    ts_ms: list[int]
    steps: list[int]
    epochs: list[int]  #: NO_EPOCH for an event logged without one
    ranks: list[int]
    counts: list[int]  #: values per event
    name_index: list[int]  #: the name (an index into ``names``) of each value
    values: list[float]
    #: every event logs every name, in the order of ``names`` (the usual record): then name
    #: ``j``'s values are ``values[j::len(names)]``, one per event
    uniform: bool

    def events(self) -> list[Event]:
        """One Metrics event per entry, in order."""
        names, index, values, counts = self.names, self.name_index, self.values, self.counts
        run_id, producer_id, fingerprint = self.run_id, self.producer_id, self.fingerprint
        seqs, stamps, steps, epochs, ranks = self.seqs, self.ts_ms, self.steps, self.epochs, self.ranks
        out = []
        new = tuple.__new__
        labelled: dict[tuple[int, ...], tuple[str, ...]] = {}
        at = 0
        for i in range(len(seqs)):
            end = at + counts[i]
            positions = tuple(index[at:end])
            keys = labelled.get(positions)
            if keys is None:
                keys = labelled[positions] = tuple(names[p] for p in positions)
            scalars = dict(zip(keys, values[at:end], strict=True))
            if len(scalars) != end - at:
                raise SchemaError("columns: a name repeats within one event")
            epoch = epochs[i]
            body = {
                "step": steps[i],
                "epoch": None if epoch == NO_EPOCH else epoch,
                "rank": ranks[i],
                "scalars": scalars,
                "samples": {},
                "labels": {},
            }
            out.append(new(Event, (run_id, producer_id, seqs[i], stamps[i], METRICS, body, fingerprint)))
            at = end
        return out


def _from_columns(
    columns: dict[str, Any], run_id: str, producer_id: str, fingerprint: bytes
) -> ScalarColumns:
    """The columns of a MetricColumns record; SchemaError when its arrays do not fit together."""
    names = columns["names"]
    seqs = _unpacked("q", columns["seq"], "seq")
    stamps = _unpacked("q", columns["ts_ms"], "ts_ms")
    steps = _unpacked("q", columns["step"], "step")
    epochs = _unpacked("q", columns["epoch"], "epoch")
    ranks = _unpacked("i", columns["rank"], "rank")
    counts = _unpacked("i", columns["counts"], "counts")
    index = _unpacked("i", columns["name_index"], "name_index")
    values = _unpacked("d", columns["values"], "values")
    n = len(seqs)
    if not (len(stamps) == len(steps) == len(epochs) == len(ranks) == len(counts) == n):
        raise SchemaError("columns: the per-event arrays differ in length")
    if len(index) != len(values) or sum(counts) != len(values) or (counts and min(counts) < 0):
        raise SchemaError("columns: counts do not add up to the values")
    if index and not 0 <= min(index) <= max(index) < len(names):
        raise SchemaError("columns: a name index is outside the names")
    if len(set(names)) != len(names):
        raise SchemaError("columns: a name repeats in the names")
    k = len(names)
    uniform = counts == [k] * n and index == list(range(k)) * n
    if not uniform:  # a name repeated within one event
        at = 0
        for count in counts:
            if len(set(index[at : at + count])) != count:
                raise SchemaError("columns: a name repeats within one event")
            at += count
    return ScalarColumns(
        run_id,
        producer_id,
        fingerprint,
        names,
        seqs,
        stamps,
        steps,
        epochs,
        ranks,
        counts,
        index,
        values,
        uniform,
    )


def encode_event(codec: Codec, event: Event) -> bytes:
    """One event as an EventBatch record of its own (archive payloads, dead letters)."""
    return encode_events(codec, event.run_id, event.producer_id, [event[2:6]], columnar=False)  # type: ignore[list-item]


def decode_events(codec: Codec, value: bytes) -> list[Event]:
    """Decode one EventBatch record into its events; raises SchemaError for anything else."""
    return all_events(*decode_record(codec, value))


def all_events(events: list[Event], columns: ScalarColumns | None) -> list[Event]:
    """What :func:`decode_record` returned as one list of events, in seq order."""
    if columns is None:
        return events
    if not events:
        return columns.events()
    return sorted(events + columns.events(), key=lambda e: e.seq)  # one producer's events, in seq order


def decode_record(codec: Codec, value: bytes) -> tuple[list[Event], ScalarColumns | None]:
    """One EventBatch record as its events outside the columns, and its columns (or None).

    What :func:`decode_events` returns without an object per columnar event; raises
    SchemaError for anything that is not a well-formed EventBatch.
    """
    name, batch = codec.decode(value)
    if name != "EventBatch":
        raise SchemaError(f"expected an EventBatch record on the events topic, got a {name}")
    run_id = batch["run_id"]
    producer_id = batch["producer_id"]
    checked_ids(run_id, producer_id)
    fingerprint = bytes(value[2:10])
    new = tuple.__new__  # skips the NamedTuple's Python-level __new__: a third of this loop's time
    events = [
        new(Event, (run_id, producer_id, e["seq"], e["ts_ms"], e["body"][0], e["body"][1], fingerprint))
        for e in batch["events"]
    ]
    columns = batch.get("columns")
    if columns is None:
        return events, None
    return events, _from_columns(columns[1], run_id, producer_id, fingerprint)  # (record name, record)


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
    points: Sequence[Sequence[Any]] | Sequence[Mapping[str, Any]],
    histograms: Sequence[Mapping[str, Any]] = (),
    tables: Sequence[Mapping[str, Any]] = (),
    *,
    first_seq: int,
    closes_run: bool = False,
) -> bytes:
    """One AggregateBatch record; its events are numbered from ``first_seq`` (see the schema).

    ``points``: ``(name, source, kind, step, epoch, value, ts_ms)`` tuples (the stream job's
    ``Point``), or mappings with those keys; they go as packed columns (v4).
    """
    if points and isinstance(points[0], Mapping):
        points = [tuple(p[k] for k in _POINT_FIELDS) for p in points]  # type: ignore[call-overload,index]
    record = {
        "run_id": run_id,
        "points": [],
        "point_columns": _point_columns(points) if points else None,  # type: ignore[arg-type]
        "histograms": list(histograms),
        "tables": list(tables),
        "first_seq": first_seq,
        "closes_run": closes_run,
    }
    return codec.encode("AggregateBatch", record)


#: an Aggregate record's fields, in the order of the stream job's Point
_POINT_FIELDS = ("name", "source", "kind", "step", "epoch", "value", "ts_ms")


def _point_columns(points: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The AggregateColumns record of these points (each distinct string once)."""
    names: dict[str, int] = {}
    sources: dict[str, int] = {}
    kinds: dict[str, int] = {}
    try:
        name, source, kind, step, epoch, value, ts = zip(*points, strict=True)  # columns, in C
        if None in epoch:
            epoch = tuple(NO_EPOCH if e is None else e for e in epoch)
        return {
            "name_index": _packed("i", [names.setdefault(x, len(names)) for x in name]),
            "source_index": _packed("i", [sources.setdefault(x, len(sources)) for x in source]),
            "kind_index": _packed("i", [kinds.setdefault(x, len(kinds)) for x in kind]),
            "step": _packed("q", step),
            "epoch": _packed("q", epoch),
            "value": _packed("d", value),
            "ts_ms": _packed("q", ts),
            "names": list(names),
            "sources": list(sources),
            "kinds": list(kinds),
        }
    except (TypeError, ValueError) as exc:
        raise EncodeError(f"cannot encode an AggregateBatch's points: {exc}") from exc


def aggregate_points(batch: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A decoded AggregateBatch's points as Aggregate records (dicts), whichever layout it has.

    SchemaError when its columns disagree (lengths, an index past its table).
    """
    columns = batch.get("point_columns")
    if isinstance(columns, tuple):  # the codec names the records of a union: (name, record)
        columns = columns[1]
    if not columns:
        return list(batch["points"])
    fields = [
        _unpacked(code, columns[f], f)
        for code, f in (("i", "name_index"), ("i", "source_index"), ("i", "kind_index"), ("q", "step"))
    ]
    fields += [_unpacked("q", columns["epoch"], "epoch"), _unpacked("d", columns["value"], "value")]
    fields.append(_unpacked("q", columns["ts_ms"], "ts_ms"))
    n = len(fields[0])
    if any(len(f) != n for f in fields):
        raise SchemaError("point_columns: its fields hold different numbers of points")
    tables = (columns["names"], columns["sources"], columns["kinds"])
    for index, table, what in zip(fields[:3], tables, ("name", "source", "kind"), strict=True):
        if index and not 0 <= min(index) <= max(index) < len(table):
            raise SchemaError(f"point_columns: a {what}_index past its {len(table)} {what}s")
    names, sources, kinds = tables
    return [
        {
            "name": names[a],
            "source": sources[b],
            "kind": kinds[c],
            "step": step,
            "epoch": None if epoch == NO_EPOCH else epoch,
            "value": value,
            "ts_ms": ts,
        }
        for a, b, c, step, epoch, value, ts in zip(*fields, strict=True)
    ]


class DerivedRecord(NamedTuple):
    """One AggregateBatch record, decoded: its events and what the record says of the run."""

    run_id: str
    events: list[Event]
    #: the worker's output for the run's RunFinished: the run's derived series are complete
    closes_run: bool
    #: False for v1/v2 records: their events have seq -1 and cannot be deduplicated
    identified: bool


def decode_alert(codec: Codec, value: bytes) -> dict[str, Any]:
    """One Alert record; SchemaError when it is none, or its run id is unusable (``checked_ids``).

    Every reader of the alerts topic decodes through this: a W&B deliverer opened a run named
    ``..``, and ledgers key by the run id.
    """
    name, alert = codec.decode(value)
    if name != "Alert":
        raise SchemaError(f"a {name} record on the alerts topic")
    checked_ids(alert["run_id"])
    return dict(alert)


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
    for p in aggregate_points(batch):
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
    if identified and first + len(parts) > 2**63:  # the seqs are Avro longs wherever they go next
        raise SchemaError(f"first_seq {first}: its {len(parts)} events would be numbered past 2**63 - 1")
    events = [
        Event(run_id, DERIVED_PRODUCER, first + i if identified else -1, ts, kind, body, fingerprint)
        for i, (ts, kind, body) in enumerate(parts)
    ]
    return DerivedRecord(run_id, events, batch["closes_run"], identified)
