"""The stream job's state split by partition of the events topic, so partitions can move.

Runs are keyed by run id: a run's events are all in one partition, and so is everything derived
from them. Each partition a worker owns has its own :class:`StreamProcessor`. Before a worker
processes a record of a partition, its state must be the partition's state just before that
record. A partition newly assigned is rebuilt: the partition's checkpoint, then the events topic
from the checkpoint's offset up to the group's committed offset. A record the consumer skipped
while the worker held the partition is read from the topic and processed in its place. So the
output equals a single uninterrupted worker's, whatever the rebalances. On revocation the worker
checkpoints the partition and drops it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from metricbus.schemas import Settings

from ._checkpoint import load, partition_path, snapshot
from ._config import StreamConfig
from ._processor import Output, StreamProcessor
from ._rebuild import read_records, replay
from ._rules import Rule

log = logging.getLogger("metricbus.stream")


class PartitionedState:
    """Per-partition processors and the offset each one's state covers up to."""

    def __init__(
        self,
        settings: Settings,
        cfg: StreamConfig | None = None,
        rules: Iterable[Rule] = (),
        directory: Path | None = None,
    ) -> None:
        self.settings = settings
        self.cfg = cfg or StreamConfig()
        self.rules = list(rules)
        self.directory = directory  #: checkpoints (None: never written nor read)
        self.processors: dict[int, StreamProcessor] = {}
        #: per partition, the offset after the last record its state includes
        self.covered: dict[int, int] = {}
        self._checkpointed: dict[int, int] = {}  # partition -> processor.events at its last checkpoint
        self.rebuilds: list[tuple[int, int, int, float]] = []  # (partition, from, records, seconds)

    def new_processor(self) -> StreamProcessor:
        """An empty processor with this worker's config and rules."""
        return StreamProcessor(self.cfg, self.rules)

    @property
    def events(self) -> int:
        """Events held by every partition's state."""
        return sum(p.events for p in self.processors.values())

    async def ensure(self, partition: int, offset: int) -> StreamProcessor:
        """The processor of ``partition``; one not held is rebuilt up to ``offset``.

        A partition comes to a worker at an offset the group processed up to (its committed
        offset): whoever had it published what the records before it derive, so the rebuild
        publishes nothing. A record before what a held state covers is a redelivery: the state
        drops it as a duplicate.
        """
        held = self.processors.get(partition)
        if held is not None:
            return held
        return await self.rebuild(partition, offset)

    async def undelivered(self, partition: int, offset: int) -> list[Any]:
        """The records of a held partition between what its state covers and ``offset``.

        A worker holds a partition's state only while the partition is assigned to it (a
        revocation drops it), so a record it was never given while it held the partition was
        processed by nobody: the consumer lost it (faust-streaming can drop a fetched record it
        finds stale, its flow stopped or the group's generation changed, while its read offset
        moves past it). They are read from the topic (aiokafka's records, in offset order) for
        the caller to process and publish as if delivered.
        """
        covered = self.covered.get(partition)
        if partition not in self.processors or covered is None or offset <= covered:
            return []
        log.warning(
            "partition %d: offsets %d to %d were never delivered to this worker, which held the "
            "partition throughout: reading them from the topic to process them",
            partition,
            covered,
            offset - 1,
        )
        return [r async for r in read_records(self.settings, {partition: (covered, offset)})]

    async def rebuild(self, partition: int, offset: int) -> StreamProcessor:
        """Load the partition's checkpoint and replay the topic up to ``offset``; publishes nothing."""
        started = time.monotonic()
        processor = self.new_processor()
        start = None
        if self.directory is not None:
            start = load(partition_path(self.directory, partition), processor, topic_start=offset == 0)
        if start is None:
            start, processor = 0, self.new_processor()
        replayed = await replay(processor, self.settings, partition, start, offset) if start < offset else 0
        seconds = time.monotonic() - started
        self.processors[partition] = processor
        self.covered[partition] = max(start, offset)
        self._checkpointed[partition] = processor.events if start and not replayed else -1
        self.rebuilds.append((partition, start, replayed, seconds))
        log.info(
            "partition %d: state rebuilt from %s and %d records after it in %.1fs",
            partition,
            f"the checkpoint at offset {start}" if start else "the start of the topic",
            replayed,
            seconds,
        )
        return processor

    def advance(self, partition: int, offset: int) -> None:
        """The record at ``offset`` of ``partition`` was processed."""
        self.covered[partition] = max(self.covered.get(partition, 0), offset + 1)

    def tick(self, now_ms: int) -> list[Output]:
        """What time alone decides, for every partition held (see ``StreamProcessor.tick``)."""
        return [p.tick(now_ms) for p in self.processors.values()]

    def changed(self) -> list[int]:
        """Partitions whose state moved since their last checkpoint."""
        return [p for p, proc in self.processors.items() if proc.events != self._checkpointed.get(p)]

    def snapshot(self, partition: int) -> tuple[bytes, int, int]:
        """(checkpoint bytes, offset, events) of one partition now; take it between two records."""
        processor = self.processors[partition]
        offset = self.covered[partition]
        return snapshot(processor, partition, offset), offset, processor.events

    def checkpointed(self, partition: int, events: int) -> None:
        """The snapshot holding ``events`` of the partition was written."""
        self._checkpointed[partition] = events

    def drop(self, partition: int) -> None:
        """Forget a partition this worker no longer owns."""
        self.processors.pop(partition, None)
        self.covered.pop(partition, None)
        self._checkpointed.pop(partition, None)
