"""Stream job throughput and latency, beside a bare aiokafka + fastavro loop over the same topic.

1. Fill two topics with N events each (EventBatch records as the producer hook writes them: a
   record holds what a tight loop logs in the producer's linger time, a few hundred events):
   one in EventBatch v5's columns, one with a record per event (the v4 layout, "records").
2. Events/s of: the bare loop (consume + decode only) over each; the same loop feeding the
   full StreamProcessor (every statistic and every default rule; no Faust); and the Faust
   worker (`metricbus worker`), timed by the Kafka timestamps of its first and last output
   records. Ratios are to the bare loop over the records layout (the issue's baseline).
3. Latency from run.log() to the aggregate and to the alert on their topics, with the
   worker running and a producer logging at a steady rate (each of RATES events/s) for
   SECONDS seconds (at least LATENCY_EVENTS events).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_broker, fill  # noqa: E402

N = int(os.environ.get("BENCH_EVENTS", 200_000))
REPEATS = int(os.environ.get("BENCH_REPEATS", 3))
RATES = [int(r) for r in os.environ.get("BENCH_RATES", "10,100,1000,10000").split(",")]
SECONDS = int(os.environ.get("BENCH_SECONDS", 10))
LATENCY_EVENTS = 300  # at least, at each rate (30 s at 10 events/s)


RECORDS: dict[bool, int] = {}  # records read by the last consume(): the input's batching


def consume(settings, with_processor: bool) -> float:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from metricbus.schemas import client_options, decode_record, default_codec, fetch_options
    from metricbus.stream_jobs import DEFAULT_RULES, StreamProcessor, load_rules

    codec = default_codec()
    processor = StreamProcessor(rules=load_rules(DEFAULT_RULES)) if with_processor else None

    async def main() -> float:
        c = AIOKafkaConsumer(
            **client_options(settings),
            **fetch_options(settings),
            enable_auto_commit=False,
            max_partition_fetch_bytes=8 << 20,
        )
        await c.start()
        tps = [
            TopicPartition(settings.topics.events, p)
            for p in sorted(c.partitions_for_topic(settings.topics.events))
        ]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        seen, t0 = 0, time.perf_counter()
        while seen < N:
            for records in (await c.getmany(timeout_ms=500, max_records=10_000)).values():
                RECORDS[with_processor] = RECORDS.get(with_processor, 0) + len(records)
                for r in records:
                    events, columns = decode_record(codec, r.value)  # as the worker does
                    seen += len(events) + (len(columns.seqs) if columns is not None else 0)
                    if processor is not None:
                        processor.process_record(events, columns)
        elapsed = time.perf_counter() - t0
        await c.stop()
        return N / elapsed

    return asyncio.run(main())


def faust_worker(settings, tmp: str, config: Path | None = None) -> float:
    from metricbus.schemas import read_topic

    env = {**os.environ, **settings.to_env()}
    log = open(Path(tmp) / "worker.log", "wb")
    options = ["--config", str(config)] if config else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "metricbus", "worker", *options], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    try:
        from kafka import KafkaConsumer, TopicPartition

        from metricbus.schemas import client_options, default_codec

        codec = default_codec()
        # the end offset is watched (one small request a second): reading and decoding the
        # output while the worker writes it took CPU from the worker and the broker on 2 cores
        watcher = KafkaConsumer(**client_options(settings))
        tp = TopicPartition(settings.topics.aggregates, 0)  # the bench's topics have one partition
        deadline, end, still = time.monotonic() + 300, 0, 0
        try:
            while time.monotonic() < deadline:
                time.sleep(1)
                now = watcher.end_offsets([tp])[tp]
                still = still + 1 if now == end and now > 0 else 0
                end = now
                if still < 2:
                    continue
                out = read_topic(settings, settings.topics.aggregates, idle_s=0.5)
                if out and codec.decode(out[-1].value)[1]["closes_run"]:  # the run's end
                    stamps = [r.timestamp for r in out]
                    return N / ((max(stamps) - min(stamps)) / 1000)
        finally:
            watcher.close()
        raise RuntimeError("the worker did not finish in time")
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def latency(settings, tmp: str, rate: int) -> tuple[list[tuple[int, float]], list[float], list[float]]:
    from metricbus.producers import Run
    from metricbus.schemas import (
        METRICS,
        aggregate_points,
        all_events,
        decode_record,
        default_codec,
        read_topic,
    )

    env = {**os.environ, **settings.to_env()}
    log = open(Path(tmp) / "worker-latency.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "metricbus", "worker"], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    try:
        time.sleep(8)  # joined and idle
        run = Run("latency", settings=settings, system_metrics=False)
        interval = 1.0 / rate
        start = time.perf_counter()
        for i in range(max(rate * SECONDS, LATENCY_EVENTS)):
            while time.perf_counter() < start + i * interval:
                time.sleep(interval / 4)
            loss = float("nan") if i % 1000 == 999 else 1.0 / (i + 1)
            run.log({"Train/Loss": loss}, step=i)
        run.finish(timeout=30)
        time.sleep(5)
        codec = default_codec()
        agg = [  # (when logged, latency): the first second after a quiet spell is told apart
            (p["ts_ms"], r.timestamp - p["ts_ms"])
            for r in read_topic(settings, settings.topics.aggregates)
            for p in aggregate_points(codec.decode(r.value)[1])
            if r.key == run.run_id.encode()
        ]
        alerts = [
            r.timestamp - codec.decode(r.value)[1]["ts_ms"]
            for r in read_topic(settings, settings.topics.alerts)
            if r.key == run.run_id.encode()
        ]
        sent = [  # the producer's part: log() -> its record sent (the record's creation time)
            r.timestamp - e.ts_ms
            for r in read_topic(settings, settings.topics.events)
            if r.key == run.run_id.encode()
            for e in all_events(*decode_record(codec, r.value))
            if e.kind == METRICS
        ]
        return agg, alerts, sent
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    from metricbus.schemas import Settings, ensure_topics

    bare, columns, full, worker, unsmoothed = [], [], [], [], []
    with bench_broker() as (tmp, broker):
        plain_config = Path(tmp) / "unsmoothed.yaml"
        plain_config.write_text("metric_stats: []\n")  # no smoothed series: what the default costs
        for r in range(REPEATS):
            records = Settings(
                bootstrap=broker.bootstrap, data_dir=Path(tmp) / f"r{r}", topic_prefix=f"r{r}.", partitions=1
            )
            settings = dataclasses.replace(records, data_dir=Path(tmp) / f"c{r}", topic_prefix=f"c{r}.")
            plain = dataclasses.replace(records, data_dir=Path(tmp) / f"n{r}", topic_prefix=f"n{r}.")
            for s, columnar in ((records, False), (settings, True), (plain, True)):
                ensure_topics(s)
                fill(s, N, columnar=columnar)
            RECORDS.clear()
            bare.append(consume(records, with_processor=False))
            columns.append(consume(settings, with_processor=False))
            full.append(consume(settings, with_processor=True))
            worker.append(faust_worker(settings, tmp))
            unsmoothed.append(faust_worker(plain, tmp, plain_config))
        latencies = {}
        for rate in RATES:
            lat_settings = dataclasses.replace(
                settings, topic_prefix=f"lat{rate}.", data_dir=Path(tmp) / f"lat{rate}"
            )
            ensure_topics(lat_settings)
            latencies[rate] = latency(lat_settings, tmp, rate)
    # each run's ratio to the bare loop over records measured in the same run (the machine's
    # speed drifts between runs), then the median and the range of those ratios
    per_record = N / RECORDS[False]
    print(f"{N:,} events (3 scalars each) in records of ~{per_record:.0f} events, {REPEATS} runs")
    print(f"  {'':<48}{'events/s (median)':>18}   ratio to bare records: median [min-max]")
    for label, values, note in (
        ("bare aiokafka + decode, records (v4 layout)", bare, ""),
        ("bare aiokafka + decode, columns (v5)", columns, ""),
        ("+ StreamProcessor (all stats and rules), columns", full, ""),
        ("metricbus worker (Faust, end to end), columns", worker, "  (target >= 3x)"),
        ("  the same with no smoothed series (metric_stats: [])", unsmoothed, ""),
    ):
        ratios = sorted(x / y for x, y in zip(values, bare, strict=True))
        ratio = f"{statistics.median(ratios):.2f}x [{ratios[0]:.2f}-{ratios[-1]:.2f}]"
        print(f"  {label:<48}{statistics.median(values):>18,.0f}   {ratio}{note}")
    cost = sorted(1 - w / u for w, u in zip(worker, unsmoothed, strict=True))
    print(
        f"  the default smoothing (a _recent_mean and an _ema point every 10 values) costs the worker "
        f"{statistics.median(cost):.0%} of its events/s [{cost[0]:.0%} to {cost[-1]:.0%}]"
    )
    print("latency, run.log() -> the derived point / the alert on its topic (ms; target p99 <= 50):")
    print("  (the run starts after 8 s of quiet: the worker is on its idle fetch wait, and on the")
    print("  embedded broker the first second's points wait for it; 'after 1 s' leaves them out)")
    for rate, (timed, alerts, sent) in latencies.items():
        agg = [lat for _, lat in timed]
        first = min((t for t, _ in timed), default=0)
        steady = [lat for t, lat in timed if t >= first + 1000]
        start = [lat for t, lat in timed if t < first + 1000]
        print(
            f"  {rate:>6,} events/s: aggregates p50 {pct(agg, 0.5):.0f} p99 {pct(agg, 0.99):.0f} "
            f"(n={len(agg)}), after 1 s p99 {pct(steady, 0.99):.0f}, the first second's max "
            f"{max(start, default=float('nan')):.0f}; alerts p50 {pct(alerts, 0.5):.0f} "
            f"p99 {pct(alerts, 0.99):.0f} (n={len(alerts)}); of which log() -> sent "
            f"p50 {pct(sent, 0.5):.0f} p99 {pct(sent, 0.99):.0f}"
        )


if __name__ == "__main__":
    main()
