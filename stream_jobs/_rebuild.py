"""Rebuild the processor's state after a restart, from the raw events topic (event sourcing).

Faust resumes from its group's committed offsets, so everything before them must be replayed
into a fresh processor first, publishing nothing (it was published before the crash). This
avoids Faust table changelogs, which the embedded broker breaks twice over: its ListOffsets
LATEST ends recovery early, and it never compacts.

Cost: replay reads the topic from its start (measured by bench/stream_throughput.py at
roughly the bare decode rate). Periodic checkpoints would bound it; not built yet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from schemas import SchemaError, Settings, client_options, decode_events, default_codec, fetch_options

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


def rebuild(processor: StreamProcessor, settings: Settings, group_id: str, timeout_s: float = 600.0) -> int:
    """Replay the events topic up to ``group_id``'s committed offsets into ``processor``.

    Returns how many records were replayed. Outputs are discarded.
    """
    targets = committed_offsets(settings, group_id)
    if not targets:
        return 0
    from aiokafka import AIOKafkaConsumer, TopicPartition

    codec = default_codec()

    async def main() -> int:
        consumer = AIOKafkaConsumer(
            **client_options(settings), **fetch_options(settings), enable_auto_commit=False
        )
        await consumer.start()
        try:
            tps = [TopicPartition(settings.topics.events, p) for p in sorted(targets)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            remaining = set(tps)
            replayed = 0
            deadline = time.monotonic() + timeout_s
            while remaining and time.monotonic() < deadline:
                batches: dict[Any, list[Any]] = await consumer.getmany(*remaining, timeout_ms=500)
                for tp, records in batches.items():
                    for record in records:
                        if record.offset >= targets[tp.partition]:
                            remaining.discard(tp)
                            break
                        replayed += 1
                        try:
                            processor.process(decode_events(codec, record.value))
                        except SchemaError:
                            pass  # dead-lettered when it was first consumed
                    if await consumer.position(tp) >= targets[tp.partition]:
                        remaining.discard(tp)
            if remaining:
                log.error(
                    "state rebuild stopped before the committed offsets of %s", sorted(map(str, remaining))
                )
            return replayed
        finally:
            await consumer.stop()

    started = time.monotonic()
    replayed = asyncio.run(main())
    log.info("rebuilt stream state from %d records in %.1fs", replayed, time.monotonic() - started)
    return replayed
