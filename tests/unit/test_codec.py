import io
import json
import math

import avro.io
import avro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from fastavro.schema import fingerprint, to_parsing_canonical_form

from metricbus.schemas import (
    HEARTBEAT,
    HISTOGRAM,
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    TABLE,
    BadMagicError,
    Codec,
    ConfigError,
    EncodeError,
    SchemaError,
    TruncatedRecordError,
    UnknownSchemaError,
    default_codec,
    load_versions,
)

BODIES = [
    (
        METRICS,
        {
            "step": 7,
            "epoch": 1,
            "rank": 0,
            "scalars": {"Train/Loss": 0.25, "nan": float("inf")},
            "samples": {"rewards/format_exact": [0.0, 1.0, 0.5]},
            "labels": {"task": "logo_a", "termination": "timeout"},
        },
    ),
    (
        HISTOGRAM,
        {
            "step": 3,
            "name": "rewards/answer_check_hist",
            "edges": [0.0, 0.5, 1.0],
            "counts": [4, 6],
            "rank": 0,
        },
    ),
    (
        RUN_STARTED,
        {
            "project": "p",
            "name": "n",
            "config_json": '{"lr": 0.001}',
            "tags": ["a"],
            "host": "h",
            "pid": 12,
            "git": None,
            "rank": 0,
            "world_size": 1,
        },
    ),
    (RUN_FINISHED, {"status": "finished", "summary": {"final/x_mean": 1.5}}),
    (HEARTBEAT, {"last_step": 10}),
    (
        TABLE,
        {
            "step": 9,
            "name": "rubric_criteria_summary",
            "columns": ["criterion", "mean", "samples", "ok"],
            "rows": [["rubric/clarity", 0.75, 128, True], [None, 1.0, 2, False]],
        },
    ),
]


def batch(events):
    return {
        "run_id": "run-1",
        "producer_id": "p" * 32,
        "sdk_version": "0.1.0",
        "events": [{"seq": i, "ts_ms": 1_700_000_000_000 + i, "body": b} for i, b in enumerate(events)],
        "columns": None,
    }


def test_round_trip_every_body_kind():
    codec = default_codec()
    datum = batch(BODIES)
    name, back = codec.decode(codec.encode("EventBatch", datum))
    assert name == "EventBatch"
    assert back == datum


def test_fingerprints_are_the_spec_s_crc64_in_little_endian_bytes():
    # The Avro spec's fingerprint of the schema "int" (Java SchemaNormalization.parsingFingerprint64),
    # as fastavro gives it: the 8 bytes single-object encoding puts after its marker
    assert bytes.fromhex(fingerprint('"int"', "CRC-64-AVRO")) == (0x7275D51A3F395C8F).to_bytes(8, "little")
    for versions in load_versions().values():
        for v in versions:
            expected = fingerprint(to_parsing_canonical_form(v.raw), "CRC-64-AVRO")
            assert v.fingerprint.hex() == expected and len(v.fingerprint) == 8
    # released versions' fingerprints are in archived records: they never change
    released = {(n, v.version): v.fingerprint.hex() for n, vs in load_versions().items() for v in vs}
    assert released[("EventBatch", 1)] == "f96c8af8888647f5"
    assert released[("AggregateBatch", 1)] == "83eb47c3ca7140cf"
    assert released[("Alert", 1)] == "1d1b6ef4ac93857e"


def _apache(version):
    return avro.schema.parse(json.dumps(version.raw))


def test_bytes_we_write_are_read_by_apache_avro():
    codec = default_codec()
    newest = codec.newest("EventBatch")
    data = codec.encode("EventBatch", batch(BODIES))
    assert data[:2] == b"\xc3\x01" and data[2:10] == newest.fingerprint
    decoded = avro.io.DatumReader(_apache(newest)).read(avro.io.BinaryDecoder(io.BytesIO(data[10:])))
    assert decoded["run_id"] == "run-1"
    assert decoded["events"][0]["body"]["scalars"]["Train/Loss"] == 0.25
    assert decoded["events"][5]["body"]["rows"][0] == ["rubric/clarity", 0.75, 128, True]


def test_bytes_apache_avro_writes_are_read_by_us():
    codec = default_codec()
    newest = codec.newest("EventBatch")
    buf = io.BytesIO()
    datum = {
        "run_id": "r",
        "producer_id": "p",
        "sdk_version": None,
        "events": [
            {
                "seq": 0,
                "ts_ms": 5,
                "body": {
                    "step": 1,
                    "epoch": None,
                    "rank": 0,
                    "scalars": {"a": 2.0},
                    "samples": {},
                    "labels": {"task": "b"},
                },
            },
            {"seq": 1, "ts_ms": 6, "body": {"last_step": None}},
        ],
    }
    avro.io.DatumWriter(_apache(newest)).write(datum, avro.io.BinaryEncoder(buf))
    name, back = codec.decode(b"\xc3\x01" + newest.fingerprint + buf.getvalue())
    assert back["events"][0]["body"] == (
        METRICS,
        {"step": 1, "epoch": None, "rank": 0, "scalars": {"a": 2.0}, "samples": {}, "labels": {"task": "b"}},
    )
    assert back["events"][1]["body"] == (HEARTBEAT, {"last_step": None})


def test_old_version_is_read_with_the_newest_reader():
    codec = default_codec()
    v1 = codec.versions["EventBatch"][0]
    assert v1.version == 1 and codec.newest("EventBatch").version >= 2
    old = dict(batch(BODIES))
    del old["sdk_version"]  # v1 has no such field
    data = codec.encode("EventBatch", old, version=1)
    assert data[2:10] == v1.fingerprint
    _, back = codec.decode(data)
    assert back["sdk_version"] is None  # the default the newer reader fills in
    # v1 has no labels: the newer reader fills in none
    assert back["events"][0]["body"][1]["labels"] == {}
    metrics = {k: v for k, v in old["events"][0]["body"][1].items() if k != "labels"}
    assert back["events"][0]["body"][1] == {**metrics, "labels": {}}
    assert back["events"][1:] == old["events"][1:]


def test_aggregate_batches_decode_into_events_sinks_take_old_and_new():
    from metricbus.schemas import DERIVED_PRODUCER, decode_aggregates

    codec = default_codec()
    point = {"name": "Epoch/AvgLoss", "source": "Train/Loss", "kind": "epoch_mean", "step": 9}
    point |= {"epoch": 0, "value": 0.5, "ts_ms": 1}
    v1 = codec.encode("AggregateBatch", {"run_id": "r", "points": [point]}, version=1)
    old = decode_aggregates(codec, v1)
    (metrics,) = old.events
    assert metrics.kind == METRICS and metrics.body["scalars"] == {"Epoch/AvgLoss": 0.5}
    assert metrics.producer_id == DERIVED_PRODUCER and metrics.seq == -1  # no identity before v3
    assert not old.identified and not old.closes_run
    hist = {"name": "rewards/a_hist", "source": "rewards/a", "step": 10, "edges": [0.0, 0.5, 1.0]}
    hist |= {"counts": [3, 4], "ts_ms": 2}
    table = {"name": "rubric_criteria_summary", "step": 11, "columns": ["criterion", "mean", "samples"]}
    table |= {"rows": [["essay/clarity", 0.75, 12]], "ts_ms": 3}
    v2 = codec.encode(
        "AggregateBatch",
        {"run_id": "r", "points": [point], "histograms": [hist], "tables": [table]},
        version=2,
    )
    kinds = {e.kind: e for e in decode_aggregates(codec, v2).events}
    assert set(kinds) == {METRICS, HISTOGRAM, TABLE}
    assert kinds[HISTOGRAM].body == {
        "step": 10,
        "name": "rewards/a_hist",
        "edges": [0.0, 0.5, 1.0],
        "counts": [3, 4],
        "rank": 0,
    }
    assert kinds[HISTOGRAM].ts_ms == 2
    assert kinds[TABLE].body["rows"] == [["essay/clarity", 0.75, 12]] and kinds[TABLE].body["step"] == 11


def test_aggregate_points_go_as_columns_and_a_v3_record_decodes_the_same():
    from metricbus.schemas import SchemaError, aggregate_points, decode_aggregates, encode_aggregates

    codec = default_codec()
    points = [
        ("Train/Loss_recent_mean", "Train/Loss", "rolling_mean", 9, 0, 0.25, 100),
        ("Train/Loss_ema", "Train/Loss", "ema", 9, 0, 0.5, 100),
        ("Epoch/AvgLoss", "Train/Loss", "epoch_mean", 9, None, float("nan"), 101),
        ("Train/Loss_recent_mean", "Train/Loss", "rolling_mean", 19, 1, -1e300, 200),
    ]
    v4 = encode_aggregates(codec, "r", points, first_seq=5)
    name, batch = codec.decode(v4)
    assert batch["points"] == [] and len(v4) < 300
    got = aggregate_points(batch)
    fields = ("name", "source", "kind", "step", "epoch", "value", "ts_ms")
    assert [tuple(p[f] for f in fields) for p in got][:2] == points[:2] and math.isnan(got[2]["value"])
    assert got[2]["epoch"] is None and got[3]["value"] == -1e300
    records = [dict(zip(fields, p, strict=True)) for p in points]
    v3 = codec.encode("AggregateBatch", {"run_id": "r", "points": records, "first_seq": 5}, version=3)
    old, new = decode_aggregates(codec, v3), decode_aggregates(codec, v4)
    assert [(e.seq, e.ts_ms, e.body["step"]) for e in old.events] == [
        (e.seq, e.ts_ms, e.body["step"]) for e in new.events
    ]
    assert [sorted(e.body["scalars"]) for e in old.events] == [sorted(e.body["scalars"]) for e in new.events]
    columns = batch["point_columns"][1]
    broken = {**columns, "name_index": columns["name_index"][:-4]}  # a point short
    bad = codec.encode("AggregateBatch", {**batch, "point_columns": broken})
    with pytest.raises(SchemaError, match="different numbers of points"):
        decode_aggregates(codec, bad)
    past = {**columns, "kind_index": b"\x09\x00\x00\x00" * 4}
    with pytest.raises(SchemaError, match="kind_index past"):
        decode_aggregates(codec, codec.encode("AggregateBatch", {**batch, "point_columns": past}))


def test_an_aggregate_batch_numbered_past_the_longest_seq_is_refused():
    """Its seqs would not fit the archive's int64 column: the Parquet sink's flush failed for ever."""
    from metricbus.schemas import SchemaError, decode_aggregates, encode_aggregates

    codec = default_codec()
    points = [
        {
            "name": "m",
            "source": "m",
            "kind": "recent_mean",
            "step": s,
            "epoch": None,
            "value": 1.0,
            "ts_ms": 1,
        }
        for s in range(4)
    ]
    last = 2**63 - 1
    assert [
        e.seq
        for e in decode_aggregates(codec, encode_aggregates(codec, "r", points, first_seq=last - 3)).events
    ][-1] == last
    with pytest.raises(SchemaError, match="numbered past 2\\*\\*63 - 1"):
        decode_aggregates(codec, encode_aggregates(codec, "r", points, first_seq=last - 2))


def test_derived_events_are_numbered_from_first_seq_in_the_order_the_schema_states():
    from metricbus.schemas import decode_aggregates, derived_event_count, encode_aggregates

    codec = default_codec()

    def point(name, step, epoch=None, value=1.0):
        return {
            "name": name,
            "source": "x",
            "kind": "mean",
            "step": step,
            "epoch": epoch,
            "value": value,
            "ts_ms": step,
        }

    points = [point("a", 5), point("b", 5), point("a", 6), point("c", 5, epoch=0), point("b", 6)]
    hist = {"name": "h", "source": "x", "step": 6, "edges": [0.0, 1.0], "counts": [2], "ts_ms": 6}
    table = {"name": "t", "step": 6, "columns": ["c"], "rows": [["v"]], "ts_ms": 6}
    n = derived_event_count([(p["step"], p["epoch"]) for p in points], [hist], [table])
    assert n == 5  # (5, None), (6, None), (5, 0), then the histogram and the table
    record = decode_aggregates(
        codec, encode_aggregates(codec, "r", points, [hist], [table], first_seq=40, closes_run=True)
    )
    assert record.identified and record.closes_run and record.run_id == "r"
    assert [e.seq for e in record.events] == [40, 41, 42, 43, 44]
    assert [e.kind for e in record.events] == [METRICS, METRICS, METRICS, HISTOGRAM, TABLE]
    assert [e.body.get("scalars") for e in record.events[:3]] == [
        {"a": 1.0, "b": 1.0},
        {"a": 1.0, "b": 1.0},
        {"c": 1.0},
    ]


@pytest.mark.parametrize("name", sorted(load_versions()))
def test_every_version_is_readable_by_the_newest(name):
    versions = load_versions()[name]
    reader = _apache(versions[-1])
    for older in versions:
        result = ReaderWriterCompatibilityChecker().get_compatibility(reader, _apache(older))
        assert result.compatibility is SchemaCompatibilityType.compatible, (older.path, result.messages)


def test_bad_magic_unknown_fingerprint_truncation_and_trailing_bytes():
    codec = default_codec()
    good = codec.encode("EventBatch", batch(BODIES))
    with pytest.raises(BadMagicError, match="c301"):
        codec.decode(b"\x00\x01" + good[2:])
    with pytest.raises(UnknownSchemaError, match="upgrade"):
        codec.decode(good[:2] + b"\x00" * 8 + good[10:])
    with pytest.raises(TruncatedRecordError):
        codec.decode(good[:5])
    with pytest.raises(TruncatedRecordError):
        codec.decode(good[: len(good) // 2])
    with pytest.raises(SchemaError, match="after its end"):
        codec.decode(good + b"\x00\x00")


def test_wrong_type_is_an_encode_error_naming_the_schema():
    codec = default_codec()
    bad = batch([(METRICS, {"step": "seven", "epoch": None, "rank": 0, "scalars": {}, "samples": {}})])
    with pytest.raises(EncodeError, match="EventBatch"):
        codec.encode("EventBatch", bad)


def test_schema_files_must_be_versioned(tmp_path):
    (tmp_path / "Thing.avsc").write_text('{"type": "record", "name": "Thing", "fields": []}')
    with pytest.raises(ConfigError, match="<Record>.v<N>.avsc"):
        Codec(tmp_path)


def mixed_events(n=300):
    """What a run logs: mostly scalars-only Metrics, with samples, labels, histograms and tables among them."""
    from metricbus.schemas import HISTOGRAM, RUN_STARTED, run_started

    specials = [math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308]
    out = [(0, 1_700_000_000_000, RUN_STARTED, run_started("p", "n", {"lr": 1e-3}))]
    for i in range(1, n):
        body = {
            "step": i if i % 50 else 2**62 + i,
            "epoch": None if i % 3 else i // 3 - 1,  # None and 0 both appear
            "rank": i % 4,
            "scalars": {f"m{i % 7}": 0.1 * i, "Train/Loss": specials[i % len(specials)], "métrique/ü": -i},
            "samples": {},
            "labels": {},
        }
        if i % 11 == 0:
            body["samples"] = {"rewards/x": [0.5, -1.0]}
        if i % 13 == 0:
            body["labels"] = {"task": "logo_a"}
        if i % 17 == 0:
            out.append(
                (
                    i,
                    1_700_000_000_000 + i,
                    HISTOGRAM,
                    {"step": i, "name": "h", "edges": [0.0, 1.0], "counts": [3], "rank": 0},
                )
            )
            continue
        body["scalars"]["-m"] = float(i)
        out.append((i, 1_700_000_000_000 + i, METRICS, body))
    return out


def test_columnar_batches_read_back_every_event_exactly_and_in_order():
    import struct

    from metricbus.schemas import decode_events, encode_events

    codec = default_codec()
    events = mixed_events()
    for columnar in (True, False):
        data = encode_events(codec, "run-1", "p" * 32, events, "0.1.0", columnar=columnar)
        back = decode_events(codec, data)
        assert [(e.seq, e.ts_ms, e.kind) for e in back] == [(s, t, k) for s, t, k, _ in events]
        for (_, _, _, body), e in zip(events, back, strict=True):
            assert e.body.keys() >= body.keys()
            for key, value in body.items():
                if key == "scalars":  # bit for bit: NaN, -0.0, subnormals
                    assert list(e.body[key]) == list(value)
                    assert [struct.pack("<d", v) for v in e.body[key].values()] == [
                        struct.pack("<d", float(v)) for v in value.values()
                    ]
                else:
                    assert e.body[key] == value, key
        _, raw = codec.decode(data)
        if columnar:  # the scalars-only Metrics events are in the columns
            assert raw["columns"] is not None and len(raw["events"]) < len(events) // 4
        else:
            assert raw["columns"] is None and len(raw["events"]) == len(events)


def test_scalars_rows_encode_exactly_as_their_metrics_bodies_in_both_layouts():
    """The producer queues log()'s scalars as SCALARS rows, not dicts: the bytes must read back
    the same events, ints as doubles, labelled rows through the events array, order kept."""
    import struct

    from metricbus.schemas import SCALARS, ScalarRows, decode_events, encode_events

    codec = default_codec()
    rows = []
    for i, event in enumerate(mixed_events()):
        seq, ts, kind, body = event
        if kind == METRICS and not body["samples"] and i % 3:
            labels = {"task": "a"} if i % 7 == 0 else None
            scalars = {**body["scalars"], "int": i}  # an int, as log() passes them on
            epoch = body["epoch"] if i % 2 else i // 4  # some with an epoch, some without
            rows.append((seq, ts, SCALARS, (body["step"], epoch, body["rank"], scalars, labels)))
        else:
            rows.append(event)
    assert any(r[2] == SCALARS and r[3][4] for r in rows) and any(
        r[2] == SCALARS and not r[3][4] for r in rows
    )

    def as_bodies(event):
        seq, ts, kind, body = event
        if kind != SCALARS:
            return event
        step, epoch, rank, scalars, labels = body
        scalars = {k: float(v) for k, v in scalars.items()}
        return (
            seq,
            ts,
            METRICS,
            {
                "step": step,
                "epoch": epoch,
                "rank": rank,
                "scalars": scalars,
                "samples": {},
                "labels": labels or {},
            },
        )

    def bits(e):  # NaN != NaN: compare the doubles bit for bit
        scalars = {k: struct.pack("<d", v) for k, v in e.body.get("scalars", {}).items()}
        return e.seq, e.kind, {**e.body, "scalars": scalars}

    plain = [r for r in rows if r[2] == SCALARS and not r[3][4]]  # the common batch: columns only
    assert len({tuple(r[3][3]) for r in plain}) > 1 and {r[3][1] is None for r in plain} == {True, False}
    for batch in (rows, plain):
        for columnar in (True, False):
            got = decode_events(codec, encode_events(codec, "run-1", "p" * 32, batch, "0.1.0", columnar))
            want = decode_events(
                codec,
                encode_events(codec, "run-1", "p" * 32, [as_bodies(r) for r in batch], "0.1.0", columnar),
            )
            assert [bits(e) for e in got] == [bits(e) for e in want]
            assert all(type(v) is float for e in got if e.kind == METRICS for v in e.body["scalars"].values())
    # the producer's common batch as columns (ScalarRows: one rank, no tuple per event)
    rank = plain[0][3][2]
    one_rank = [r for r in plain if r[3][2] == rank]
    seqs, stamps, _, bodies = zip(*one_rank, strict=True)
    steps, epochs, _, scalars, _ = zip(*bodies, strict=True)
    batch = ScalarRows(seqs, stamps, steps, epochs, rank, scalars)
    assert batch.events() == one_rank
    # ... with each event's names given, as the spooler does, and a batch of one set of names
    # (its name indices packed once): the same events as the general path
    first = tuple(one_rank[0][3][3])
    uniform = [r for r in one_rank if tuple(r[3][3]) == first]
    assert 1 < len(uniform) < len(one_rank)
    cols = [list(c) for c in zip(*((s, t, *b[:2], b[3]) for s, t, _, b in uniform), strict=True)]
    named = ScalarRows(*cols[:4], rank, cols[4], [first] * len(cols[4]))
    flat = [v for d in cols[4] for v in d.values()]
    for rows_, batch_ in (
        (one_rank, batch),
        (one_rank, batch._replace(names=list(map(tuple, scalars)))),
        (uniform, named),
        (uniform, named._replace(values=flat)),  # the values given too, as the spooler does
    ):
        for columnar in (True, False):
            data = encode_events(codec, "run-1", "p" * 32, batch_, "0.1.0", columnar)
            want = encode_events(codec, "run-1", "p" * 32, [as_bodies(r) for r in rows_], "0.1.0", columnar)
            assert [bits(e) for e in decode_events(codec, data)] == [
                bits(e) for e in decode_events(codec, want)
            ]


def test_apache_avro_reads_a_columnar_batch():
    import struct

    from metricbus.schemas import encode_events

    codec = default_codec()
    data = encode_events(codec, "run-1", "p" * 32, mixed_events(40), "0.1.0")
    decoded = avro.io.DatumReader(_apache(codec.newest("EventBatch"))).read(
        avro.io.BinaryDecoder(io.BytesIO(data[10:]))
    )
    columns = decoded["columns"]
    seqs = struct.unpack(f"<{len(columns['seq']) // 8}q", columns["seq"])
    assert seqs[:3] == (1, 2, 3) and "Train/Loss" in columns["names"]


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda c: c.update(seq=c["seq"][:-8]), "differ in length"),
        (lambda c: c.update(values=c["values"][:-3]), "whole number"),
        (lambda c: c.update(counts=b"\xff\xff\xff\xff" + c["counts"][4:]), "add up"),
        (lambda c: c.update(name_index=b"\x63\x00\x00\x00" + c["name_index"][4:]), "outside the names"),
        (lambda c: c.update(names=["a"] * len(c["names"])), "repeats"),
    ],
)
def test_a_hostile_columnar_batch_is_a_schema_error_not_a_crash(damage, why):
    from metricbus.schemas import decode_events, encode_events

    codec = default_codec()
    data = encode_events(codec, "run-1", "p" * 32, [e for e in mixed_events(30) if e[2] == METRICS][:10])
    _, raw = codec.decode(data)
    columns = dict(raw["columns"][1])
    damage(columns)
    bad = codec.encode("EventBatch", {**raw, "columns": columns})
    with pytest.raises(SchemaError, match=why):
        decode_events(codec, bad)


def test_encode_fitting_cuts_batches_to_fit_and_hands_back_what_cannot_go():
    """The one home of cut-to-fit (the producer's spool and `replay --to kafka`): records in
    order, each within the limit; an event too large alone, or one that does not encode, is
    given to ``rejected`` and the rest of its batch still goes."""
    from metricbus.schemas import METRICS, SCALARS, EncodeError, decode_events, encode_fitting

    codec = default_codec()
    big = {"step": 1, "epoch": None, "rank": 0, "scalars": {}, "samples": {"x": [0.5] * 20_000}, "labels": {}}
    events = [(seq, 0, SCALARS, (seq, None, 0, {"loss": float(seq)}, None)) for seq in range(300)]
    events[100] = (100, 0, METRICS, big)  # ~160 KB alone
    events[200] = (200, 0, SCALARS, (200, None, 0, {"loss": "not a number"}, None))
    rejected: list = []
    records = encode_fitting(
        codec, "run-1", "p" * 32, events, 100_000, lambda e, why: rejected.append((e[0], why))
    )
    assert all(len(r) <= 100_000 for r in records) and len(records) > 1
    seqs = [e.seq for r in records for e in decode_events(codec, r)]
    assert seqs == [s for s in range(300) if s not in (100, 200)]
    (first, size), (second, error) = rejected
    assert (first, second) == (100, 200) and size > 100_000 and isinstance(error, EncodeError)
