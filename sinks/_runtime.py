"""The sink consumer runtime: poll, decode, deduplicate, write, flush, then commit.

One consumer group per sink. Offsets are committed only after the sink's flush returned
(durable), so a crash re-delivers at most what was not yet durable; ``(producer_id, seq)``
then drops what the sink already held. A record that cannot be decoded goes to the
dead-letter topic (reason in its headers) and the sink goes on. A failing flush is retried
with backoff, consuming nothing meanwhile; nothing is committed past data not yet durable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from schemas import (
    Codec,
    Deduper,
    Event,
    SchemaError,
    Settings,
    client_options,
    consumer_group_options,
    decode_aggregates,
    decode_events,
    default_codec,
    fetch_options,
)

from ._protocol import Sink

log = logging.getLogger("metricbus.sink")


@dataclasses.dataclass
class SinkStats:
    """Counters of one sink process."""

    records: int = 0
    events: int = 0
    written: int = 0
    duplicates: int = 0
    deadlettered: int = 0
    flushes: int = 0
    flush_failures: int = 0
    commits: int = 0


class SinkRunner:
    """Runs one sink until :meth:`stop` (call it from the event loop, e.g. a signal handler)."""

    def __init__(
        self,
        sink: Sink,
        settings: Settings,
        *,
        topics: list[str] | None = None,
        group_id: str | None = None,
        flush_interval_s: float = 2.0,
        max_pending_events: int = 200_000,
        codec: Codec | None = None,
    ) -> None:
        self.sink = sink
        self.settings = settings
        #: Topics consumed: the events topic (deduplicated by (producer_id, seq)) and, for sinks
        #: that show derived series, the aggregates topic.
        self.topics = topics or [settings.topics.events]
        self.group_id = group_id or f"{settings.topic_prefix}sink.{sink.name}"
        self.flush_interval_s = flush_interval_s
        self.max_pending_events = max_pending_events
        self.codec = codec or default_codec()
        self.stats = SinkStats()
        self.dedupe = Deduper()
        self._known_runs: set[str] = set()
        self._stopping = asyncio.Event()
        self._consumer: Any = None
        self._producer: Any = None
        self._uncommitted: dict[Any, int] = {}
        self._last_flush = time.monotonic()
        self._gaps_reported: dict[str, int] = {}

    def stop(self) -> None:
        """Ask the loop to flush, commit and return."""
        self._stopping.set()

    async def run(self) -> SinkStats:
        """Consume until stop(); always flushes and commits what it wrote before returning."""
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
        from aiokafka.abc import ConsumerRebalanceListener

        runner = self

        class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                await runner._flush_and_commit()

            async def on_partitions_assigned(self, assigned: Any) -> None:
                log.info("sink %s assigned %s", runner.sink.name, sorted(str(tp) for tp in assigned))

        self.sink.open()
        self._consumer = AIOKafkaConsumer(
            **client_options(self.settings),
            **consumer_group_options(self.settings),
            **fetch_options(self.settings),
            group_id=self.group_id,
            client_id=f"metricbus-sink-{self.sink.name}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=8 * 1024 * 1024,
            metadata_max_age_ms=5000,
        )
        self._producer = AIOKafkaProducer(
            **client_options(self.settings),
            client_id=f"metricbus-sink-{self.sink.name}-dlq",
            enable_idempotence=False,
            acks=1,
        )
        await self._consumer.start()
        await self._producer.start()
        self._consumer.subscribe(self.topics, listener=_Listener())
        log.info("sink %s consuming %s as group %s", self.sink.name, ", ".join(self.topics), self.group_id)
        try:
            while not self._stopping.is_set():
                batches = await self._consumer.getmany(timeout_ms=200, max_records=5000)
                for tp, records in batches.items():
                    await self._process(records)
                    self._uncommitted[tp] = records[-1].offset + 1
                if self._due():
                    await self._flush_and_commit()
            await self._flush_and_commit()
        finally:
            self.sink.close()
            await self._consumer.stop()
            await self._producer.stop()
        return self.stats

    def _due(self) -> bool:
        if self.sink.pending() >= self.max_pending_events:
            return True
        return bool(self._uncommitted) and time.monotonic() - self._last_flush >= self.flush_interval_s

    async def _process(self, records: list[Any]) -> None:
        fresh: list[Event] = []
        for record in records:
            self.stats.records += 1
            derived = record.topic == self.settings.topics.aggregates
            try:
                if derived:
                    fresh.extend(decode_aggregates(self.codec, record.value, record.offset))
                    continue
                events = decode_events(self.codec, record.value)
            except SchemaError as exc:
                await self._deadletter(record, exc)
                continue
            self.stats.events += len(events)
            for event in events:
                if event.run_id not in self._known_runs:
                    self._known_runs.add(event.run_id)
                    for producer, intervals in self.sink.recover(event.run_id).items():
                        self.dedupe.load(producer, intervals)
                if self.dedupe.is_new(event.producer_id, event.seq):
                    fresh.append(event)
        self.stats.duplicates = self.dedupe.duplicates
        if fresh:
            self.sink.write(fresh)
            self.stats.written += len(fresh)

    async def _flush_and_commit(self) -> None:
        backoff = 0.5
        while True:
            try:
                if self.sink.pending():
                    await asyncio.to_thread(self.sink.flush)
                    self.stats.flushes += 1
                break
            except Exception as exc:  # noqa: BLE001 - keep the consumer alive; nothing is committed
                self.stats.flush_failures += 1
                log.error(
                    "sink %s: flush failed (%s); retrying in %.1fs, nothing committed",
                    self.sink.name,
                    exc,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
        self._last_flush = time.monotonic()
        if self._uncommitted:
            offsets, self._uncommitted = self._uncommitted, {}
            try:
                await self._consumer.commit(offsets)
                self.stats.commits += 1
            except Exception as exc:  # noqa: BLE001 - a lost commit only means harmless re-delivery
                log.warning(
                    "sink %s: commit failed (%s); events may be re-delivered and deduplicated",
                    self.sink.name,
                    exc,
                )
        self._report_gaps()

    def _report_gaps(self) -> None:
        for producer, missing in self.dedupe.gaps().items():
            if self._gaps_reported.get(producer) != missing:
                self._gaps_reported[producer] = missing
                log.warning(
                    "sink %s: producer %s has %d events missing so far (gap in seq)",
                    self.sink.name,
                    producer,
                    missing,
                )

    async def _deadletter(self, record: Any, exc: SchemaError) -> None:
        self.stats.deadlettered += 1
        reason = f"{type(exc).__name__}: {exc}"
        log.error(
            "sink %s: record %s[%d]@%d is undecodable (%s); sent to %s",
            self.sink.name,
            record.topic,
            record.partition,
            record.offset,
            reason,
            self.settings.topics.deadletter,
        )
        headers = [
            ("metricbus.reason", reason.encode()),
            ("metricbus.source", f"{record.topic}/{record.partition}/{record.offset}".encode()),
            ("metricbus.consumer", self.group_id.encode()),
        ]
        backoff = 0.5
        while True:
            try:
                await self._producer.send_and_wait(
                    self.settings.topics.deadletter, value=record.value, key=record.key, headers=headers
                )
                return
            except Exception as send_exc:  # noqa: BLE001 - never commit past a record we did not keep
                log.error("dead-letter send failed (%s); retrying in %.1fs", send_exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
