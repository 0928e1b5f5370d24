"""The catch-up list of a sink group left behind by a planned broker restart, and the sink's
catch-up from the archive: what it reads, what it strikes off, what it never lets stop it.

The whole path (a real archive sink, a TensorBoard sink left behind, the restart, TensorBoard's
reader) is tests/integration/test_planned_restart.py's.
"""

import asyncio

from metricbus.schemas import METRICS, RUN_STARTED, Event, Settings, default_codec, run_started
from metricbus.sinks import ParquetArchive, SinkRunner
from metricbus.sinks import Sink as BaseSink
from metricbus.sinks._catchup import CatchupLock, add_runs, catchup_path, done, pending_groups, pending_runs


def settings(tmp_path) -> Settings:
    return Settings(bootstrap="127.0.0.1:1", data_dir=tmp_path)


def test_runs_are_added_merged_and_struck_off_and_the_file_goes_with_the_last(tmp_path):
    s = settings(tmp_path)
    add_runs(s, "metricbus.sink.wandb", {"a": False, "b": True})
    add_runs(s, "metricbus.sink.wandb", {"a": True, "c": False})  # a later restart: a's close seen now
    assert pending_runs(s, "metricbus.sink.wandb") == {"a": True, "b": True, "c": False}
    assert pending_groups(s) == {"metricbus.sink.wandb"}
    done(s, "metricbus.sink.wandb", "a")
    done(s, "metricbus.sink.wandb", "b")
    assert pending_runs(s, "metricbus.sink.wandb") == {"c": False}
    done(s, "metricbus.sink.wandb", "c")
    assert not catchup_path(s, "metricbus.sink.wandb").exists() and pending_groups(s) == set()


def test_a_group_name_never_leads_outside_the_catchup_directory(tmp_path):
    s = settings(tmp_path)
    for group in ("../../etc/passwd", "/abs", "..", "a/b"):
        path = catchup_path(s, group)
        assert path.parent == tmp_path / "catchup"
        add_runs(s, group, {"r": False})
        assert pending_runs(s, group) == {"r": False}
    assert pending_groups(s) == {"../../etc/passwd", "/abs", "..", "a/b"}


def test_a_file_that_is_not_a_catchup_list_means_nothing_to_catch_up_on(tmp_path):
    s = settings(tmp_path)
    path = catchup_path(s, "g")
    path.parent.mkdir(parents=True)
    for text in ("not json", "[1, 2]", '{"runs": [1]}', '{"group": 3, "runs": {"a": 1}}', ""):
        path.write_text(text)
        assert pending_runs(s, "g") == ({"a": True} if '"runs": {' in text else {})
    assert pending_groups(s) == set()  # the last one names no group: skipped
    # run ids name directories of the archive: one that could leave it is not read
    path.write_text('{"group": "g", "runs": {"../../etc": false, "*": false, "ok-run": true}}')
    assert pending_runs(s, "g") == {"ok-run": True}


def test_one_instance_of_a_group_holds_the_lock_until_it_releases_it(tmp_path):
    s = settings(tmp_path)
    first, second = CatchupLock(s, "g"), CatchupLock(s, "g")
    assert first.acquire()
    assert not second.acquire()
    first.release()
    assert second.acquire()
    second.release()


class Sink(BaseSink):
    """A sink that keeps what it is given (and holds nothing before)."""

    name = "memory"

    def __init__(self, held: dict | None = None) -> None:
        self.held = held or {}
        self.events: list[Event] = []
        self.complete: list[str] = []
        self.buffered = 0

    def open(self) -> None: ...
    def close(self) -> None: ...
    def recover(self, run_id):  # noqa: ANN001
        return self.held.get(run_id, {})

    def write(self, events):  # noqa: ANN001
        self.events.extend(events)
        self.buffered += len(events)
        return []

    def derived_complete(self, run_id: str) -> None:
        self.complete.append(run_id)

    def pending(self) -> int:
        return self.buffered

    def flush(self) -> None:
        self.buffered = 0


def archive_run(s: Settings, run_id: str, steps: int) -> None:
    archive = ParquetArchive(s.archive_dir)
    archive.open()
    fp = default_codec().newest("EventBatch").fingerprint
    start = Event(run_id, f"p-{run_id}", 0, 1, RUN_STARTED, run_started("proj", run_id), fp)
    body = {"epoch": None, "rank": 0, "samples": {}}
    metrics = [
        Event(
            run_id,
            f"p-{run_id}",
            i + 1,
            2 + i,
            METRICS,
            {**body, "step": i, "scalars": {"loss": float(i)}},
            fp,
        )
        for i in range(steps)
    ]
    archive.write([start, *metrics])
    archive.flush()
    archive.close()


def test_a_sink_catches_up_on_each_run_and_strikes_off_even_what_cannot_be_read(tmp_path, monkeypatch):
    s = settings(tmp_path)
    archive_run(s, "r1", 5)
    archive_run(s, "r2", 3)
    sink = Sink(held={"r2": {"p-r2": [(0, 1)]}})  # it holds r2's RunStarted and first step
    runner = SinkRunner(sink, s, group_id="metricbus.sink.memory")
    add_runs(s, runner.group_id, {"r1": True, "missing": False, "r2": False})
    asyncio.run(runner._before_join())
    expected = [("r1", i) for i in range(6)] + [("r2", 2), ("r2", 3)]
    assert [(e.run_id, e.seq) for e in sink.events] == expected
    assert runner.feeder.duplicates == 0  # what it held was not even read: the archive read from seq 2
    assert sink.complete == ["r1"] and sink.buffered == 0  # closed runs told so; everything flushed
    assert pending_runs(s, runner.group_id) == {}
    # an archive that cannot be read is logged and struck off: the sink joins its group anyway
    import metricbus.sinks._archive as archive_module

    def broken(*args, **kwargs):  # noqa: ANN002, ANN003
        raise OSError("a torn Parquet file")
        yield

    monkeypatch.setattr(archive_module, "iter_events", broken)
    add_runs(s, runner.group_id, {"r1": False})
    asyncio.run(runner._before_join())
    assert pending_runs(s, runner.group_id) == {}


def test_another_instance_waits_while_one_catches_up_and_a_stop_is_heard_meanwhile(tmp_path):
    s = settings(tmp_path)
    add_runs(s, "metricbus.sink.memory", {"r1": False})
    holder = CatchupLock(s, "metricbus.sink.memory")
    assert holder.acquire()  # the other instance, catching up
    sink = Sink()
    runner = SinkRunner(sink, s, group_id="metricbus.sink.memory")

    async def main() -> None:
        task = asyncio.create_task(runner._before_join())
        await asyncio.sleep(1.2)
        assert not task.done() and sink.events == []  # waiting for the lock
        runner.stop()
        await asyncio.wait_for(task, 2)

    asyncio.run(main())
    holder.release()
    assert pending_runs(s, "metricbus.sink.memory") == {"r1": False}  # left for whoever holds the lock next


def test_the_archive_is_read_from_a_given_seq_per_producer_the_others_whole(tmp_path):
    from metricbus.sinks import read_table

    s = settings(tmp_path)
    archive_run(s, "r1", 5)
    archive_run(s, "r2", 3)
    table = read_table(s.archive_dir, since={"p-r1": 4, "p-r2": 0, "p-other": 2})
    held = sorted(zip(table["producer_id"].to_pylist(), table["seq"].to_pylist(), strict=True))
    assert held == [("p-r1", 4), ("p-r1", 5)] + [("p-r2", i) for i in range(4)]
    assert read_table(s.archive_dir, "r1", since={"p-r2": 3}).num_rows == 6  # another producer's: all
