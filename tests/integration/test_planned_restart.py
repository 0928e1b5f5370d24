"""The planned restart of the embedded broker, in process and without consumers: what it carries
over, and that a restart that fails leaves the stack running (bench/soak.py saw `up` die of it).

The whole of `metricbus up` going through a planned restart under a training job is
tests/integration/test_stack.py's.
"""

import asyncio
import dataclasses
import time

import pytest

from metricbus.producers import Run, sync_spools
from metricbus.schemas import (
    METRICS,
    Settings,
    decode_events,
    default_codec,
    ensure_topics,
    mark_broker_restarting,
    read_topic,
)
from metricbus.sinks import SinkRunner
from metricbus.sinks._loop import ConsumerLoop
from metricbus.stack import _restart as _carry
from metricbus.stack._broker import port_open
from metricbus.stack._supervisor import Stack

from .conftest import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def stack(tmp_path, monkeypatch):
    # the stack points prometheus_client at its directory for its restart counter: this
    # test's own, put back afterwards. prometheus_client picks its value class once, at import,
    # from that variable: imported first under it, every later test's metric would be a
    # multiprocess one whose directory is gone (test_fetch_wait failed so, run after this)
    import prometheus_client  # noqa: F401

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "prometheus"))
    lines: list[str] = []
    s = Stack(Settings(data_dir=tmp_path, local_port=free_port()), consumers={}, report=lines.append).start()
    s.lines = lines
    yield s
    s.stop()


def logged(stack: Stack, n: int) -> str:
    run = Run("carry", settings=stack.settings, system_metrics=False)
    for step in range(n):
        run.log({"Train/Loss": 1.0 / (step + 1)}, step=step)
    assert run.finish(timeout=30)
    return run.run_id


def test_what_no_group_has_read_is_carried_over_to_the_restarted_broker(stack):
    run_id = logged(stack, 50)
    events = stack.settings.topics.events
    before = [(r.partition, r.value) for r in read_topic(stack.settings, events)]
    old_pid = stack.broker.proc.pid
    stack.planned.restart(rss_mb=2000.0, now=time.monotonic())
    assert stack.broker.proc.pid != old_pid and stack.planned.restarts == 1
    after = [(r.partition, r.value) for r in read_topic(stack.settings, events)]
    assert after == before and any(run_id.encode() in value for _, value in after)  # same partitions, order


def test_a_planned_restart_that_fails_is_reported_and_the_stack_goes_on(stack, monkeypatch):
    logged(stack, 10)

    def refused(settings, records, attempts=5):
        raise RuntimeError("[Error -1] UnknownError")

    monkeypatch.setattr(_carry, "publish", refused)
    stack.planned.restart(rss_mb=2000.0, now=time.monotonic())  # must not raise
    assert any("planned broker restart failed (RuntimeError" in line for line in stack.lines), stack.lines
    assert stack.broker.proc.poll() is None and port_open("127.0.0.1", stack.settings.local_port)
    stack.supervise_once()  # and supervision goes on
    assert logged(stack, 5)  # a training job delivers to the restarted broker


def steps_on_broker(settings: Settings, run_id: str) -> list[int]:
    codec = default_codec()
    return sorted(
        e.body["step"]
        for r in read_topic(settings, settings.topics.events)
        for e in decode_events(codec, r.value)
        if e.run_id == run_id and e.kind == METRICS
    )


def restart_empty(stack: Stack) -> None:
    """The old broker goes with what it acknowledged after the carry's last read."""
    stack.broker.stop()
    stack.broker.start()
    ensure_topics(stack.settings)


def test_what_the_old_broker_acknowledges_once_the_restart_began_is_held_and_sent_to_the_new_one(stack):
    """The carry reads the old broker until the marker is up; a training job that sends after
    that is acknowledged by a broker about to go. Before the marker, its check passed and a
    job that finished then lost those events (test_stack, 2026-11-23)."""
    run = Run("held", settings=stack.settings, system_metrics=False)
    for step in range(20):
        run.log({"Train/Loss": 1.0}, step=step)
    assert run.flush(30)
    mark_broker_restarting(stack.settings)
    for step in range(20, 50):
        run.log({"Train/Loss": 2.0}, step=step)
    assert not run.flush(2)  # acknowledged by the old broker, not confirmed: held
    assert set(range(20, 50)) <= set(steps_on_broker(stack.settings, run.run_id))  # it has them
    restart_empty(stack)
    assert run.finish(timeout=30)  # the held window goes to the new broker
    assert set(range(20, 50)) <= set(steps_on_broker(stack.settings, run.run_id))


def test_a_run_that_stops_while_the_broker_restarts_leaves_what_was_not_confirmed_in_its_spool(stack):
    # marked before the run connects: a producer connected before the marker goes on sending to
    # the old broker, which the restart carries over
    mark_broker_restarting(stack.settings)
    run = Run("stopped", settings=stack.settings, system_metrics=False)
    for step in range(30):
        run.log({"Train/Loss": 3.0}, step=step)
    assert not run.finish(timeout=2)  # nothing is sent to a broker that is restarting
    assert steps_on_broker(stack.settings, run.run_id) == []
    early = sync_spools(stack.settings)  # `metricbus sync` meanwhile: nothing sent, all kept
    assert not early.records_sent and list(early.spools_failed.values()) == [
        f"{stack.settings.bootstrap_servers} is restarting (planned)"
    ]
    restart_empty(stack)
    assert steps_on_broker(stack.settings, run.run_id) == []
    report = sync_spools(stack.settings)  # `metricbus sync`
    assert report.records_sent and not report.spools_failed
    assert set(range(30)) <= set(steps_on_broker(stack.settings, run.run_id))


class _Reader(ConsumerLoop):
    """A consumer group that counts what it reads; ``hard_stop`` ends it as a kill would (no
    flush, no commit of its own)."""

    def __init__(self, settings: Settings, group: str, flush_interval_s: float = 2.0) -> None:
        name = group.rsplit(".", 1)[-1]
        super().__init__(settings, [settings.topics.events], group, name, flush_interval_s=flush_interval_s)
        self.read = 0

    async def _process(self, records) -> None:
        self.read += len(records)


def _run_until(loop: _Reader, done, kill: bool) -> None:
    async def main() -> None:
        task = asyncio.create_task(loop.run())
        deadline = time.monotonic() + 30
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if kill:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        else:
            loop.stop()
            await task

    asyncio.run(main())


def test_a_group_killed_before_its_first_flush_still_gets_what_it_had_not_read_carried_over(stack):
    """A sink that joined, and was stopped before it committed anything (a W&B sink killed at its
    stop timeout, in a 45-minute soak), was invisible to the carry, which went by the other
    groups' commits: what it had not read was lost (gaps of 160k events). A consumer now
    commits where its new partitions start as soon as it is assigned them."""
    from metricbus.ops._lag import LagProbe

    settings = stack.settings
    logged(stack, 50)
    total = sum(1 for _ in read_topic(settings, settings.topics.events))
    fast = _Reader(settings, f"{settings.topic_prefix}sink.fast")
    _run_until(fast, lambda: fast.read >= total, kill=False)  # read everything and committed it
    slow = _Reader(settings, f"{settings.topic_prefix}sink.slow", flush_interval_s=3600)
    _run_until(slow, lambda: slow._consumer is not None and slow._consumer.assignment(), kill=True)
    probe = LagProbe(settings)
    try:
        sample = probe.sample([slow.group_id])[slow.group_id]
    finally:
        probe.close()
    assert sample.partitions and all(
        p.committed is not None and p.lag == p.end for p in sample.partitions.values()
    )
    stack.planned.restart(rss_mb=2000.0, now=time.monotonic())
    assert stack.planned.restarts == 1
    assert sum(1 for _ in read_topic(settings, settings.topics.events)) == total  # carried for the slow group


def test_the_next_planned_restart_waits_for_every_group_to_be_back_on_the_new_broker(stack, monkeypatch):
    """Restarts 20-22 of the soak came 17-20 s apart, before a slow sink was back: it waits now
    (for at most GROUPS_BACK_S: a group whose consumer is gone for good does not hold it)."""
    from metricbus.stack import _planned_restart as _stack

    lag = _carry.PartitionLag(stack.settings.topics.events, 0, committed=5, end=5, lag=0, lag_s=None)
    monkeypatch.setattr(_carry, "committed", lambda settings: {"metricbus.sink.parquet": [lag]})
    stack.planned.restart(rss_mb=2000.0, now=time.monotonic())
    assert stack.planned.groups_before == {"metricbus.sink.parquet"}
    assert stack.planned.far_behind(2000.0) == ""  # it is back
    stack.planned.groups_before = {"metricbus.sink.parquet", "metricbus.alerts.pager"}
    assert "metricbus.alerts.pager" in stack.planned.far_behind(2000.0)  # not back yet: put off
    assert stack.planned.groups_wait_until > time.monotonic() + _stack.GROUPS_BACK_S - 60
    stack.planned.groups_wait_until = time.monotonic() - 1
    assert stack.planned.far_behind(2000.0) == ""  # waited long enough
    # a sink that is not back holds nothing: it catches up from the archive (left behind)
    stack.planned.groups_wait_until = time.monotonic() + 60
    stack.planned.groups_before = {"metricbus.sink.parquet", "metricbus.sink.wandb"}
    assert stack.planned.far_behind(2000.0) == ""
    assert stack.planned.leave_behind(_carry.committed(stack.settings), 2000.0) == {"metricbus.sink.wandb"}


def test_a_consumer_slower_than_the_training_jobs_does_not_stop_the_restarts(stack, monkeypatch):
    """In a 45-minute soak a W&B sink slower than the job kept 15-18 MB unread; the rule 'put
    off while the carry is over half the bound' then put every restart off while the broker
    grew to 130 MB past a 30 MB bound (and stopped and started every consumer each minute to
    find that out). A restart now goes on while it frees at least half the bound, judged from
    the commits before anything is stopped."""
    events = stack.settings.topics.events
    lags = {
        "metricbus.sink.parquet": [_carry.PartitionLag(events, 0, committed=100, end=100, lag=0, lag_s=None)],
        "metricbus.stream-worker": [
            _carry.PartitionLag(events, 0, committed=80, end=100, lag=20, lag_s=None)
        ],
        "metricbus.sink.wandb": [_carry.PartitionLag(events, 0, committed=90, end=100, lag=10, lag_s=None)],
    }
    monkeypatch.setattr(_carry, "committed", lambda settings: lags)
    stack.planned.settings = dataclasses.replace(stack.settings, broker_max_mb=30.0)
    assert stack.planned.far_behind(130.0) == ""  # frees ~104 MB: restart, carrying the worker's fifth
    assert stack.planned.leave_behind(lags, 130.0) == set()  # the sink is carried for: the restart frees enough
    why = stack.planned.far_behind(18.0)  # frees ~14 MB, under half the bound: put off, nothing stopped
    assert "20 of the 100 records" in why and "free little" in why
    assert "most of them metricbus.stream-worker (20)" in why  # the operator sees which one, and what to do


def test_a_sink_too_far_behind_to_carry_for_is_left_behind_to_catch_up_from_the_archive(stack, monkeypatch):
    """The bound held only up to the slowest consumer's backlog: a W&B sink slower than the
    training jobs kept the broker at its backlog plus half the bound. A sink whose backlog the
    archive holds is now left behind when carrying it would free too little (the one furthest
    behind first), and never the archive, nor a group that is no sink."""
    events = stack.settings.topics.events

    def lag(committed: int) -> list:
        return [_carry.PartitionLag(events, 0, committed=committed, end=100, lag=100 - committed, lag_s=None)]

    lags = {
        "metricbus.sink.parquet": lag(95),
        "metricbus.sink.wandb": lag(20),
        "metricbus.sink.tensorboard": lag(60),
        "metricbus.alerts.pager": lag(90),
    }
    monkeypatch.setattr(_carry, "committed", lambda settings: lags)
    stack.planned.settings = dataclasses.replace(stack.settings, broker_max_mb=30.0)
    assert stack.planned.leave_behind(lags, 300.0) == set()  # carrying 80% of 300 MB frees 60 MB: no need
    assert stack.planned.leave_behind(lags, 60.0) == {"metricbus.sink.wandb"}  # 40% of 60 MB: frees 36 MB
    assert stack.planned.leave_behind(lags, 20.0) == {"metricbus.sink.wandb", "metricbus.sink.tensorboard"}
    assert stack.planned.far_behind(20.0) == ""  # 10% of 20 MB carried: the restart goes on
    # the alerts consumer is no sink: it is carried for; when even then too little is freed, the
    # restart is put off and no sink is left behind for nothing
    assert stack.planned.leave_behind(lags, 16.0) == set()
    assert "80 of the 100 records" in stack.planned.far_behind(16.0)
    # without the archive sink nothing holds a backlog: nothing is left behind
    del lags["metricbus.sink.parquet"]
    assert stack.planned.leave_behind(lags, 30.0) == set()


def test_a_put_off_is_said_again_when_its_reason_changes_not_when_its_numbers_do(stack):
    """A soak's terminal said 'not every consumer is back' once, then nothing for five minutes
    while the restart waited for another reason (a slow sink's backlog)."""
    now = time.monotonic()
    said = len(stack.lines)
    stack.planned.put_off(40.0, "not every consumer is back on the restarted broker yet (a, b)", now)
    stack.planned.put_off(41.0, "not every consumer is back on the restarted broker yet (a, b)", now)
    stack.planned.put_off(42.0, "the consumers have 1849 of the 1971 records still to read: free little", now)
    stack.planned.put_off(43.0, "the consumers have 1901 of the 2010 records still to read: free little", now)
    new = stack.lines[said:]
    assert len(new) == 2 and "not every consumer" in new[0] and "1849 of the 1971" in new[1]


def test_what_was_carried_goes_before_what_live_training_jobs_send_again_to_the_restarted_broker(
    stack, monkeypatch
):
    """A consumer reads a partition in order. In a soak the training job's re-sent last minute
    reached the new broker before the carried backlog: the W&B sink read seqs 400,000 past what
    it held and then the backlog, its "missing below the highest seq" meanwhile not telling
    unread from lost. The new broker holds producers back (its marker) until the carry is in."""
    import threading

    run = Run("order", settings=stack.settings, system_metrics=False)
    run._publisher.window.retain_s = 0.2  # its re-sent window is its last records only, not what is carried
    for step in range(30):
        run.log({"Train/Loss": 1.0}, step=step)
    assert run.flush(30)
    time.sleep(0.3)
    stop = threading.Event()

    def train() -> None:
        step = 30
        while not stop.is_set():
            run.log({"Train/Loss": 2.0}, step=step)
            step += 1
            time.sleep(0.01)

    publish = _carry.publish

    def slow(settings, records, attempts=5):
        time.sleep(2.0)  # the producer sends again meanwhile, if nothing holds it back
        publish(settings, records, attempts)

    monkeypatch.setattr(_carry, "publish", slow)
    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        time.sleep(0.5)
        stack.planned.restart(rss_mb=2000.0, now=time.monotonic())
        assert stack.planned.restarts == 1
        time.sleep(1.0)
    finally:
        stop.set()
        trainer.join()
    assert run.finish(timeout=30)
    codec = default_codec()
    steps = [  # in the partition's order (one run: one partition)
        e.body["step"]
        for r in read_topic(stack.settings, stack.settings.topics.events)
        for e in decode_events(codec, r.value)
        if e.run_id == run.run_id and e.kind == METRICS
    ]
    first_seen = list(dict.fromkeys(steps))
    assert run._publisher.window.records_resent > 0  # the job did send its window again
    assert first_seen == list(range(len(first_seen))) and len(first_seen) > 100


def test_each_group_resumes_on_the_restarted_broker_where_it_was_instead_of_reading_the_carry_again(stack):
    """In a soak every consumer read the slow W&B sink's carried backlog again after each planned
    restart (the archive sink dropped 1.88M duplicates in one process), on the 2 cores the W&B
    sink needed. Each group's position is now committed on the new broker, mapped through the
    carry; a group that never came back after a restart gets none at the next."""
    from metricbus.ops._lag import LagProbe

    settings, events = stack.settings, stack.settings.topics.events
    run = Run("groups", settings=stack.settings, system_metrics=False)
    for step in range(60):
        run.log({"Train/Loss": 1.0 / (step + 1)}, step=step)
        if step % 10 == 9:
            assert run.flush(30)  # a record each
    assert run.finish(timeout=30)
    old = [r for r in read_topic(settings, events)]
    (partition,) = {r.partition for r in old}  # one run: one partition
    end = max(r.offset for r in old) + 1
    assert end >= 6
    for group, behind in (("fast", 0), ("slow", 3), ("slowest", 5)):
        _carry.commit(settings, {f"metricbus.test.{group}": {(events, partition): end - behind}})

    def commits() -> dict[str, tuple[int | None, int]]:
        probe = LagProbe(settings)
        try:
            samples = probe.sample()
        finally:
            probe.close()
        return {
            group.rsplit(".", 1)[-1]: (
                s.partitions[(events, partition)].committed,
                s.partitions[(events, partition)].end,
            )
            for group, s in samples.items()
            if (events, partition) in s.partitions
        }

    stack.planned.restart(rss_mb=2000.0, now=time.monotonic())
    new = [r for r in read_topic(settings, events)]
    assert [r.value for r in new] == [r.value for r in old[-5:]]  # what the slowest group needs
    assert commits() == {"fast": (5, 5), "slow": (2, 5), "slowest": (0, 5)}
    slow = _Reader(settings, "metricbus.test.slow")
    _run_until(slow, lambda: slow.read >= 3, kill=False)
    time.sleep(1.0)  # anything more would have been read by now
    assert slow.read == 3  # its three, not the run's records again
    assert "metricbus.test.fast" in stack.planned.far_behind(2000.0)  # not back on the new broker yet
    stack.planned.restart(rss_mb=2000.0, now=time.monotonic())
    # the fast and slowest groups never came back: no position for them on the third broker
    # (they would read from the start if they came back), and nothing is held for them after
    assert set(commits()) == {"slow"}


def test_a_training_job_sends_again_only_what_no_check_had_confirmed_before_the_carry(stack):
    """Producers kept a minute of acknowledged records and sent it all again after every broker
    restart: at 3,000 events/s of a soak, 180,000 events each consumer read again and dropped
    after each planned one. `up` now marks a new topic it carried the old one's records into;
    what a job's check had confirmed before the restart is there, so only the rest goes again."""
    run = Run("tail", settings=stack.settings, system_metrics=False)
    for step in range(30):
        run.log({"Train/Loss": 1.0}, step=step)
    assert run.flush(30)  # acknowledged and confirmed: the carry has it
    stack.planned.restart(rss_mb=2000.0, now=time.monotonic())
    for step in range(30, 40):
        run.log({"Train/Loss": 2.0}, step=step)
    assert run.finish(timeout=30)
    # at most the record sent after the restart before its check found the new topic (it could
    # have gone to a topic the broker no longer had: acknowledged and kept nowhere)
    assert run._publisher.window.records_resent <= 1
    steps = steps_on_broker(stack.settings, run.run_id)
    assert steps[:30] == list(range(30)) and set(steps[30:]) == set(range(30, 40))  # 0-29 once


def test_a_training_job_sending_through_a_planned_restart_sends_again_only_its_unchecked_tail(stack, caplog):
    """The same with a job logging all along: it holds at the marker, and of the window only
    what was acknowledged after its last passing check goes again, after the carry."""
    import re
    import threading

    run = Run("busy", settings=stack.settings, system_metrics=False)
    stop, paused = threading.Event(), threading.Event()
    logged = [0]

    def train() -> None:
        while not stop.is_set():
            if not paused.is_set():
                run.log({"Train/Loss": 1.0}, step=logged[0])
                logged[0] += 1
            time.sleep(0.005)

    trainer = threading.Thread(target=train)
    trainer.start()
    window = run._publisher.window
    try:
        time.sleep(2.0)
        # a check confirms all that was sent so far (the job paused meanwhile): that part must
        # never go again, however slowly this machine sends and checks
        paused.set()
        assert run.flush(30)
        deadline = time.monotonic() + 30
        while window.unconfirmed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert window.unconfirmed == 0, "no check confirmed what the broker acknowledged"
        checked = run._publisher.sender.records_sent
        paused.clear()
        time.sleep(1.0)
        stack.planned.restart(rss_mb=2000.0, now=time.monotonic())
        time.sleep(2.0)
    finally:
        stop.set()
        trainer.join()
    assert run.finish(timeout=30)
    # what the sender held at the marker: the records acknowledged since its last passing check
    (held,) = [int(m) for m in re.findall(r"the last (\d+) acknowledged records are held", caplog.text)]
    # only those went again (the whole window would be at least the checked ones more)
    assert checked > 0 and 0 < window.records_resent == held
    steps = steps_on_broker(stack.settings, run.run_id)
    assert sorted(set(steps)) == list(range(logged[0]))


def test_without_the_carry_marker_a_training_job_sends_its_whole_last_minute_again(stack):
    """A broker restarted by hand, or a carry that failed: nothing says what the new topic holds."""
    run = Run("window", settings=stack.settings, system_metrics=False)
    for step in range(30):
        run.log({"Train/Loss": 1.0}, step=step)
    assert run.flush(30)
    restart_empty(stack)
    for step in range(30, 40):
        run.log({"Train/Loss": 2.0}, step=step)
    assert run.finish(timeout=30)
    assert run._publisher.window.records_resent > 0
    steps = steps_on_broker(stack.settings, run.run_id)
    assert steps.count(0) == 1 and sorted(set(steps)) == list(range(40))  # the window went again


def _sink(settings: Settings, sink) -> SinkRunner:
    topics = [settings.topics.events, settings.topics.aggregates]
    return SinkRunner(sink, settings, topics=topics, flush_interval_s=0.2)


def test_a_sink_left_behind_catches_up_from_the_archive_every_step_once(stack):
    """A TensorBoard sink that had read a run's first 100 steps of 200, left behind by a planned
    restart while the archive sink held everything: nothing of its backlog is carried (the new
    broker starts empty), and once it starts again it reads the rest from the archive before it
    joins its group. TensorBoard's own reader then sees every step once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from metricbus.sinks import ParquetArchive, TensorBoardSink, read_table
    from metricbus.sinks._catchup import catchup_path, pending_runs

    settings = dataclasses.replace(stack.settings, broker_max_mb=3000.0)
    stack.settings = stack.planned.settings = settings
    events = settings.topics.events
    run = Run("behind", settings=settings, system_metrics=False)
    for step in range(100):
        run.log({"Train/Loss": 1.0 / (step + 1)}, step=step)
        if step % 20 == 19:
            assert run.flush(30)  # a record each
    tb_root = settings.data_dir / "tensorboard"
    archive, board = (
        _sink(settings, ParquetArchive(settings.archive_dir)),
        _sink(settings, TensorBoardSink(tb_root)),
    )

    def archived() -> int:
        try:
            return read_table(settings.archive_dir, run.run_id).num_rows
        except Exception:  # noqa: BLE001 - not yet written
            return 0

    _run_until(archive, lambda: archived() >= 100, kill=False)
    _run_until(board, lambda: board.stats.written >= 101, kill=False)  # RunStarted + 100 steps
    for step in range(100, 200):
        run.log({"Train/Loss": 1.0 / (step + 1)}, step=step)
        if step % 20 == 19:
            assert run.flush(30)
    assert run.finish(timeout=30)
    archive = _sink(settings, ParquetArchive(settings.archive_dir))
    _run_until(archive, lambda: archived() >= 201, kill=False)  # and RunFinished

    stack.planned.restart(rss_mb=2000.0, now=time.monotonic())
    assert stack.planned.restarts == 1
    assert read_topic(settings, events) == []  # its backlog was not carried: the archive holds it
    assert pending_runs(settings, board.group_id) == {run.run_id: False}
    assert any("sink.tensorboard is left behind" in line for line in stack.lines)

    # restarted again before it is back: what it missed since is added (a run logged meanwhile)
    other = Run("behind-too", settings=settings, system_metrics=False)
    other.log({"Train/Loss": 0.5}, step=0)
    assert other.finish(timeout=30)
    archive = _sink(settings, ParquetArchive(settings.archive_dir))
    _run_until(archive, lambda: read_table(settings.archive_dir, other.run_id).num_rows >= 3, kill=False)
    stack.planned.restart(rss_mb=2000.0, now=time.monotonic())
    assert stack.planned.restarts == 2
    assert pending_runs(settings, board.group_id) == {run.run_id: False, other.run_id: False}

    board = _sink(settings, TensorBoardSink(tb_root))
    _run_until(board, lambda: board._consumer is not None and board._consumer.assignment(), kill=False)
    assert not catchup_path(settings, board.group_id).exists()
    # the steps it had not read and RunFinished, and the other run (3 events); what it held
    # (RunStarted, 100 steps) not even read again
    assert (board.stats.written, board.feeder.duplicates) == (104, 0)
    for run_id, steps in ((run.run_id, range(200)), (other.run_id, range(1))):
        (run_dir,) = {p.parent for p in tb_root.rglob(f"*{run_id}/events.out.tfevents.*")}
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        acc.Reload()
        assert sorted(s.step for s in acc.Scalars("Train/Loss")) == list(steps)  # every step, once
