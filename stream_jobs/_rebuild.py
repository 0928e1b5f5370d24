"""Rebuild one partition's state from the raw events topic (event sourcing).

A worker that takes a partition over (at start, or in a rebalance) loads the partition's last
checkpoint (``_checkpoint``) and replays the events topic from its offset up to where the group
stands, publishing nothing (it was published before). This avoids Faust table changelogs, which
the embedded broker breaks twice over: its ListOffsets LATEST ends recovery early, and it never
compacts.

Cost: replay reads the partition from its last checkpoint (every ``checkpoint_interval_s``,
60 s by default, and at each revocation), or from its start without one, at the processor's
rate (``bench/stream_throughput.py`` reports it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from metricbus.schemas import (
    SchemaError,
    Settings,
    decode_record,
    default_codec,
    make_admin,
    make_consumer,
)

from ._processor import StreamProcessor

log = logging.getLogger("metricbus.stream")


def committed_offsets(settings: Settings, group_id: str) -> dict[int, int]:
    """The group's committed offset per partition of the events topic (empty for a new group)."""
    admin = make_admin(settings, "metricbus-stream-rebuild", timeout_s=30.0)
    try:
        offsets = admin.list_group_offsets({group_id: None}).get(group_id, {})
    finally:
        admin.close()
    return {
        tp.partition: om.offset
        for tp, om in offsets.items()
        if tp.topic == settings.topics.events and om.offset > 0
    }


async def replay(
    processor: StreamProcessor,
    settings: Settings,
    partition: int,
    first: int,
    end: int,
    timeout_s: float = 600.0,
) -> int:
    """Feed the records of ``partition`` in ``[first, end)`` to ``processor``; how many there were."""
    return await _replay(processor, settings, {partition: (first, end)}, timeout_s)


async def _replay(
    processor: StreamProcessor, settings: Settings, todo: dict[int, tuple[int, int]], timeout_s: float
) -> int:
    """Feed the records of each partition p in ``[todo[p][0], todo[p][1])`` to ``processor``."""
    codec, signer = default_codec(), settings.signer
    replayed = 0
    async for record in read_records(settings, todo, timeout_s):
        replayed += 1
        try:
            signer.check(record.value)
            processor.process_record(*decode_record(codec, record.value))
        except SchemaError:
            pass  # dead-lettered when it was first consumed
    return replayed


async def read_records(
    settings: Settings, todo: dict[int, tuple[int, int]], timeout_s: float = 600.0
) -> AsyncIterator[Any]:
    """The raw records (aiokafka's) of each partition p of the events topic in ``[todo[p][0], todo[p][1])``.

    In offset order within a partition; read by a consumer of no group, so nothing is committed.
    """
    from aiokafka import TopicPartition

    consumer = make_consumer(settings, client_id="metricbus-stream-rebuild")
    try:  # started inside: one that cannot reach the broker is stopped too
        await consumer.start()
        tps = {TopicPartition(settings.topics.events, p): bounds for p, bounds in sorted(todo.items())}
        consumer.assign(list(tps))
        for tp, (first, _) in tps.items():
            consumer.seek(tp, first)
        remaining = set(tps)
        deadline = time.monotonic() + timeout_s
        while remaining and time.monotonic() < deadline:
            batches: dict[Any, list[Any]] = await consumer.getmany(*remaining, timeout_ms=500)
            for tp, records in batches.items():
                end = tps[tp][1]
                for record in records:
                    if record.offset >= end:
                        remaining.discard(tp)
                        break
                    yield record
                if await consumer.position(tp) >= end:
                    remaining.discard(tp)
        if remaining:
            log.error("reading %s stopped before the offsets asked for", sorted(map(str, remaining)))
    finally:
        await consumer.stop()
