"""Carry what the consumers have not read across a planned restart of the memory-only broker.

Before ``metricbus up`` restarts the embedded broker to bound its memory, it stops the consumers
and reads (``Unread``), per partition of the events, aggregates and alerts topics, the records from the
oldest position any consumer still needs (its group's last commit; for the events topic also
the stream worker's checkpoint) to the end; after the restart it publishes them again, to the
same partitions. Consumers drop what they already hold by its identity, so nothing is lost
whether or not the producer that sent it is still alive to send it again. The dead-letter
topic starts over (``status`` reads counts from it; the records were already logged).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Collection
from typing import Any

from metricbus.ops._lag import LagProbe, PartitionLag
from metricbus.schemas import MetricbusError, Settings, make_consumer, make_producer, read_topic

log = logging.getLogger("metricbus.up")

#: (topic, partition, offset on the old broker, key, value) of one record to publish again
Record = tuple[str, int, int, bytes | None, bytes]


def committed(settings: Settings) -> dict[str, list[PartitionLag]]:
    """Per group, its committed position and the end of each partition it committed on.

    A group with no commit is left out (consumers commit where their partitions start as soon
    as they are assigned them: ``sinks._loop.ConsumerLoop``). Raises RuntimeError when the
    groups' offsets cannot be read (then nothing may be restarted).
    """
    probe = LagProbe(settings)
    try:
        samples = probe.sample()
    finally:
        probe.close()
    errors = [s.error for s in samples.values() if s.error]
    if errors:
        raise RuntimeError(errors[0])
    out = {
        group: [lag for lag in s.partitions.values() if lag.committed is not None]
        for group, s in samples.items()
    }
    return {group: lags for group, lags in out.items() if lags}


def oldest_needed(
    settings: Settings, checkpoints: dict[int, int], positions: dict[str, list[PartitionLag]] | None = None
) -> dict[str, dict[int, int]]:
    """Per topic and partition, the oldest offset a consumer still needs.

    ``checkpoints``: the stream worker's checkpoint offset per events partition; ``positions``:
    :func:`committed`'s (read now if not given).
    """
    topics = settings.topics
    out: dict[str, dict[int, int]] = {t: {} for t in (topics.events, topics.aggregates, topics.alerts)}
    groups = committed(settings) if positions is None else positions
    for lag in (lag for lags in groups.values() for lag in lags):
        if lag.topic in out and lag.committed is not None:
            held = out[lag.topic].get(lag.partition)
            out[lag.topic][lag.partition] = lag.committed if held is None else min(held, lag.committed)
    for partition, offset in checkpoints.items():
        events = out[topics.events]
        events[partition] = min(events.get(partition, offset), offset)
    return out


def unread_records(
    positions: dict[str, list[PartitionLag]], topic: str, exclude: Collection[str] = ()
) -> tuple[int, int, dict[str, int]]:
    """(unread, total, behind) of ``topic``, from the groups' commits.

    ``unread``: the records some group not in ``exclude`` has still to read (from the oldest
    such commit of each partition to its end); ``total``: the records in the topic; ``behind``:
    per group (all of them), its own backlog.
    """
    ends: dict[int, int] = {}
    needed: dict[int, int] = {}
    behind: dict[str, int] = {}
    for group, lags in positions.items():
        for lag in lags:
            if lag.topic != topic or lag.committed is None:
                continue
            ends[lag.partition] = max(ends.get(lag.partition, 0), lag.end)
            behind[group] = behind.get(group, 0) + max(0, lag.end - lag.committed)
            if group not in exclude:
                needed[lag.partition] = min(needed.get(lag.partition, lag.committed), lag.committed)
    return sum(ends[p] - needed.get(p, ends[p]) for p in ends), sum(ends.values()), behind


def leave_behind(
    positions: dict[str, list[PartitionLag]],
    topic: str,
    leavable: Collection[str],
    must: Collection[str],
    frees: Callable[[int, int], bool],
) -> set[str]:
    """The sink groups a planned restart leaves behind (to catch up from the archive).

    ``must`` (groups not back since the last restart, or still catching up) always; then, while
    ``frees(unread, total)`` says a restart would free too little, the group of ``leavable``
    furthest behind, one at a time. When even leaving all of them would not do, only ``must``:
    the restart is put off anyway, and a group left behind pays a read of its runs.
    """
    leave = set(must) & set(leavable)
    behind = unread_records(positions, topic)[2]
    candidates = sorted(set(leavable) - leave, key=lambda g: -behind.get(g, 0))
    trial = set(leave)
    for group in candidates:
        if frees(*unread_records(positions, topic, trial)[:2]):
            return trial
        trial.add(group)
    return trial if frees(*unread_records(positions, topic, trial)[:2]) else leave


class Unread:
    """The records from per-partition starts to the end of each topic, read in passes.

    Producers may still send while this reads (the consumers are stopped, the training jobs
    are not). ``read`` reads from where the last pass ended until a pass finds nothing new;
    once the broker carries the ``restarting`` marker (``mark_broker_restarting``), one more
    pass takes everything a producer saw confirmed, and what the old broker acknowledges
    after that its producers hold and send again to the new one (``producers._sender``).
    Without the marker, records acknowledged and confirmed after the last pass would be lost
    (a producer that finished in that moment). A partition no group
    committed on is read whole.

    ``holes``: per group left behind (``leave_behind``), per topic and partition where it had
    read to (a partition it has no commit on: from the start). Its records below ``starts``
    are not carried; the runs they belong to (their keys) are collected in ``hole_runs``, each
    with whether the stream worker's record that closes the run was among them.
    """

    def __init__(
        self,
        settings: Settings,
        starts: dict[str, dict[int, int]],
        holes: dict[str, dict[str, dict[int, int]]] | None = None,
    ) -> None:
        self.settings = settings
        self.carry_from = {topic: dict(offsets) for topic, offsets in starts.items()}
        self.holes = holes or {}
        self.starts = {
            topic: {
                p: min([at] + [h.get(topic, {}).get(p, 0) for h in self.holes.values()])
                for p, at in offsets.items()
            }
            for topic, offsets in starts.items()
        }
        self.records: list[Record] = []
        self.hole_runs: dict[str, dict[str, bool]] = {group: {} for group in self.holes}

    def read(self, passes: int = 20) -> None:
        """Read up to ``passes`` passes, until one finds nothing new."""
        for _ in range(passes):
            found = 0
            for topic, offsets in self.starts.items():

                def carried(r: Any, topic: str = topic, offsets: dict[int, int] = offsets) -> bool:
                    if r.offset < offsets.get(r.partition, 0):
                        return False  # read by an earlier pass
                    offsets[r.partition] = r.offset + 1
                    if r.offset < self.carry_from[topic].get(r.partition, 0):
                        self._in_hole(topic, r)
                        return False
                    return True

                for r in read_topic(
                    self.settings, topic, idle_s=0.5, timeout_s=120.0, starts=offsets, keep=carried
                ):
                    self.records.append((topic, r.partition, r.offset, r.key, r.value))
                    found += 1
            if not found:
                break

    def _in_hole(self, topic: str, record: Any) -> None:
        """Note the run of a record some group left behind had not read."""
        from metricbus.schemas import SchemaError, check_run_id, decode_aggregates, default_codec

        try:
            run = check_run_id(bytes(record.key or b"").decode())
        except (UnicodeDecodeError, MetricbusError):
            return  # a record no sink takes (dead-lettered), so none was archived
        closes = False
        if topic == self.settings.topics.aggregates:
            try:
                closes = decode_aggregates(default_codec(), record.value).closes_run
            except SchemaError:
                pass
        for group, hole in self.holes.items():
            if record.offset >= hole.get(topic, {}).get(record.partition, 0):
                runs = self.hole_runs[group]
                runs[run] = runs.get(run, False) or closes


def stored_mb(settings: Settings, records: list[Record]) -> float:
    """About how much of the broker's memory ``records`` take once published (MB).

    Compressed as the training jobs' batches are (``settings.compression``): the values read
    back are decompressed, and zstd stores about a third of them.
    """
    values = [r[4] for r in records]
    if settings.compression == "zstd":
        import zstandard

        compress = zstandard.ZstdCompressor().compress
        return sum(len(compress(v)) for v in values) / 1e6
    if settings.compression == "gzip":
        import zlib

        return sum(len(zlib.compress(v, 1)) for v in values) / 1e6
    return sum(map(len, values)) / 1e6


@dataclasses.dataclass
class Placed:
    """Where :func:`publish` put the carried records on the new broker, per (topic, partition)."""

    #: (offset on the old broker, offset on the new one) of each record's last copy
    moved: dict[tuple[str, int], list[tuple[int, int]]] = dataclasses.field(default_factory=dict)
    #: every offset a copy went to (a record after a refused one in its round goes twice)
    written: dict[tuple[str, int], set[int]] = dataclasses.field(default_factory=dict)

    def position(self, topic: str, partition: int, read_to: int, end: int) -> int | None:
        """Where a consumer that had read the old partition up to ``read_to`` resumes on the new.

        ``end``: the new partition's end offset now. None when that cannot be told: it holds
        records this did not write (a producer's, sent before the carry), so the consumer must
        read it from the start.
        """
        written = self.written.get((topic, partition), set())
        if len(written) != end or (end and (min(written) != 0 or max(written) != end - 1)):
            return None
        return min(
            (new for old, new in self.moved.get((topic, partition), []) if old >= read_to), default=end
        )


def publish(settings: Settings, records: list[Record], attempts: int = 5) -> Placed:
    """Publish ``records`` to their topics and partitions; where each went, once acknowledged.

    Per partition, from the first record that failed on, the rest is sent again (up to
    ``attempts`` rounds): the embedded broker refuses one of two first batches written to a new
    partition at once (UnknownError, "AlreadyExists" in its log), which happens when a training
    job resends its last minute while this publishes. A record that
    got in before the failure may go twice; consumers drop it by its identity.
    Raises the last error when a partition still fails after that.
    """
    placed = Placed()

    async def main() -> None:
        pending: dict[tuple[str, int], list[Record]] = {}
        for record in records:
            pending.setdefault((record[0], record[1]), []).append(record)
        producer = make_producer(
            settings,
            client_id="metricbus-up-carry",
            acks="all",
            compression_type=settings.compression_type,
        )
        try:  # started inside: one that cannot reach the broker is stopped too
            await producer.start()
            for attempt in range(attempts):
                sent = {
                    tp: [await producer.send(t, value=v, key=k, partition=p) for t, p, _, k, v in rs]
                    for tp, rs in pending.items()
                }
                failed: dict[tuple[str, int], list[Record]] = {}
                error: BaseException | None = None
                for tp, futures in sent.items():
                    results = await asyncio.gather(*futures, return_exceptions=True)
                    first = next((i for i, r in enumerate(results) if isinstance(r, BaseException)), None)
                    done = [(rec[2], res) for rec, res in zip(pending[tp], results, strict=True)]
                    placed.written.setdefault(tp, set()).update(
                        res.offset for _, res in done if not isinstance(res, BaseException)
                    )
                    placed.moved.setdefault(tp, []).extend(
                        (old, res.offset) for old, res in done[:first] if not isinstance(res, BaseException)
                    )
                    if first is not None:
                        failed[tp] = pending[tp][first:]
                        error = results[first]
                if not failed:
                    return
                log.warning(
                    "carrying records over the planned restart: %d partition(s) refused a batch (%s); "
                    "sending from there again (attempt %d of %d)",
                    len(failed),
                    error,
                    attempt + 1,
                    attempts,
                )
                pending = failed
                await asyncio.sleep(0.2 * (attempt + 1))
            assert error is not None
            raise error
        finally:
            await producer.stop()

    if records:
        asyncio.run(main())
    return placed


def end_offsets(settings: Settings, placed: Placed) -> dict[tuple[str, int], int]:
    """The end offset now of each partition ``placed`` wrote to.

    A Fetch's high watermark: the embedded broker answers ListOffsets with the last batch's
    base offset + 1 (1 after a carry of 5 records in one batch).
    """
    probe = LagProbe(settings)
    try:
        return probe.ends({tp: max(offsets) for tp, offsets in placed.written.items() if offsets})
    finally:
        probe.close()


def resume_at(
    placed: Placed, positions: dict[str, list[PartitionLag]], ends: dict[tuple[str, int], int]
) -> dict[str, dict[tuple[str, int], int]]:
    """Per group of ``positions`` (its commits on the old broker), where it resumes on the new one.

    ``ends``: :func:`end_offsets`. A partition that cannot be told (``Placed.position``) is left
    out: the group reads it from the start, as a group with no commit does, dropping what it
    already holds.
    """
    out: dict[str, dict[tuple[str, int], int]] = {}
    for group, lags in positions.items():
        for lag in lags:
            key = (lag.topic, lag.partition)
            if lag.committed is None or key not in ends:
                continue
            at = placed.position(lag.topic, lag.partition, lag.committed, ends[key])
            if at is not None:
                out.setdefault(group, {})[key] = at
    return out


def commit(settings: Settings, resume: dict[str, dict[tuple[str, int], int]]) -> None:
    """Commit ``resume``'s positions for their groups (whose consumers are stopped)."""
    from aiokafka import TopicPartition

    async def main() -> None:
        for group, at in resume.items():
            offsets = {TopicPartition(t, p): offset for (t, p), offset in at.items()}
            consumer = make_consumer(
                settings, group_id=group, client_id="metricbus-up-carry", enable_auto_commit=False
            )
            consumer.assign(list(offsets))
            try:
                await consumer.start()
                await consumer.commit(offsets)
            finally:
                await consumer.stop()

    if resume:
        asyncio.run(main())
