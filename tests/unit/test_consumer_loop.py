"""ConsumerLoop: flushes never overlap, whoever asks for one (the loop, or a rebalance)."""

import asyncio
import threading
import time

from schemas import Settings
from sinks._runtime import ConsumerLoop


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
    def __init__(self) -> None:
        self.commits: list = []

    async def commit(self, offsets) -> None:
        self.commits.append(dict(offsets))


def test_a_rebalance_during_a_flush_waits_for_it_instead_of_flushing_the_same_buffer_again():
    loop = SlowLoop()
    loop._consumer = Consumer()
    loop._uncommitted = {"tp": 10}

    async def main() -> None:
        # the loop's own flush, and a rebalance's (on_partitions_revoked) while it runs
        await asyncio.gather(loop._flush_and_commit(), loop._flush_and_commit())

    asyncio.run(main())
    assert loop.most == 1  # never two flushes at once
    assert loop.flushed == ["a", "b"]  # the buffer written once
    assert loop._consumer.commits == [{"tp": 10}]
