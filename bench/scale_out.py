"""Scale-out of the stream worker (issue 11), measured on the embedded broker.

1. Events/s of one worker and of two workers in one group over the same input on a topic with
   8 partitions (8 runs, one per partition), in the same run: timed by the Kafka timestamps of
   the first and last output records. This machine has 2 cores, shared by the broker, the
   workers and this script: expect well under 2x.
2. What it takes to move a partition: its state for a run of RUN_EVENTS events (3 scalars
   each), checkpointed, then loaded and replayed by another worker: the checkpoint's size,
   load time, and the replay rate from the topic (what a partition with no checkpoint costs),
   so the largest run a partition's rebuild handles in 10 s.

    .venv/bin/python bench/scale_out.py   (BENCH_EVENTS=160000, BENCH_RUN_EVENTS=1000000)
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_broker, fill  # noqa: E402

N = int(os.environ.get("BENCH_EVENTS", 160_000))
RUN_EVENTS = int(os.environ.get("BENCH_RUN_EVENTS", 1_000_000))
PARTITIONS = 8


def spread_ids(partitions: int) -> list[str]:
    """One run id per partition, by the producer's key partitioner."""
    from kafka.partitioner.default import murmur2

    ids: dict[int, str] = {}
    while len(ids) < partitions:
        candidate = f"bench-{uuid.uuid4().hex[:10]}"
        ids.setdefault((murmur2(candidate.encode()) & 0x7FFFFFFF) % partitions, candidate)
    return [ids[p] for p in range(partitions)]


def workers_rate(settings, tmp: str, count: int, runs: int) -> float:
    """Events/s of ``count`` workers in one group over the filled topic (first to last output)."""
    from metricbus.schemas import default_codec, read_topic

    env = {**os.environ, **settings.to_env()}
    logs = [open(Path(tmp) / f"{settings.topic_prefix}w{i}.log", "wb") for i in range(count)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "metricbus", "worker"], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        for log in logs
    ]
    codec = default_codec()
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            time.sleep(2)
            records = read_topic(settings, settings.topics.aggregates, idle_s=0.5)
            finished = {r.key for r in records if codec.decode(r.value)[1]["closes_run"]}
            if len(finished) >= runs:
                stamps = [r.timestamp for r in records]
                return N / ((max(stamps) - min(stamps)) / 1000)
        raise RuntimeError("the workers did not finish in time")
    finally:
        for proc in procs:
            proc.terminate()
        for proc, log in zip(procs, logs, strict=True):
            proc.wait(30)
            log.close()


def partition_move(settings, tmp: str) -> tuple[int, float, float, float]:
    """(checkpoint bytes, load s, replay s, events replayed) for one run of RUN_EVENTS events."""
    from metricbus.stream_jobs import DEFAULT_RULES, PartitionedState, load_rules
    from metricbus.stream_jobs._checkpoint import load, partition_path, write

    end = _end_offset(settings)
    directory = Path(tmp) / "ckpt"
    owner = PartitionedState(settings, rules=load_rules(DEFAULT_RULES), directory=None)
    t0 = time.perf_counter()
    asyncio.run(owner.rebuild(0, end))  # no checkpoint: the whole partition from the topic
    replay_s = time.perf_counter() - t0
    data, offset, _ = owner.snapshot(0)
    write(partition_path(directory, 0), data)
    newcomer = PartitionedState(settings, rules=load_rules(DEFAULT_RULES), directory=directory)
    t0 = time.perf_counter()
    loaded = load(partition_path(directory, 0), newcomer.new_processor())
    load_s = time.perf_counter() - t0
    assert loaded == offset == end
    return len(data), load_s, replay_s, owner.processors[0].events


def _end_offset(settings) -> int:
    from kafka import KafkaConsumer, TopicPartition

    from metricbus.schemas import client_options

    consumer = KafkaConsumer(**client_options(settings))
    tp = TopicPartition(settings.topics.events, 0)
    consumer.assign([tp])
    consumer.seek_to_end(tp)
    end = consumer.position(tp)
    consumer.close()
    return int(end)


def main() -> None:
    from metricbus.schemas import Settings, ensure_topics

    with bench_broker() as (tmp, broker):
        rates = {}
        ids = spread_ids(PARTITIONS)
        for count in (1, 2):
            settings = Settings(
                bootstrap=broker.bootstrap,
                data_dir=Path(tmp) / f"d{count}",
                topic_prefix=f"s{count}.",
                partitions=PARTITIONS,
            )
            ensure_topics(settings)
            for run_id in ids:
                fill(settings, N // PARTITIONS, run_id)
            rates[count] = workers_rate(settings, tmp, count, PARTITIONS)
        one = Settings(bootstrap=broker.bootstrap, data_dir=Path(tmp) / "m", topic_prefix="m.", partitions=1)
        ensure_topics(one)
        fill(one, RUN_EVENTS, "bench-move")
        size, load_s, replay_s, events = partition_move(one, tmp)
    print(f"{N:,} events (3 scalars each) in 8 runs over {PARTITIONS} partitions")
    print(f"  1 worker : {rates[1]:>10,.0f} events/s")
    print(
        f"  2 workers: {rates[2]:>10,.0f} events/s   {rates[2] / rates[1]:.2f}x"
        " (2 cores, shared with the broker)"
    )
    rate = events / replay_s
    print(f"moving a partition holding one run of {events:,} events:")
    print(f"  checkpoint {size / 1e3:.1f} kB, loaded in {load_s * 1000:.1f} ms")
    print(f"  replay from the topic without a checkpoint: {replay_s:.1f} s ({rate:,.0f} events/s)")
    print(
        f"  a rebuild within 10 s: any run with a checkpoint (load {load_s:.2f} s + the events since it),"
        f" or {rate * 10:,.0f} events from the topic's start"
    )


if __name__ == "__main__":
    main()
