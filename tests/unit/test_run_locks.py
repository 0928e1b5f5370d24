"""A run of a sink's group is written by one instance at a time (sinks/_run_locks.py): a new
owner that finds the run's lock taken reads it again later, and then sees what was written."""

import pytest

from metricbus.schemas import METRICS, Event, default_codec
from metricbus.sinks._protocol import Sink, Unavailable
from metricbus.sinks._run_locks import RunLocks
from metricbus.sinks._runtime import Feeder


def test_a_run_lock_is_held_by_one_instance_until_it_lets_go(tmp_path):
    first, second = RunLocks(tmp_path), RunLocks(tmp_path)
    first.take("run-a")
    first.take("run-a")  # held already: at once
    with pytest.raises(Unavailable, match="still written by another instance"):
        second.take("run-a")
    second.take("run-b")  # other runs are free
    first.release_all()
    second.take("run-a")
    with pytest.raises(Unavailable):
        first.take("run-b")


class Held(Sink):
    """A sink whose output is a shared list: what recover says is what any instance wrote."""

    def __init__(self, written: list[Event]) -> None:
        self.written = written

    def open(self) -> None:
        pass

    def recover(self, run_id):
        seqs = sorted(e.seq for e in self.written if e.run_id == run_id)
        return {"p1": [(s, s) for s in seqs]}

    def write(self, events):
        self.written.extend(events)

    def pending(self) -> int:
        return 0

    def flush(self) -> None:
        pass


FP = default_codec().newest("EventBatch").fingerprint


def event(seq: int) -> Event:
    body = {"step": seq, "epoch": None, "scalars": {"loss": 1.0}, "samples": {}, "labels": {}}
    return Event("run-a", "p1", seq, 1_700_000_000_000 + seq, METRICS, body, FP)


def test_a_new_owner_waits_for_the_run_lock_then_drops_what_the_old_owner_wrote(tmp_path):
    written: list[Event] = []
    old, new = RunLocks(tmp_path), RunLocks(tmp_path)
    old_feeder, new_feeder = Feeder(Held(written), locks=old), Feeder(Held(written), locks=new)
    old_feeder.write(old_feeder.fresh([event(0), event(1)]))  # the old owner, left out of the group
    with pytest.raises(Unavailable):
        new_feeder.fresh([event(0), event(1), event(2)])  # its write is still under way
    old_feeder.write(old_feeder.fresh([event(2)]))  # that write ends, then it lets go
    old.release_all()
    fresh = new_feeder.fresh([event(0), event(1), event(2), event(3)])
    assert [e.seq for e in fresh] == [3]  # what the old owner wrote, recovered once the lock came
    new_feeder.write(fresh)
    assert sorted(e.seq for e in written) == [0, 1, 2, 3]  # each once
