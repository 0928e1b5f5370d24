"""ConsumerLoop: flushes never overlap, whoever asks for one (the loop, or a rebalance); slices."""

import asyncio
import threading
import time

from prometheus_client import REGISTRY

from metricbus.schemas import Settings, alive_at
from metricbus.sinks._loop import ConsumerLoop


class SlowLoop(ConsumerLoop):
    def __init__(self) -> None:
        super().__init__(Settings(bootstrap="127.0.0.1:1"), ["t"], "g", "slow")
        self.buffer = ["a", "b"]
        self.active = 0
        self.most = 0
        self.flushed: list = []
        self.guard = threading.Lock()

    def pending(self) -> int:
        return len(self.buffer)

    def flush(self) -> None:  # runs in a thread, as a sink's does
        with self.guard:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(0.2)
        self.flushed.extend(self.buffer)
        self.buffer = []
        with self.guard:
            self.active -= 1


class Consumer:
    """aiokafka's commit, recording the offsets committed and when each says its consumer was alive."""

    def __init__(self) -> None:
        self.commits: list = []
        self.alive: list = []

    async def commit(self, offsets) -> None:
        self.commits.append({tp: om.offset for tp, om in offsets.items()})
        self.alive.extend(alive_at(om.metadata) for om in offsets.values())


def test_a_rebalance_during_a_flush_waits_for_it_instead_of_flushing_the_same_buffer_again():
    loop = SlowLoop()
    loop._consumer = loop.commits.consumer = Consumer()
    loop._uncommitted = {"tp": 10}

    async def main() -> None:
        # the loop's own flush, and a rebalance's (on_partitions_revoked) while it runs
        await asyncio.gather(loop._flush_and_commit(), loop._flush_and_commit())

    asyncio.run(main())
    assert loop.most == 1  # never two flushes at once
    assert loop.flushed == ["a", "b"]  # the buffer written once
    assert loop._consumer.commits == [{"tp": 10}]
    assert loop._consumer.alive and all(loop._consumer.alive)  # each carries the stamp `status` reads


class Record:
    def __init__(self, partition: int, offset: int, size: int) -> None:
        self.topic, self.partition, self.offset, self.value = "t", partition, offset, b"x" * size


class SlicingLoop(ConsumerLoop):
    """Takes what it is given; flushes every slice (due), or asks itself to stop after ``stop_after``."""

    def __init__(self, stop_after: int | None = None) -> None:
        super().__init__(Settings(bootstrap="127.0.0.1:1"), ["t"], "g", "slicing")
        self.slices: list[list[int]] = []
        self.stop_after = stop_after
        self.held: list[int] = []

    def pending(self) -> int:
        return len(self.held)

    def flush(self) -> None:
        self.held = []

    def due(self) -> bool:
        return bool(self._uncommitted)

    async def _process(self, records) -> None:  # type: ignore[no-untyped-def]
        self.slices.append([r.offset for r in records])
        self.held += [r.offset for r in records]
        if self.stop_after is not None and len(self.slices) == self.stop_after:
            self.stop()  # as SIGTERM's handler does, while a slice is being processed


def test_a_large_poll_is_processed_and_committed_a_slice_at_a_time():
    from aiokafka import TopicPartition

    from metricbus.sinks._loop import SLICE_BYTES

    loop = SlicingLoop()
    loop._consumer = loop.commits.consumer = Consumer()
    half = SLICE_BYTES // 2
    # two partitions' records as a poll returns them; a record over a slice's size ends its slice
    records = [Record(0, i, half) for i in range(5)] + [Record(1, 0, 3 * SLICE_BYTES), Record(1, 1, 10)]
    asyncio.run(loop._process_sliced(records))
    assert loop.slices == [[0, 1], [2, 3], [4, 0], [1]]  # never more than a slice decoded at once
    p0, p1 = TopicPartition("t", 0), TopicPartition("t", 1)
    assert loop._consumer.commits == [{p0: 2}, {p0: 4}, {p0: 5, p1: 1}, {p1: 2}]  # each once processed


def test_a_stop_between_slices_commits_what_was_processed_and_leaves_the_rest_to_be_read_again():
    from aiokafka import TopicPartition

    from metricbus.sinks._loop import SLICE_BYTES

    loop = SlicingLoop(stop_after=2)
    loop._consumer = loop.commits.consumer = Consumer()
    records = [Record(0, i, SLICE_BYTES) for i in range(6)]
    asyncio.run(loop._process_sliced(records))
    assert loop.slices == [[0], [1]]  # the stop is heard after the slice under way
    assert loop._consumer.commits[-1] == {TopicPartition("t", 0): 2}  # 2..5 are read again next time


class StuckLoop(ConsumerLoop):
    """A sink whose disk refuses its first flushes (a full or read-only volume)."""

    def __init__(self) -> None:
        super().__init__(Settings(bootstrap="127.0.0.1:1"), ["t"], "g-stuck", "stuck")
        self.calls = 0
        self.reported: list = []

    def pending(self) -> int:
        return 1 if self.calls < 3 else 0

    def flush(self) -> None:
        self.calls += 1
        self.reported.append(
            REGISTRY.get_sample_value("metricbus_consumer_flush_failures_total", {"group": "g-stuck"})
        )
        if self.calls < 3:
            raise OSError(28, "No space left on device")


def test_flush_failures_are_counted_for_prometheus_while_the_sink_is_stuck_not_once_it_recovers():
    """The counters were brought up to date after a flush and commit only: a sink stuck retrying
    its flush showed no failure on /metrics for as long as it was stuck."""
    loop = StuckLoop()
    loop._consumer = loop.commits.consumer = Consumer()
    loop._uncommitted = {"tp": 3}
    asyncio.run(loop._flush_and_commit())
    assert loop.reported == [0.0, 1.0, 2.0]  # seen by a scrape between the retries
    assert loop.stats.flush_failures == 2 and loop._consumer.commits == [{"tp": 3}]


class LateSink:
    """A sink whose destination confirms late: ``durable`` of the ``handed`` events are held."""

    name = "late"
    columnar = False

    def __init__(self) -> None:
        self.handed = 0
        self.durable = 0

    def confirmed(self):
        return self.handed, self.durable

    def pending(self) -> int:
        return self.handed - self.durable

    def flush(self) -> None:
        pass

    def release(self) -> None:
        pass


def test_no_record_is_committed_past_events_the_destination_has_not_confirmed():
    from aiokafka import TopicPartition

    from metricbus.sinks._runtime import SinkRunner

    sink = LateSink()
    runner = SinkRunner(sink, Settings(bootstrap="127.0.0.1:1"))  # type: ignore[arg-type]
    runner._consumer = runner.commits.consumer = Consumer()
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)

    def slice_of(partition_offsets, events):  # a slice's records processed: events handed
        records = [Record(p, o, 1) for p, o in partition_offsets]
        sink.handed += events
        for r in records:
            runner._uncommitted[TopicPartition(r.topic, r.partition)] = r.offset + 1
        runner._after_slice(records)

    slice_of([(0, 0), (0, 1), (1, 0)], 30)  # events 0..29
    slice_of([(0, 2), (1, 1)], 20)  # events 30..49
    slice_of([(0, 3)], 0)  # all duplicates: nothing handed, nothing to wait for
    sink.durable = 25  # the destination holds the first 25: the first slice is not all there
    asyncio.run(runner._flush_and_commit())
    assert runner._consumer.commits == [{tp0: 0, tp1: 0}]
    asyncio.run(runner._flush_and_commit())  # nothing new is durable: nothing committed again
    assert runner._consumer.commits == [{tp0: 0, tp1: 0}]
    sink.durable = 30  # the first slice's events are all held
    asyncio.run(runner._flush_and_commit())
    assert runner._consumer.commits[-1] == {tp0: 2, tp1: 1}
    sink.durable = 50
    asyncio.run(runner._flush_and_commit())
    assert runner._consumer.commits[-1] == {tp0: 4, tp1: 2}
    assert runner._uncommitted == {}


class WritingLoop(ConsumerLoop):
    """Processes a slice as SinkRunner does: takes the records, may wait (a dead letter), writes."""

    def __init__(self) -> None:
        super().__init__(Settings(bootstrap="127.0.0.1:1"), ["t"], "g", "writing")
        self.written: list[int] = []
        self.released = 0
        self.waiting = asyncio.Event()  #: set: the slice waits here before its write
        self.resume = asyncio.Event()

    def pending(self) -> int:
        return 0

    def _released(self) -> None:
        self.released += 1

    async def _process(self, records) -> None:  # type: ignore[no-untyped-def]
        prepared_at = self._generation
        if self.waiting.is_set():
            await self.resume.wait()

        def write() -> None:
            time.sleep(0.5)  # a slow destination (wandb opening a run)
            self.written.extend(r.offset for r in records)

        await self._owned_write(prepared_at, write)


def test_a_slow_write_runs_off_the_event_loop_so_the_consumer_goes_on_beating():
    loop = WritingLoop()
    loop._consumer = loop.commits.consumer = Consumer()
    beats = 0

    async def heartbeat() -> None:  # aiokafka's heartbeat is a task on this event loop
        nonlocal beats
        while True:
            await asyncio.sleep(0.05)
            beats += 1

    async def main() -> None:
        beating = asyncio.ensure_future(heartbeat())
        await loop._process_sliced([Record(0, 0, 10)])
        beating.cancel()

    asyncio.run(main())
    assert loop.written == [0]
    assert beats >= 4  # 0.5 s of writing: about 10 beats, none while the loop is blocked


def test_a_slice_taken_before_a_revocation_is_not_written_nor_committed_after_it():
    from aiokafka import TopicPartition

    loop = WritingLoop()
    loop._consumer = loop.commits.consumer = Consumer()
    tp = TopicPartition("t", 0)
    loop._uncommitted = {tp: 3}  # taken earlier, not committed yet: the revocation commits it
    loop.waiting.set()

    async def main() -> None:
        processing = asyncio.ensure_future(loop._process_sliced([Record(0, 3, 10)]))
        await asyncio.sleep(0.1)  # the slice waits before its write
        await loop._revoked({tp})  # a rebalance takes partition 0 away meanwhile
        loop.resume.set()
        await processing

    asyncio.run(main())
    assert loop.written == []  # the new owner writes offset 3
    assert loop._consumer.commits == [{tp: 3}]  # what was taken before, committed at the revocation
    assert loop._uncommitted == {}  # nothing of the moved partition left to commit later
    assert loop.released == 2  # at the revocation, and again for what was marked since


def test_a_run_another_instance_still_holds_is_read_again_later_without_calling_the_destination_failing():
    """A handover under way (RunHeld) waits like an unavailable destination, but `status` and
    /metrics must not say the sink is failing, and its log says it at warning level."""
    from metricbus.sinks._protocol import RunHeld, Unavailable

    class Assigned(Consumer):
        def assignment(self):
            return []

    loop = SlowLoop()
    loop.buffer = []
    loop._consumer = loop.commits.consumer = Assigned()
    loop._stopping.set()  # the backoff's wait returns at once
    asyncio.run(loop._wait_out(RunHeld("run r is still written by another instance")))
    assert loop.stats.unavailable == 0 and not loop.metrics.failing(False)
    asyncio.run(loop._wait_out(Unavailable("the disk is full")))
    assert loop.stats.unavailable == 1 and loop.metrics.failing(False)  # it was failing
