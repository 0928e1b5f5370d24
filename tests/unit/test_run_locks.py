"""A run of a sink's group is written by one instance at a time (sinks/_run_locks.py): a new
owner that finds the run's lock taken reads it again later, and then sees what was written."""

import subprocess
import sys

import pytest

from metricbus.schemas import METRICS, Event, default_codec
from metricbus.sinks._protocol import Sink, Unavailable
from metricbus.sinks._run_locks import RunLocks
from metricbus.sinks._runtime import Feeder


class Holder:
    """Another instance: a process that holds the lock of ``run_ids`` until it is let go."""

    def __init__(self, path, *run_ids: str) -> None:
        code = (
            "import sys; from metricbus.sinks._run_locks import RunLocks; "
            f"locks = RunLocks({str(path)!r}); [locks.take(r) for r in {list(run_ids)!r}]; "
            "print('held', flush=True); sys.stdin.read()"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout.readline().strip() == "held"

    def let_go(self) -> None:
        self.proc.stdin.close()  # it exits: the system releases its locks
        assert self.proc.wait(30) == 0


def test_a_run_lock_is_held_by_one_instance_until_it_lets_go(tmp_path):
    path = tmp_path / "locks" / "group.lock"
    other = Holder(path, "run-a")
    mine = RunLocks(path)
    with pytest.raises(Unavailable, match="still written by another instance"):
        mine.take("run-a")
    mine.take("run-b")  # other runs are free
    mine.take("run-b")  # held already: at once
    other.let_go()
    mine.take("run-a")
    mine.release_all()
    Holder(path, "run-a", "run-b").let_go()  # mine let go of both


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
    path = tmp_path / "locks" / "group.lock"
    written = [event(0), event(1)]  # what the old owner, left out of the group, wrote
    old = Holder(path, "run-a")  # and its write is still under way
    feeder = Feeder(Held(written), locks=RunLocks(path))
    with pytest.raises(Unavailable):
        feeder.fresh([event(0), event(1), event(2)])
    written.append(event(2))  # that write ends, then the old owner lets go
    old.let_go()
    fresh = feeder.fresh([event(0), event(1), event(2), event(3)])
    assert [e.seq for e in fresh] == [3]  # what the old owner wrote, recovered once the lock came
    feeder.write(fresh)
    assert sorted(e.seq for e in written) == [0, 1, 2, 3]  # each once


def test_an_alert_of_a_run_another_instance_holds_waits_then_is_not_delivered_again(tmp_path):
    """The alert deliverer's instances share a ledger: one left out of its group while it saves
    the ledger slowly holds the run's lock, so the new owner neither delivers the alert at once
    nor again once the ledger says it was."""
    import asyncio
    import io
    import types

    from metricbus.schemas import Settings
    from metricbus.sinks.alerts import AlertRunner, ConsoleAlerts

    settings = Settings(data_dir=tmp_path)
    codec = default_codec()
    alert = {
        "run_id": "run-a", "seq": 0, "rule": "nan_loss", "severity": "critical", "metric": "loss",
        "state": "firing", "value": float("nan"), "step": 5, "ts_ms": 1, "message": "NaN",
    }  # fmt: skip
    record = types.SimpleNamespace(
        topic="alerts", partition=0, offset=0, value=codec.encode("Alert", alert), key=None
    )
    group = settings.groups.alerts("console")
    old = Holder(tmp_path / "locks" / f"{group}.lock", "run-a")
    old_ledger = AlertRunner(settings, ConsoleAlerts(io.StringIO())).ledger
    out = io.StringIO()
    runner = AlertRunner(settings, ConsoleAlerts(out))
    with pytest.raises(Unavailable):
        asyncio.run(runner._process([record]))
    assert out.getvalue() == ""
    old_ledger.add("run-a", 0)  # the old owner delivered it; its ledger is saved, then it lets go
    old_ledger.save_shared()
    old.let_go()
    asyncio.run(runner._process([record]))
    assert out.getvalue() == "" and runner.stats.duplicates == 1
