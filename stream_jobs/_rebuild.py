"""Rebuild the processor's state after a restart, from the raw events topic (event sourcing).

Faust resumes from its group's committed offsets, so everything before them must be replayed
into a fresh processor first, publishing nothing (it was published before the crash). This
avoids Faust table changelogs, which the embedded broker breaks twice over: its ListOffsets
LATEST ends recovery early, and it never compacts.

Cost: replay reads the topic from the last checkpoint (``_checkpoint``; every
``checkpoint_interval_s``, 60 s by default), or from its start without one, at the
processor's rate (bench/stream_throughput.py: ~110k events/s on a 2-core machine).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from schemas import SchemaError, Settings, client_options, decode_events, default_codec, fetch_options

from ._checkpoint import load
from ._processor import StreamProcessor

log = logging.getLogger("metricbus.stream")


def committed_offsets(settings: Settings, group_id: str) -> dict[int, int]:
    """The group's committed offset per partition of the events topic (empty for a new group)."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(**client_options(settings), client_id="metricbus-stream-rebuild")
    try:
        offsets = admin.list_group_offsets({group_id: None}).get(group_id, {})
    finally:
        admin.close()
    return {
        tp.partition: om.offset
        for tp, om in offsets.items()
        if tp.topic == settings.topics.events and om.offset > 0
    }


def rebuild(
    processor: StreamProcessor,
    settings: Settings,
    group_id: str,
    checkpoint: Path | None = None,
    timeout_s: float = 600.0,
) -> dict[int, int]:
    """Bring ``processor`` to the state of ``group_id``'s committed offsets.

    Loads ``checkpoint`` (see :mod:`stream_jobs._checkpoint`) if there is a usable one, then
    replays the events topic from its offsets, or from the start, up to the committed offsets;
    outputs are discarded (they were published the first time). Without committed offsets (a
    new group, or a broker that lost its state) nothing is loaded. Returns, per partition, the
    offset the state now covers up to: where the worker's positions start.
    """
    targets = committed_offsets(settings, group_id)
    if not targets:
        return {}
    started = time.monotonic()
    start = (load(checkpoint, processor) if checkpoint is not None else None) or {}
    todo = {p: (start.get(p, 0), end) for p, end in targets.items() if start.get(p, 0) < end}
    replayed = asyncio.run(_replay(processor, settings, todo, timeout_s)) if todo else 0
    log.info(
        "rebuilt stream state from %s and %d records after it in %.1fs",
        f"the checkpoint at offsets {dict(sorted(start.items()))}" if start else "the start of the topic",
        replayed,
        time.monotonic() - started,
    )
    return {**start, **{p: max(start.get(p, 0), end) for p, end in targets.items()}}


async def _replay(
    processor: StreamProcessor, settings: Settings, todo: dict[int, tuple[int, int]], timeout_s: float
) -> int:
    """Feed the records of each partition p in ``[todo[p][0], todo[p][1])`` to ``processor``."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    codec = default_codec()
    consumer = AIOKafkaConsumer(
        **client_options(settings), **fetch_options(settings), enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = {TopicPartition(settings.topics.events, p): bounds for p, bounds in sorted(todo.items())}
        consumer.assign(list(tps))
        for tp, (first, _) in tps.items():
            consumer.seek(tp, first)
        remaining = set(tps)
        replayed = 0
        deadline = time.monotonic() + timeout_s
        while remaining and time.monotonic() < deadline:
            batches: dict[Any, list[Any]] = await consumer.getmany(*remaining, timeout_ms=500)
            for tp, records in batches.items():
                end = tps[tp][1]
                for record in records:
                    if record.offset >= end:
                        remaining.discard(tp)
                        break
                    replayed += 1
                    try:
                        processor.process(decode_events(codec, record.value))
                    except SchemaError:
                        pass  # dead-lettered when it was first consumed
                if await consumer.position(tp) >= end:
                    remaining.discard(tp)
        if remaining:
            log.error("state rebuild stopped before the committed offsets of %s", sorted(map(str, remaining)))
        return replayed
    finally:
        await consumer.stop()
