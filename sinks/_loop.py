"""One consumer group's loop under every sink and alert deliverer: poll, slice, flush, commit.

Dead letters, rebalances and a clean stop are its too.

Offsets are committed only after the flush returned (durable), so a crash re-delivers at most
what was not yet durable. A destination's writes and flushes run in threads, never beside each
other (the flush lock), so the consumer's heartbeats go on meanwhile; a rebalance waits for a
write under way, flushes and commits before the partitions move, and a slice taken before it is
not written after it (:meth:`ConsumerLoop._owned_write`). Subclasses say what records mean
(``_process``) and how to make them durable (``flush``): ``_runtime.SinkRunner``,
``alerts.AlertRunner``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from metricbus.schemas import FetchWait, LoopMetrics, Settings, make_consumer, make_producer

from ._commits import Commits
from ._deadletters import DeadLetters
from ._protocol import RunHeld, Unavailable

T = TypeVar("T")

log = logging.getLogger("metricbus.sink")

#: A poll's records are processed in slices of about this many bytes of record values
#: (~20,000 ten-scalar events), each slice committable once processed. A poll of a consumer far
#: behind returns tens of MB of records: as one batch, every decoded event of it would be in
#: memory at once, and a slow sink (the W&B sink spends ~0.3 ms an event in wandb's own log())
#: would not hear a stop within `metricbus up`'s 30 s (bench/soak.py measures both).
SLICE_BYTES = 2 * 1024 * 1024


@dataclasses.dataclass
class SinkStats:
    """Counters of one sink process."""

    records: int = 0
    events: int = 0
    written: int = 0
    duplicates: int = 0
    deadlettered: int = 0
    forged: int = 0  #: records repeating taken events with other bytes (dead-lettered too)
    rejected: int = 0
    flushes: int = 0
    flush_failures: int = 0
    commits: int = 0
    unavailable: int = 0  #: times the destination could take nothing (see ``Unavailable``)


class Interrupted(Exception):  # noqa: N818 - an outcome, not a failure
    """Raised by ``_process`` when the loop stops mid-slice: the slice is not taken.

    Nothing of it is committed, so the next process reads it again (what was already done
    is dropped by its identity).
    """


class ConsumerLoop:
    """One consumer group's loop: poll, process, flush, then commit; dead letters; clean stop.

    Subclasses say what a batch of records means (:meth:`_process`) and how to make it
    durable (:meth:`flush`); the loop never commits an offset before that flush returned.
    """

    def __init__(
        self,
        settings: Settings,
        topics: list[str],
        group_id: str,
        name: str,
        *,
        flush_interval_s: float = 2.0,
    ) -> None:
        self.settings = settings
        self.topics = topics
        self.group_id = group_id
        self.name = name
        self.flush_interval_s = flush_interval_s
        self.stats = SinkStats()
        self.metrics = LoopMetrics("consumer", group_id)
        self._stopping = asyncio.Event()
        self._consumer: Any = None
        self._producer: Any = None
        self._uncommitted: dict[Any, int] = {}
        self.commits = Commits(settings, group_id, name)
        self.dead_letters = DeadLetters(settings, group_id, name, self._stopping, self.stats)
        self._last_flush = time.monotonic()
        self._flush_lock = asyncio.Lock()
        #: bumped at each revocation: a write prepared before one is refused (:meth:`_owned_write`)
        self._generation = 0
        self._unavailable_backoff = 0.0  #: seconds to wait after the destination was unavailable

    # -- what a subclass says -----------------------------------------------------------

    def open(self) -> None:
        """Before consuming."""

    def close(self) -> None:
        """After the last commit (also after a failure)."""

    def pending(self) -> int:
        """How much is taken but not yet durable (0: nothing to flush)."""
        return 0

    def flush(self) -> None:
        """Make durable what :meth:`_process` took (runs in a thread)."""

    def due(self) -> bool:
        """Whether to flush and commit now."""
        return bool(self._uncommitted) and time.monotonic() - self._last_flush >= self.flush_interval_s

    async def _process(self, records: list[Any]) -> None:
        raise NotImplementedError

    def _after_commit(self) -> None:
        """After each flush and commit."""

    # -- the loop -----------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to flush, commit and return."""
        self._stopping.set()

    async def run(self) -> SinkStats:
        """Consume until stop(); always flushes and commits what it took before returning."""
        from aiokafka.abc import ConsumerRebalanceListener

        loop = self

        class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                await loop._revoked(revoked)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                log.info("%s assigned %s", loop.name, sorted(str(tp) for tp in assigned))
                await loop._assigned(assigned)

        self.open()
        self._consumer = make_consumer(
            self.settings, group_id=self.group_id, client_id=f"metricbus-{self.name}"
        )
        self._producer = make_producer(self.settings, client_id=f"metricbus-{self.name}-dlq")
        self.commits.consumer, self.commits.producer = self._consumer, self._producer
        self.dead_letters.producer = self._producer
        try:
            await self._consumer.start()
            await self._producer.start()
            await self._before_join()
            if self._stopping.is_set():
                return self.stats
            self._consumer.subscribe(self.topics, listener=_Listener())
            log.info("%s consuming %s as group %s", self.name, ", ".join(self.topics), self.group_id)
            beating = asyncio.ensure_future(self.commits.say_alive())
            wait = FetchWait.of_aiokafka(self._consumer, self.settings)
            try:
                while not self._stopping.is_set():
                    batches = await self._consumer.getmany(timeout_ms=200, max_records=5000)
                    records = [r for records in batches.values() for r in records]
                    wait.saw(len(records))
                    await self._process_sliced(records)
            finally:
                beating.cancel()
            await self._flush_and_commit()
        finally:
            self.close()
            await self._consumer.stop()
            await self._producer.stop()
        return self.stats

    async def _process_sliced(self, records: list[Any]) -> None:
        """Process a poll's records a slice (:data:`SLICE_BYTES`) at a time; flush when due.

        Each slice's offsets become committable once it is processed, and a stop asked for
        meanwhile is heeded between slices: the rest of the poll is not committed, so the next
        process reads it again.
        """
        from aiokafka import TopicPartition

        start = 0
        while start < len(records):
            end, size = start, 0
            while end < len(records) and (end == start or size < SLICE_BYTES):
                size += len(records[end].value or b"")
                end += 1
            try:
                await self._process(records[start:end])
            except Interrupted as why:
                log.info("%s: %s", self.name, why)
                return
            except Unavailable as why:
                await self._wait_out(why)
                return
            if self._unavailable_backoff:
                self._unavailable_backoff = 0.0
                if self.metrics.failing(False):
                    log.warning("%s: its destination writes again", self.name)
            for record in records[start:end]:
                self._uncommitted[TopicPartition(record.topic, record.partition)] = record.offset + 1
            self._after_slice(records[start:end])
            start = end
            if self.due():
                await self._flush_and_commit()
            await asyncio.sleep(0)  # a stop (a signal handler on this loop) can be heard
            if self._stopping.is_set():
                return
        if self.due():
            await self._flush_and_commit()

    def _after_slice(self, records: list[Any]) -> None:
        """After a slice's offsets were marked committable (before any flush)."""

    async def _wait_out(self, why: Unavailable) -> None:
        """The destination cannot take anything now: commit what is durable, read the rest again.

        Nothing is dead-lettered for it. What this process took since its last commit is
        forgotten (as on a rebalance) and read again from the partitions' commits after a
        backoff (1 s doubling to 30 s while it lasts), its identities dropping what the sink
        had made durable meanwhile.
        """
        handover = isinstance(why, RunHeld)  # not the destination: another instance lets go soon
        if not handover:
            self.stats.unavailable += 1
            self.metrics.failing(True)
            self.metrics.update(dataclasses.asdict(self.stats))
        backoff = self._unavailable_backoff = min(max(1.0, self._unavailable_backoff * 2), 30.0)
        say = log.warning if handover else log.error
        say("%s: %s; reading it again in %.0fs, nothing committed past it", self.name, why, backoff)
        await self._flush_and_commit()
        self._released()
        await self.commits.rewind()
        try:
            await asyncio.wait_for(self._stopping.wait(), backoff)
        except asyncio.TimeoutError:
            pass

    def _commit_limits(self) -> dict[Any, int]:
        """Per partition, an offset not to commit past yet (after a flush); none by default."""
        return {}

    async def _before_join(self) -> None:
        """Before the group is joined (its clients started): nothing by default."""

    async def _assigned(self, assigned: Any) -> None:
        """Partitions came (their commits are noted, or made where the group has none)."""
        await self.commits.assigned(assigned)

    def _released(self) -> None:
        """Partitions were revoked (after a flush and commit): forget what may have moved."""

    async def _revoked(self, revoked: Any) -> None:
        """A rebalance takes partitions away: flush and commit, then let go of them.

        Runs before the group's next generation starts (Kafka's eager protocol waits for every
        member's revocation), so the next owner starts from this commit. A write under way
        finishes first (the flush lock); one prepared before this and not begun is refused
        (:meth:`_owned_write`), so no record of a partition that moved is written here after
        its new owner may have started on it.
        """
        await self._flush_and_commit()
        self._generation += 1
        self.commits.revoked()  # another member may commit them next
        gone = set(revoked)
        self._uncommitted = {tp: o for tp, o in self._uncommitted.items() if tp not in gone}
        self._released()

    async def _owned_write(self, prepared_at: int, write: Callable[[], T]) -> T:
        """``write()`` (a sink's) in a thread, unless partitions were revoked since ``prepared_at``.

        ``prepared_at``: :attr:`_generation` when the records were taken. In a thread, so that
        the consumer's heartbeats go on while a slow destination writes (wandb opening a run
        takes seconds: on the event loop such a write stops the heartbeats, the group session
        expires, and the member goes on writing runs another member has started). Under the
        flush lock: never beside a flush, and a revocation waits for it. Raises Interrupted
        when a revocation came between: the slice is not committed, and the partitions' new
        owner reads it.
        """
        async with self._flush_lock:
            if self._generation != prepared_at:
                self._released()  # what was marked as taken since the revocation was not written
                raise Interrupted(
                    "its partitions were revoked while it was processing: their new owner writes them"
                )
            return await asyncio.to_thread(write)

    async def _flush_and_commit(self) -> None:
        """Flush (retried with backoff while it fails), then commit what the flush made durable.

        One at a time: a rebalance calls this from the consumer's own task (partitions
        revoked) while the loop may be awaiting a flush in its thread. Two flushes at once
        wrote the same buffer twice (duplicate rows in the archive after a broker restart).
        """
        async with self._flush_lock:
            backoff = 0.5
            while True:
                try:
                    if self.pending():
                        started = time.perf_counter()
                        await asyncio.to_thread(self.flush)
                        self.metrics.observe(time.perf_counter() - started)
                        self.stats.flushes += 1
                    break
                except Exception as exc:  # noqa: BLE001 - keep the consumer alive; nothing is committed
                    self.stats.flush_failures += 1
                    self.metrics.failing(True)
                    self.metrics.update(dataclasses.asdict(self.stats))  # a stuck sink says so meanwhile
                    log.error(
                        "%s: flush failed (%s); retrying in %.1fs, nothing committed", self.name, exc, backoff
                    )
                    if self._stopping.is_set():
                        return  # stopping: what was not flushed is re-delivered to the next process
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
            self._last_flush = time.monotonic()
            if not self._unavailable_backoff and self.metrics.failing(False):
                log.warning("%s: writes again; committing what it took", self.name)
            limits = self._commit_limits()
            offsets = {tp: min(offset, limits.get(tp, offset)) for tp, offset in self._uncommitted.items()}
            # what may not be committed yet stays, for a later commit; what this process committed
            # already is not committed again (a sink waiting on its destination flushes every interval)
            self._uncommitted = {tp: o for tp, o in self._uncommitted.items() if o > offsets[tp]}
            offsets = self.commits.changed(offsets)
            if offsets:
                try:
                    await self.commits.commit(offsets)
                    self.stats.commits += 1
                    self.metrics.stamp()
                except Exception as exc:  # noqa: BLE001 - a lost commit only means harmless re-delivery
                    log.warning(
                        "%s: commit failed (%s); records may be re-delivered and deduplicated", self.name, exc
                    )
            self.metrics.update(dataclasses.asdict(self.stats))
            self._after_commit()
