"""A destination that cannot take what was read: the loop reads it again from the commits.

On the embedded broker, against aiokafka's own seek (``seek_to_committed`` leaves a partition
whose committed offset is 0 where it is: records read there and refused were skipped for good).
"""

from __future__ import annotations

import asyncio

import pytest

from metricbus.schemas import make_producer
from metricbus.sinks._loop import ConsumerLoop
from metricbus.sinks._protocol import RunHeld, Unavailable

pytestmark = pytest.mark.integration


class Refusing(ConsumerLoop):
    """Refuses the first ``refusals`` polls with records (``why``), then takes every record."""

    def __init__(self, settings, topic: str, refusals: int, why: Unavailable) -> None:
        super().__init__(
            settings, [topic], f"{settings.topic_prefix}refusing", "refusing", flush_interval_s=0.2
        )
        self.refusals, self.why = refusals, why
        self.taken: list[bytes] = []

    async def _process(self, records) -> None:
        if self.refusals:
            self.refusals -= 1
            raise self.why
        self.taken += [r.value for r in records]
        if len(self.taken) >= 10:
            self.stop()


@pytest.mark.parametrize(
    "why", [RunHeld("run r is still written by another instance"), Unavailable("disk full")]
)
def test_records_a_destination_refused_are_read_again_from_a_commit_of_0(settings, why):
    topic = settings.topics.events
    values = [f"record {i}".encode() for i in range(10)]

    async def main() -> list[bytes]:
        producer = make_producer(settings)
        await producer.start()
        try:
            for value in values:
                await producer.send_and_wait(topic, value, partition=0)
        finally:
            await producer.stop()
        loop = Refusing(settings, topic, refusals=2, why=why)  # its group commits 0 as it joins
        await asyncio.wait_for(loop.run(), 60)
        return loop.taken

    taken = asyncio.run(main())
    assert taken == values  # each once, in order: nothing skipped after the refusals
