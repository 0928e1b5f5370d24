"""The planned broker restart's carry: a refused batch is sent again from where it failed.

The embedded broker refuses one of two first batches written to a new partition at once
(UnknownError; bench/soak.py found it when the carry and a training job's resent minute met).
The broker itself is exercised by tests/integration/test_stack.py; here a producer that fails
where told checks which records go again, in which order.
"""

import asyncio
import types

import pytest

from metricbus.schemas import Settings
from metricbus.stack import _restart as _carry


class Refusing:
    """An aiokafka-like producer whose sends fail once at the given (topic, partition, value);
    what it accepts gets the partition's next offset."""

    def __init__(self, refuse: set[tuple[str, int, bytes]]) -> None:
        self.refuse = set(refuse)
        self.sent: list[tuple[str, int, bytes]] = []
        self.stopped = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    async def send(self, topic, value, key, partition):
        future = asyncio.get_running_loop().create_future()
        if (topic, partition, value) in self.refuse:
            self.refuse.discard((topic, partition, value))
            future.set_exception(RuntimeError("[Error -1] UnknownError"))
        else:
            offset = sum(1 for t, p, _ in self.sent if (t, p) == (topic, partition))
            self.sent.append((topic, partition, value))
            future.set_result(types.SimpleNamespace(offset=offset))
        return future


def records(topic, partition, n, first=0):
    """``n`` records as read from the old broker, from offset ``first``."""
    return [(topic, partition, first + i, b"k", f"{topic}/{partition}/{i}".encode()) for i in range(n)]


def test_a_refused_batch_is_sent_again_from_there_and_other_partitions_once(monkeypatch, tmp_path):
    carried = records("events", 0, 5) + records("events", 1, 3) + records("alerts", 0, 2)
    producer = Refusing({("events", 0, b"events/0/2")})
    monkeypatch.setattr(_carry, "make_producer", lambda *a, **k: producer)
    _carry.publish(Settings(data_dir=tmp_path), carried)
    sent = producer.sent
    assert [v for t, p, v in sent if (t, p) == ("events", 0)] == [
        b"events/0/0",
        b"events/0/1",
        b"events/0/3",
        b"events/0/4",  # the first round: all but the refused one
        b"events/0/2",
        b"events/0/3",
        b"events/0/4",  # again from the refused one on, in order (3 and 4 twice: consumers dedupe)
    ]
    assert [v for t, p, v in sent if (t, p) == ("events", 1)] == [f"events/1/{i}".encode() for i in range(3)]
    assert [v for t, p, v in sent if t == "alerts"] == [b"alerts/0/0", b"alerts/0/1"]
    assert producer.stopped


def test_where_a_group_resumes_is_where_its_first_unread_record_went_even_after_a_refusal(
    monkeypatch, tmp_path
):
    """Old offsets 100-104 of events/0 went to 0, 1, then (2 refused) 2, 3 and again 4, 5, 6: a
    group that had read up to 102 resumes at 4, the refused record's last copy; one that had read
    everything, after the carry; one that had read nothing, at its start."""
    carried = records("events", 0, 5, first=100) + records("alerts", 0, 2, first=7)
    producer = Refusing({("events", 0, b"events/0/2")})
    monkeypatch.setattr(_carry, "make_producer", lambda *a, **k: producer)
    placed = _carry.publish(Settings(data_dir=tmp_path), carried)
    assert placed.moved[("events", 0)] == [(100, 0), (101, 1), (102, 4), (103, 5), (104, 6)]
    assert placed.written[("events", 0)] == set(range(7))

    def lag(topic, committed):
        return _carry.PartitionLag(topic, 0, committed=committed, end=0, lag=0, lag_s=None)

    positions = {
        "behind": [lag("events", 102), lag("alerts", 8)],
        "done": [lag("events", 105), lag("alerts", 9)],
        "first": [lag("events", 100)],
    }
    ends = {("events", 0): 7, ("alerts", 0): 2}
    assert _carry.resume_at(placed, positions, ends) == {
        "behind": {("events", 0): 4, ("alerts", 0): 1},
        "done": {("events", 0): 7, ("alerts", 0): 2},
        "first": {("events", 0): 0},
    }
    # a producer's record got into the partition too (before the carry, or between): where a
    # group resumes cannot be told by offsets, so it reads the partition from the start
    assert _carry.resume_at(placed, positions, {("events", 0): 8, ("alerts", 0): 2}) == {
        "behind": {("alerts", 0): 1},
        "done": {("alerts", 0): 2},
    }


def test_a_partition_refused_every_round_raises_after_the_last(monkeypatch, tmp_path):
    class Always(Refusing):
        async def send(self, topic, value, key, partition):
            self.refuse.add(("events", 0, b"events/0/1"))
            return await super().send(topic, value, key, partition)

    producer = Always(set())
    monkeypatch.setattr(_carry, "make_producer", lambda *a, **k: producer)
    with pytest.raises(RuntimeError, match="UnknownError"):
        _carry.publish(Settings(data_dir=tmp_path), records("events", 0, 3), attempts=3)
    assert producer.stopped
    assert [v for _, _, v in producer.sent].count(b"events/0/0") == 1  # before the refusal: once


def test_what_is_carried_is_weighed_compressed_as_the_broker_holds_it(tmp_path):
    """Read back, the records are decompressed; published again, zstd stores about a third (a
    restart was put off for 37 MB 'behind' under a 30 MB bound that the broker held in ~13)."""
    import json

    values = [json.dumps({"step": i, "loss": 1.0 / (i + 1)}).encode() * 200 for i in range(50)]
    carried = [("events", 0, i, b"k", v) for i, v in enumerate(values)]
    raw = _carry.stored_mb(Settings(data_dir=tmp_path, compression="none"), carried)
    assert raw == sum(map(len, values)) / 1e6
    for compression in ("zstd", "gzip"):
        assert 0 < _carry.stored_mb(Settings(data_dir=tmp_path, compression=compression), carried) < raw / 3
