import logging
import math
import sys
import threading
import time

import pytest

from metricbus.producers import Run
from metricbus.schemas import CONFIG_UPDATE, METRICS, RUN_FINISHED, RUN_STARTED, InvalidNameError, Settings
from tests.fakes import FakeTransport


@pytest.fixture
def settings(tmp_path):
    return Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1")


def wait_for(condition, timeout=30.0):
    """Until ``condition()`` holds (a thread ran): no sleep that guesses how long that takes."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


def metrics(events):
    return [(seq, body) for _, seq, (kind, body) in events if kind == METRICS]


def test_events_arrive_in_order_with_contiguous_seq(settings):
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    for i in range(5000):
        run.log({"Train/Loss": 1.0 / (i + 1), "i": i}, step=i, epoch=i // 1000)
    assert run.finish(timeout=10)
    events = fake.events()
    assert [seq for _, seq, _ in events] == list(range(5002))
    assert events[0][2][0] == RUN_STARTED and events[-1][2][0] == RUN_FINISHED
    steps = [body["step"] for _, body in metrics(events)]
    assert steps == list(range(5000))
    assert metrics(events)[1234][1]["scalars"] == {"Train/Loss": 1.0 / 1235, "i": 1234.0}
    assert metrics(events)[1234][1]["epoch"] == 1


def test_events_queued_from_several_threads_at_once_each_arrive_whole(settings):
    """log() and the control events of other threads (config updates, system samples) queue
    two items per event: they must never interleave (one deque.extend each)."""
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    n = 20_000

    def configure() -> None:
        for i in range(n // 10):
            run.config.update({"k": i})

    other = threading.Thread(target=configure)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads switch as often as the interpreter allows
    try:
        other.start()
        for i in range(n):
            run.log({"Train/Loss": float(i)}, step=i, labels={"task": "a"} if i % 7 == 0 else None)
        other.join()
    finally:
        sys.setswitchinterval(interval)
    assert run.finish(timeout=30)
    events = fake.events()
    assert [seq for _, seq, _ in events] == list(range(len(events)))  # counted in the spool's order
    logged = metrics(events)
    assert [body["step"] for _, body in logged] == list(range(n))
    assert all(body["scalars"] == {"Train/Loss": float(body["step"])} for _, body in logged)
    assert all((body["labels"] == {"task": "a"}) == (body["step"] % 7 == 0) for _, body in logged)
    updates = [body for _, _, (kind, body) in events if kind == CONFIG_UPDATE]
    assert len(updates) == n // 10


def test_auto_step_counts_from_the_last_step(settings):
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    run.log({"a": 1})
    run.log({"a": 2})
    run.log({"a": 3}, step=10)
    run.log({"a": 4})
    run.finish(timeout=5)
    assert [b["step"] for _, b in metrics(fake.events())] == [0, 1, 10, 11]


def test_broker_down_spools_then_delivers_everything_once_when_back(settings, caplog):
    fake = FakeTransport()
    fake.down = True
    # captured from before the run starts: its sender may try (and fail) RunStarted at once
    with caplog.at_level(logging.WARNING, logger="metricbus.producer"):
        run = Run("p", settings=settings, transport=fake, system_metrics=False)
        for i in range(300):
            run.log({"x": i}, step=i)
        wait_for(lambda: run._publisher.events_spooled == 301)  # RunStarted and the 300
        # the sender's tries come on its own thread, after the spooler's: said at the first,
        # and not again at the next
        wait_for(lambda: run._publisher.sender.failures >= 2)
    assert run.spool_path.stat().st_size > 0
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1  # said once
    fake.down = False
    assert run.finish(timeout=15)
    assert [seq for _, seq, _ in fake.events()] == list(range(302))


def test_finish_with_the_broker_down_returns_within_its_timeout_and_keeps_everything(settings):
    fake = FakeTransport()
    fake.down = True
    fake.delay_s = 0.5  # each attempt hangs a while, like a dead broker
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    for i in range(1000):
        run.log({"x": i}, step=i)
    # it gives up and returns (how soon is the integration test's: test_first_hour.py)
    assert run.finish(timeout=1.0) is False
    assert run.spool_path.exists() and run.spool_path.stat().st_size > 0


def test_a_full_queue_sheds_events_by_a_counted_policy_said_once_and_never_encodes_in_the_caller(
    settings, caplog
):
    """Issue 13 point 8: log() with the queue full used to encode the whole queue itself (1 s stalls)."""
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False, max_queue=50, linger_s=5.0)
    publisher = run._publisher
    encoded = []
    encode = publisher._encode
    publisher._encode = lambda events: encoded.append(threading.current_thread().name) or encode(events)
    # the spooler (woken by a full queue) cannot take events off it while we hold its lock:
    # otherwise how many fit depends on how fast this loop runs
    with caplog.at_level(logging.WARNING, logger="metricbus.producer"), publisher._lock:
        for i in range(500):
            run.log({"x": i}, step=i)
    stats = run.stats()
    assert stats["dropped_events"] == 500 - 49  # RunStarted and 49 events fit; no seq given to the rest
    assert threading.current_thread().name not in encoded  # the caller never encoded anything
    assert sum("outrunning the encoder" in r.getMessage() for r in caplog.records) == 1
    assert run.finish(timeout=15)
    events = fake.events()
    assert [seq for _, seq, _ in events] == list(range(51))  # no gap in the seqs: consumers see none
    assert [b["step"] for _, b in metrics(events)] == list(range(49))


def test_queued_events_reach_the_spool_within_a_linger_while_the_broker_hangs(settings):
    """Issue 13 point 6: a send blocked on a dead broker held up the spooling of new events."""
    fake = FakeTransport()
    fake.delay_s = 3.0  # every send hangs 3 s (a connect timeout), then fails
    fake.down = True
    run = Run("p", settings=settings, transport=fake, system_metrics=False, linger_s=0.02)
    time.sleep(0.2)  # the sender is now inside its first (hanging) send
    for i in range(100):
        run.log({"x": float(i)}, step=i)
    time.sleep(0.3)  # well under the hanging send: the spooler must not wait for it
    assert run._publisher.events_spooled == 101 and not run._publisher.queue
    assert run.spool_path.stat().st_size > 0
    fake.down, fake.delay_s = False, 0.0
    assert run.finish(timeout=15)


def test_bad_values_never_raise_into_the_loop(settings):
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    run.log({"ok": 1.0, "bad": "x"})
    run.log({"bad": None})  # nothing valid: no event at all
    run.log({"ok": 2.0}, step="not-a-step")  # type: ignore[arg-type]
    run.finish(timeout=5)
    assert run.stats()["dropped_values"] == 2
    assert [b["scalars"] for _, b in metrics(fake.events())] == [{"ok": 1.0}]


def test_histograms_tables_and_summary(settings):
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False, config={"lr": 0.1})
    run.log({"a": 1.0}, step=4)
    run.log_histogram("rewards/answer_check_hist", [0.0, 0.5, 1.0, 1.0], bins=2)
    run.log_table("rubric_criteria_summary", ["criterion", "mean"], [["clarity", 0.5]])
    run.finish(summary={"final/a_mean": 1.0}, timeout=5)
    kinds = {body[0]: body[1] for _, _, body in fake.events()}
    assert kinds["metricbus.Histogram"]["counts"] == [1, 3] and kinds["metricbus.Histogram"]["step"] == 4
    assert kinds["metricbus.Table"]["rows"] == [["clarity", 0.5]]
    assert kinds[RUN_FINISHED] == {"status": "finished", "summary": {"final/a_mean": 1.0}}
    assert '"lr": 0.1' in kinds[RUN_STARTED]["config_json"]


@pytest.mark.parametrize(
    "values", [[1.0, 1.0 + 2**-52], [0.0, 5e-324], [1e16] * 4, [1.7976931348623157e308] * 2, [7.0] * 3]
)
def test_a_histogram_of_values_too_close_for_its_bins_is_logged_not_skipped(settings, values):
    """numpy cannot draw 64 distinct edges between 1.0 and its next float, nor around 1e16
    (where +-0.5 rounds away): the call was skipped with an internal error. One bin holds them."""
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    run.log_histogram("w", values, bins=64)
    run.finish(timeout=5)
    (body,) = [b for _, _, (kind, b) in fake.events() if kind == "metricbus.Histogram"]
    assert sum(body["counts"]) == len(values) and run.stats()["skipped_calls"] == 0
    edges = body["edges"]
    assert len(edges) == len(body["counts"]) + 1 and all(map(math.isfinite, edges))
    assert edges[0] <= min(values) and max(values) <= edges[-1] and edges[0] < edges[-1]


def test_unsafe_run_ids_are_refused_at_the_edge(settings):
    with pytest.raises(InvalidNameError, match="run_id"):
        Run("p", run_id="../etc", settings=settings, transport=FakeTransport())


def test_context_manager_marks_failure(settings):
    fake = FakeTransport()
    with pytest.raises(ZeroDivisionError):
        with Run("p", settings=settings, transport=fake, system_metrics=False):
            1 / 0  # noqa: B018
    assert fake.events()[-1][2] == (RUN_FINISHED, {"status": "failed", "summary": {}})


def test_system_sampler_logs_seed_004_system_metrics(settings):
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_interval_s=0.1)
    wait_for(lambda: any(n == "System/CPU_Percent" for _, b in metrics(fake.events()) for n in b["scalars"]))
    run.finish(timeout=5)
    names = {n for _, b in metrics(fake.events()) for n in b["scalars"]}
    assert {
        "System/CPU_Percent",
        "System/Memory_Percent",
        "System/Memory_Used_GB",
        "System/Memory_Available_GB",
        "System/Process_Memory_GB",
    } <= names
    assert any(body[0] == "metricbus.Heartbeat" for _, _, body in fake.events())


def test_a_script_that_forgets_finish_exits_promptly_and_loses_nothing(tmp_path):
    import subprocess
    import sys

    script = f"""
import metricbus
from metricbus.schemas import Settings
run = metricbus.init("p", run_id="forgotten", settings=Settings(offline=True, data_dir={str(tmp_path)!r}))
for i in range(1000):
    run.log({{"x": float(i)}}, step=i)
# no finish(): the atexit hook must flush, and the interpreter must not hang on our threads
"""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", script], check=True, timeout=30)
    assert time.monotonic() - t0 < 20
    from metricbus.producers import Spool

    (path,) = (tmp_path / "spool" / "forgotten").glob("*.spool")
    spool = Spool(path)
    from metricbus.schemas import decode_events, default_codec

    events = [e for record, _ in spool.read_unsent(10_000) for e in decode_events(default_codec(), record)]
    spool.close()
    assert [e.seq for e in events] == list(range(1002))  # RunStarted, 1000 metrics, RunFinished
    assert (events[-1].kind, events[-1].body) == (RUN_FINISHED, {"status": "finished", "summary": {}})


def test_flush_never_returns_while_events_are_between_the_queue_and_the_spool(settings, monkeypatch):
    """The flaky broker-restart test's cause: flush() saw an empty queue and an empty spool while
    the thread was encoding the events it had just taken off the queue, and said they were sent."""
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    assert run._publisher.flush(5)
    publisher = run._publisher
    encode = publisher._encode

    def slow_encode(events):
        time.sleep(0.2)  # a loaded machine: the encoding takes a while
        return encode(events)

    monkeypatch.setattr(publisher, "_encode", slow_encode)
    for i in range(50):
        run.log({"x": float(i)}, step=i)
    publisher._wake.set()
    time.sleep(0.05)  # the thread has taken the events off the queue and is encoding them
    assert publisher.flush(5)
    assert [seq for _, seq, _ in fake.events()] == list(range(51))  # in the transport when flush said so
    run.finish(timeout=5)


def test_batches_are_cut_to_fit_a_kafka_record_and_an_event_too_large_for_any_is_dropped_loudly(
    settings, caplog
):
    """Issue 13 point 7: eight log() calls of 100k scalars made one 15 MB record that never left."""
    from metricbus.schemas import MAX_RECORD_BYTES

    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False, linger_s=0.5)
    wide = {f"m{i}": float(i) for i in range(100_000)}
    for step in range(8):
        run.log(wide, step=step)
    huge = {f"metric/{i:07d}": float(i) for i in range(700_000)}  # ~12 MB as one event
    with caplog.at_level(logging.ERROR, logger="metricbus.producer"):
        run.log(huge, step=8)
        run.log({"after": 1.0}, step=9)
        assert run.finish(timeout=60)
    assert all(len(r) <= MAX_RECORD_BYTES for r in fake.records) and len(fake.records) > 1
    steps = [body["step"] for _, body in metrics(fake.events())]
    assert steps == [0, 1, 2, 3, 4, 5, 6, 7, 9]  # every step but the one no record can hold
    assert run.stats()["lost_events"] == 1
    assert sum("over the 8 MB a Kafka record may hold" in r.getMessage() for r in caplog.records) == 1


def test_a_batch_of_columns_too_large_for_a_record_is_cut_like_its_events(settings):
    """log()'s common batch reaches the encoder as columns (ScalarRows); past the record size
    it is halved as its events, and an unencodable one goes the events' way too."""
    from metricbus.schemas import ScalarRows, decode_events, default_codec

    run = Run("p", settings=settings, transport=FakeTransport(), system_metrics=False)
    publisher = run._publisher
    rows = [{f"m{j}": float(i * j) for j in range(50)} for i in range(40)]
    batch = ScalarRows(list(range(40)), [1_700_000_000_000] * 40, list(range(40)), [None] * 40, 0, rows)
    whole = publisher._encode(batch)
    assert len(whole) == 1
    publisher.max_record_bytes = len(whole[0]) // 3
    cut = publisher._encode(batch)
    assert len(cut) > 3 and all(len(r) <= publisher.max_record_bytes for r in cut)
    got = [e for r in cut for e in decode_events(default_codec(), r)]
    assert [(e.seq, e.body["step"], e.body["scalars"]) for e in got] == [(i, i, rows[i]) for i in range(40)]
    bad = batch._replace(rank=2**40)  # no Avro int: each event is tried alone, each dropped, counted
    assert publisher._encode(bad) == [] and publisher.encode_errors == 40
    run.finish(timeout=5)


def test_an_out_of_range_step_is_said_once_and_counted_not_a_traceback_per_event(settings, caplog):
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    with caplog.at_level(logging.ERROR, logger="metricbus.producer"):
        for _ in range(50):
            run.log({"x": 1.0}, step=2**70)
        run.log({"x": 2.0}, step=3)
    assert run.finish(timeout=10)
    assert [b["step"] for _, b in metrics(fake.events())] == [3]
    assert run.stats()["skipped_calls"] == 50
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "does not fit in 64 bits" in errors[0].getMessage()


def test_a_step_or_epoch_past_64_bits_among_plain_numbers_is_skipped_and_takes_no_seq(settings, caplog):
    """log()'s quick path leaves the range check to the publisher's thread: the batch of columns
    that holds a bad step goes event by event, the bad calls are skipped (said once, counted) and
    the seqs stay consecutive, so nothing reads as lost."""
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    bad = {100: (2**63, None), 200: (5, -(2**63) - 1), 300: (-(2**63) - 1, 7)}
    with caplog.at_level(logging.ERROR, logger="metricbus.producer"):
        for i in range(400):
            step, epoch = bad.get(i, (i, i // 100))
            run.log({"a": float(i), "b": i}, step=step, epoch=epoch)
            if i == 0:
                assert run.flush(timeout=10)  # the names seen: the later batches go as columns
        assert run.flush(timeout=10)  # (and none of them shares a batch with RunFinished)
    assert run.finish(timeout=10)
    got = metrics(fake.events())
    assert [(b["step"], b["epoch"], b["scalars"]) for _, b in got] == [
        (i, i // 100, {"a": float(i), "b": float(i)}) for i in range(400) if i not in bad
    ]
    seqs = [seq for _, seq, _ in fake.events()]
    assert seqs == list(range(len(seqs))) and len(seqs) == 397 + 2  # + RunStarted, RunFinished
    assert run.stats()["skipped_calls"] == 3
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "does not fit in 64 bits" in errors[0]


def test_with_no_broker_the_run_says_so_once_and_kafka_pythons_own_errors_stay_quiet(tmp_path, caplog):
    """Issue 13 point 10: ECONNREFUSED lines from kafka-python reached the user's log over and over."""
    s = Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1")
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("kafka").setLevel(logging.NOTSET)  # as in a fresh process
        run = Run("p", settings=s, system_metrics=False)
        for i in range(20):
            run.log({"x": float(i)}, step=i)
        deadline = time.monotonic() + 15
        while (
            not any("unreachable" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        time.sleep(1.0)  # a few more reconnect attempts
        run.finish(timeout=1.0)
    kafka_lines = [r for r in caplog.records if r.name.startswith("kafka") and r.levelno >= logging.WARNING]
    ours = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert kafka_lines == [] and len(ours) == 1


def test_a_trickle_of_events_is_sent_in_few_requests_and_checked_at_most_once_a_second(settings):
    """Each Kafka request costs the producer ~0.7 ms of CPU: a trickle (an SB3 episode every few ms)
    goes out in no more requests than one per send linger (30 ms) and the send burst (4), and the
    broker is asked whether it lost the topic at most once a second, and once more before finish()
    returns."""

    class Counting(FakeTransport):
        def __init__(self):
            super().__init__()
            self.unverified = False
            self.verifies = 0

        def send(self, key, records):
            super().send(key, records)
            self.unverified = True

        def verify(self):
            self.verifies += 1
            self.unverified = False

    fake = Counting()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    started = time.monotonic()
    for i in range(60):
        run.log({"rollout/episode_return": [float(i)]}, step=i)
        time.sleep(0.005)
    assert run.finish(timeout=10)
    # the time finish() took counts too: on a loaded machine it can outlast a verify interval
    elapsed = time.monotonic() - started
    # not one request per event (60); one per send linger, the burst, and finish()'s flush
    assert fake.calls <= elapsed / run._publisher.sender.send_linger_s + 4 + 1
    assert 1 <= fake.verifies <= elapsed / 1.0 + 2 and not fake.unverified  # verified before finish returned
    assert len(metrics(fake.events())) == 60


def test_the_spooler_takes_a_steady_stream_once_a_linger_and_an_event_after_a_quiet_spell_at_once(settings):
    """With a long linger to tell them apart: events 2 ms apart are spooled in passes at most one a
    linger (a record a pass, what keeps requests few), and an event after a quiet spell within a
    tick (10 ms), not up to a whole linger (here 3 s) later."""
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False, linger_s=3.0)
    publisher = run._publisher
    wait_for(lambda: publisher.events_spooled == 1)  # RunStarted spooled
    time.sleep(3.1)  # quiet for a whole linger
    waits = []
    for i in range(3):
        before, logged = publisher.events_spooled, time.monotonic()
        run.log({"loss": 1.0 / (i + 1)}, step=i)
        wait_for(lambda b=before: publisher.events_spooled > b)
        waits.append(time.monotonic() - logged)
        time.sleep(3.1)  # quiet again
    waits.sort()
    # the median: a tick (10 ms), or a loaded machine's many of them, never the 3 s linger
    assert waits[1] < 1.5, waits

    run = Run("p", settings=settings, transport=fake, system_metrics=False, linger_s=0.2)
    publisher = run._publisher

    passes = []
    appended = publisher.spool.append
    publisher.spool.append = lambda records: passes.append(1) or appended(records)  # type: ignore[method-assign]
    started = time.monotonic()
    for i in range(400):  # 0.8 s or more of an event every 2 ms
        run.log({"loss": 1.0}, step=100 + i)
        time.sleep(0.002)
    elapsed = time.monotonic() - started
    assert run.finish(timeout=10)
    assert 2 <= len(passes) <= elapsed / 0.2 + 2, (len(passes), elapsed)  # + finish()'s own


def test_a_quiet_pipe_sends_an_event_at_once(settings):
    """Events 50 ms apart after a quiet spell go out with the next spool pass (30 ms), not a send
    linger after the previous send: the linger bounds the request rate (a bucket of 4 sends, one
    more per send linger), not each event's wait. At 10 events/s, log() -> sent went from 68 to
    10 ms at the median (bench/stream_throughput.py) with a 100 ms linger."""

    class Timed(FakeTransport):
        def __init__(self):
            super().__init__()
            self.sent_at: list[float] = []

        def send(self, key, records):
            super().send(key, records)
            self.sent_at.append(time.monotonic())

    fake = Timed()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    time.sleep(0.3)  # RunStarted sent: the pipe is quiet
    waits = []
    for i in range(8):  # within the bucket: 4 sends, and more refilled per 50 ms
        sent = len(fake.sent_at)
        logged = time.monotonic()
        run.log({"loss": 1.0 / (i + 1)}, step=i)
        deadline = logged + 2.0
        while len(fake.sent_at) == sent and time.monotonic() < deadline:
            time.sleep(0.002)
        waits.append(fake.sent_at[-1] - logged if len(fake.sent_at) > sent else 2.0)
        time.sleep(max(0.0, logged + 0.05 - time.monotonic()))
    assert run.finish(timeout=10)
    waits.sort()
    assert waits[4] < 0.05, waits  # the median: half a spool pass and a send, not a 100 ms linger


def test_plain_numbers_take_the_fast_path_and_are_checked_on_the_publishers_thread(settings, caplog):
    import numpy as np

    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    before = time.time_ns() // 1_000_000
    with caplog.at_level(logging.WARNING, logger="metricbus.producer"):
        run.log({"f": 1.5, "i": 2, "b": True}, step=0)  # plain: converted later
        run.log({"big": 10**400, "ok": 1.0}, step=1)  # plain to sum, too big for a float
        run.log({7: 1.0, "name": 2.0}, step=2)  # a name that is not a str
        values = [1.0, 2.0]
        run.log({"arr": values, "n": np.float64(3.0)}, step=3)  # the careful path: a snapshot
        values.clear()
        run.log({}, step=4)  # nothing: no event
    assert run.finish(timeout=10)
    after = time.time_ns() // 1_000_000
    got = metrics(fake.events())
    assert [b["scalars"] for _, b in got] == [
        {"f": 1.5, "i": 2.0, "b": 1.0},
        {"ok": 1.0},
        {"name": 2.0},
        {"n": 3.0},
    ]
    assert all(type(v) is float for _, b in got for v in b["scalars"].values())
    assert got[3][1]["samples"] == {"arr": [1.0, 2.0]}  # as it was when logged
    assert [seq for seq, _ in got] == [1, 2, 3, 4] and [b["step"] for _, b in got] == [0, 1, 2, 3]
    from metricbus.schemas import decode_events, default_codec

    stamps = [e.ts_ms for r in fake.records for e in decode_events(default_codec(), r) if e.kind == METRICS]
    assert len(stamps) == 4 and all(before <= ts <= after for ts in stamps)  # milliseconds
    assert run.stats()["dropped_values"] == 2
    assert sum("too large" in r.getMessage() for r in caplog.records) == 1
    assert sum("must be str" in r.getMessage() for r in caplog.records) == 1


def test_a_status_that_is_no_string_ends_the_run_as_finished_with_one_warning(settings, caplog):
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    run.log({"x": 1.0}, step=0)
    with caplog.at_level(logging.WARNING, logger="metricbus.producer"):
        assert run.finish(60)  # meant timeout=60
    assert fake.events()[-1][2] == (RUN_FINISHED, {"status": "finished", "summary": {}})
    assert sum("a status is a string" in r.getMessage() for r in caplog.records) == 1


def test_log_after_finish_is_ignored_with_a_warning_and_a_strict_run_raises_in_the_caller(settings, caplog):
    """log()'s quick path is taken only by an open run that is not strict."""
    from metricbus.schemas import MetricValueError

    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    run.log({"x": 1.0}, step=0)
    assert run.finish(timeout=10)
    with caplog.at_level(logging.WARNING, logger="metricbus.producer"):
        run.log({"x": 2.0}, step=1)
    assert [b["scalars"] for _, b in metrics(fake.events())] == [{"x": 1.0}]
    assert any("is finished; log() is ignored" in r.getMessage() for r in caplog.records)

    strict = Run("p", settings=settings, transport=FakeTransport(), system_metrics=False, strict=True)
    try:
        with pytest.raises(MetricValueError):
            strict.log({7: 1.0}, step=0)  # plain numbers, a name no str: checked here, not later
    finally:
        strict.finish(timeout=10)


def test_under_overload_the_broker_keeps_receiving_while_the_loop_sheds(settings):
    """A loop logging millions of times a second sheds what the encoder cannot take; the sender
    must still publish meanwhile (the spooler held the lock it needs for as long as the queue
    was refilled: nothing reached the broker until the loop stopped)."""
    fake = FakeTransport()
    # a queue of 100 events, which the spooler takes once a linger (30 ms): any loop over ~3,300
    # calls a second sheds, however slow a loaded machine makes it (a queue of 20,000 is never
    # filled by a loop slowed to 16,000 calls a second: nothing shed, nothing tested)
    run = Run("p", settings=settings, transport=fake, system_metrics=False, max_queue=100)
    sent_during: list[int] = []  # records the broker had, sampled every 0.25 s of the loop
    deadline = time.monotonic() + 2.0
    sample_at = time.monotonic() + 0.25
    step = 0
    while time.monotonic() < deadline:
        for _ in range(1000):
            run.log({"x": 1.0, "y": 2.0}, step=step)
            step += 1
        if time.monotonic() >= sample_at:
            sent_during.append(len(fake.records))
            sample_at += 0.25
    stats = run.stats()
    assert stats["dropped_events"] > 0, stats  # it was overloaded
    # published while the loop ran, more than once (the old spooler: every sample 0)
    assert len({n for n in sent_during if n}) >= 2, sent_during
    assert run.finish(timeout=30)
    assert stats["events"] - stats["dropped_events"] <= len(fake.events())


def test_a_steady_fast_loop_is_spooled_in_records_of_a_lingers_worth(settings):
    """At 10,000 events/s (no overload) the spooler takes what a linger interval queued, once per
    interval: not a record per few events as they arrive (each then its own request, the sender
    falling behind: derived points half a second late)."""
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    start, seconds, rate = time.perf_counter(), 1.0, 10_000
    for i in range(int(seconds * rate)):
        while time.perf_counter() < start + i / rate:
            time.sleep(1 / rate / 4)  # as a training step waits on its GPU: the GIL is free meanwhile
        run.log({"x": float(i)}, step=i)
    took = time.perf_counter() - start  # a loaded machine runs the loop slower: more intervals
    assert run.finish(timeout=10)
    assert len(metrics(fake.events())) == seconds * rate
    # a record per 20 ms linger at most (and the run's start and end): ~50 a second, not thousands
    assert len(fake.records) <= 2 * took / run._publisher.linger_s + 5, (len(fake.records), took)
