"""The events topic's two layouts, measured in the same run: one Avro record per event
(``columnar=False``, EventBatch v4's layout) against the columns of EventBatch v5.

A batch is what a training loop's producer sends: BENCH_BATCH events of BENCH_SCALARS scalars
(``Train/metric_<j>``, float values). Reports, per event, the CPU to encode (the producer's
publisher thread) and to decode into events (every consumer), and the bytes on the wire, as
medians of REPEATS; then ratios. No broker: the codec alone. Then the archive sink's write
rate for each layout: records decoded, deduplicated and buffered by the Parquet sink's runtime
(what ``metricbus sink parquet`` does per polled batch), flushed to a zstd Parquet file.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import table  # noqa: E402

BATCH = int(os.environ.get("BENCH_BATCH", 500))
SCALARS = int(os.environ.get("BENCH_SCALARS", 10))
REPEATS = int(os.environ.get("BENCH_REPEATS", 7))
LOOPS = 20


def main() -> None:
    from metricbus.schemas import METRICS, decode_events, default_codec, encode_events

    codec = default_codec()
    events = [
        (
            i,
            1_700_000_000_000 + i,
            METRICS,
            {
                "step": i,
                "epoch": i // 100,
                "rank": 0,
                "scalars": {f"Train/metric_{j}": 0.001 * i + j for j in range(SCALARS)},
                "samples": {},
                "labels": {},
            },
        )
        for i in range(BATCH)
    ]
    results: dict[str, dict[str, list[float]]] = {"records": {}, "columns": {}}
    for _ in range(REPEATS):
        for layout, columnar in (("records", False), ("columns", True)):
            t0 = time.process_time()
            for _ in range(LOOPS):
                data = encode_events(codec, "run", "p" * 32, events, columnar=columnar)
            encode = (time.process_time() - t0) / LOOPS / BATCH * 1e6
            t0 = time.process_time()
            for _ in range(LOOPS):
                back = decode_events(codec, data)
            decode = (time.process_time() - t0) / LOOPS / BATCH * 1e6
            assert [e.body["scalars"] for e in back] == [e[3]["scalars"] for e in events]
            r = results[layout]
            r.setdefault("encode", []).append(encode)
            r.setdefault("decode", []).append(decode)
            r.setdefault("bytes", []).append(len(data) / BATCH)

    paths = {"columns": (True, True), "columns as events": (True, False), "records": (False, False)}
    archive = {
        path: [archive_rate(codec, events, *how) for _ in range(REPEATS)] for path, how in paths.items()
    }

    def med(layout: str, what: str) -> float:
        return statistics.median(results[layout][what])

    print(f"{BATCH} events of {SCALARS} scalars per batch, medians of {REPEATS} runs of {LOOPS} batches")
    for what, unit in (("encode", "µs CPU/event"), ("decode", "µs CPU/event"), ("bytes", "bytes/event")):
        ours = med("columns", what)
        table(
            f"{what} ({unit}; lower is better)",
            [
                ("EventBatch v5 columns", ours, ""),
                ("one Avro record per event (v4 layout)", med("records", what), ""),
            ],
            ours,
            unit,
        )
    ours = statistics.median(archive["columns"])
    table(
        "archive sink: decode + deduplicate + buffer + flush (events/s; higher is better)",
        [
            ("EventBatch v5 columns, buffered as columns", ours, ""),
            (
                "EventBatch v5 columns, an object per event",
                statistics.median(archive["columns as events"]),
                "",
            ),
            ("one Avro record per event (v4 layout)", statistics.median(archive["records"]), ""),
        ],
        ours,
        "events/s",
    )


def archive_rate(codec, events, columnar: bool, as_columns: bool) -> float:  # type: ignore[no-untyped-def]
    """Events/s through the Parquet sink's runtime (``sinks.SinkRunner._process`` without
    Kafka): LOOPS records of BATCH events, then one flush."""
    import tempfile

    from metricbus.schemas import decode_record, encode_events
    from metricbus.sinks import Feeder
    from metricbus.sinks.parquet import ParquetArchive

    records = [
        encode_events(
            codec, "run", "p" * 32, [(seq + k * BATCH, *rest) for seq, *rest in events], columnar=columnar
        )
        for k in range(LOOPS)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        sink = ParquetArchive(Path(tmp))
        sink.open()
        feeder = Feeder(sink, codec)
        t0 = time.perf_counter()
        for record in records:
            logged, columns = decode_record(codec, record)
            feeder.write(feeder.fresh(logged))
            if columns is not None and as_columns and feeder.fresh_columns(columns):
                feeder.write_columns(columns)
            elif columns is not None:
                feeder.write(feeder.fresh(columns.events()))
        sink.flush()
        assert sink.files_written == 1
        return LOOPS * BATCH / (time.perf_counter() - t0)


if __name__ == "__main__":
    main()
