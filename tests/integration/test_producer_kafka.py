import dataclasses
import signal
import time

import pytest

from metricbus.producers import Run, sync_spools
from metricbus.schemas import METRICS, RUN_FINISHED, RUN_STARTED, Settings
from metricbus.stack._broker import EmbeddedBroker

from .conftest import free_port, read_events

pytestmark = pytest.mark.integration


def test_100k_scalars_arrive_in_order_with_contiguous_seq(settings):
    run = Run("p", settings=settings, system_metrics=False)
    for i in range(10_000):
        run.log({f"m{j}": i + j / 10 for j in range(10)}, step=i)
    assert run.finish(timeout=30)
    events = read_events(settings, 10_002)
    assert [seq for _, seq, _, _ in events] == list(range(10_002))
    assert events[0][2] == RUN_STARTED and events[-1][2] == RUN_FINISHED
    scalars = [
        (b["step"], name, v)
        for _, _, kind, b in events
        if kind == METRICS
        for name, v in b["scalars"].items()
    ]
    assert len(scalars) == 100_000
    assert scalars[12_345] == (1234, "m5", 1234.5)


def _own_broker_settings(settings, port):
    return dataclasses.replace(settings, bootstrap=f"127.0.0.1:{port}")


def test_broker_down_at_start_then_started_delivers_everything_once(settings, tmp_path):
    port = free_port()
    s = _own_broker_settings(settings, port)
    run = Run("p", settings=s, system_metrics=False)
    for i in range(500):
        run.log({"x": float(i)}, step=i)
    time.sleep(1.0)
    assert run.spool_path.stat().st_size > 0  # kept on disk while nothing listens
    with EmbeddedBroker(port, log_path=tmp_path / "b.log"):
        assert run.finish(timeout=30)
        events = read_events(s, 502)
    assert [seq for _, seq, _, _ in events] == list(range(502))


def test_broker_killed_mid_run_and_restarted_loses_nothing_it_had_acknowledged(settings, tmp_path):
    port = free_port()
    s = _own_broker_settings(settings, port)
    broker = EmbeddedBroker(port, log_path=tmp_path / "b.log").start()
    run = Run("p", settings=s, system_metrics=False)
    for i in range(200):
        run.log({"x": float(i)}, step=i)
    assert run._publisher.flush(10)  # acknowledged by the first broker, which keeps nothing on disk
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait(5)
    for i in range(200, 700):
        run.log({"x": float(i)}, step=i)
    time.sleep(1.0)
    broker = EmbeddedBroker(port, log_path=tmp_path / "b2.log").start()  # memory-only: no topics left
    try:
        assert run.finish(timeout=30)
        events = read_events(s, 702)
        # Everything reached the new broker: what the first broker had acknowledged (the
        # publisher keeps its last minute of acknowledged records and sends them again once it
        # sees the topic was re-created) and everything logged after the kill. Some records
        # arrive twice (delivery is at-least-once; consumers drop duplicates by (producer_id,
        # seq)); and Tansu shows records it acknowledged for a topic it had lost once the topic
        # is re-created, ahead of the resent ones, so the order is the one of a retry.
        seqs = [seq for _, seq, _, _ in events]
        assert sorted(set(seqs)) == list(range(702))
        assert run._publisher.window.records_resent > 0
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(bootstrap_servers=s.bootstrap_servers)
        assert len(consumer.partitions_for_topic(s.topics.events)) == s.partitions
        consumer.close()
    finally:
        broker.stop()


def test_a_full_queue_with_max_block_waits_for_room_and_delivers_everything_in_order(settings):
    """The other overflow policy: the user chose to wait (bounded) rather than shed."""
    run = Run("p", settings=settings, system_metrics=False, max_queue=100, linger_s=0.01, max_block_s=2.0)
    for i in range(3000):
        run.log({"x": float(i)}, step=i)
    stats = run.stats()
    assert stats["overflows"] > 0 and stats["dropped_events"] == 0
    assert run.finish(timeout=30)
    events = read_events(settings, 3002)
    assert [seq for _, seq, _, _ in events] == list(range(3002))


def test_finish_with_no_broker_returns_within_timeout_and_sync_publishes_later(settings, tmp_path, caplog):
    port = free_port()
    s = _own_broker_settings(settings, port)
    run = Run("p", settings=s, system_metrics=False)
    for i in range(1000):
        run.log({"x": float(i)}, step=i)
    t0 = time.monotonic()
    assert run.finish(timeout=2.0) is False
    assert time.monotonic() - t0 < 2.0 + 3.5  # the timeout plus at most one bounded connect attempt
    assert "metricbus sync" in caplog.text
    # The sender ends after its current (bounded) connect attempt and releases the spool.
    for thread in (run._publisher._thread, run._publisher._send_thread):
        thread.join(10)
        assert not thread.is_alive()
    with EmbeddedBroker(port, log_path=tmp_path / "b.log"):
        report = sync_spools(s)
        assert report.records_sent > 0 and not report.spools_failed
        events = read_events(s, 1002)
        assert [seq for _, seq, _, _ in events] == list(range(1002))
    assert not list(s.spool_dir.glob("*/*.spool"))


def test_offline_mode_spools_and_says_so_once(tmp_path, caplog):
    s = Settings(offline=True, data_dir=tmp_path)
    run = Run("p", settings=s, system_metrics=False)
    for i in range(100):
        run.log({"x": float(i)})
    assert run.finish(timeout=1.0) is False
    assert run.spool_path.stat().st_size > 0
    assert caplog.text.count("offline mode") >= 1


def test_a_script_that_never_calls_finish_delivers_everything_at_exit(settings, tmp_path):
    """Exit-time finish() must flush through the producer: kafka-python's own atexit used to close
    it first ("KafkaProducer already closed"), leaving the tail in the spool."""
    import os
    import subprocess
    import sys

    script = (
        "import metricbus\n"
        "run = metricbus.init(project='exit', system_metrics=False)\n"
        "for s in range(25): run.log({'x': float(s)}, step=s)\n"
        "run.flush(10)\n"  # the producer exists (and registered its own atexit) before the exit
        "for s in range(25, 50): run.log({'x': float(s)}, step=s)\n"
    )
    env = {**os.environ, **settings.to_env()}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "already closed" not in result.stderr and "unreachable" not in result.stderr, result.stderr
    events = read_events(settings, 52)
    assert sorted(seq for _, seq, _, _ in events) == list(range(52))  # RunStarted, 50 Metrics, RunFinished


def test_under_overload_the_run_publishes_from_the_start_not_after_it(settings):
    """log() as fast as Python calls it: the connect (several requests, each waiting for the GIL the
    loop holds) took the first seconds, and nothing went out meanwhile. The run connects before
    init returns, and sends while the loop still runs."""
    run = Run("overload", settings=settings, system_metrics=False)
    assert run._publisher.sender.connected.is_set() and run._publisher.transport._client is not None
    t0 = time.monotonic()
    first = None
    step = 0
    while time.monotonic() - t0 < 4.0:
        run.log({"a": 1.0, "b": 2.0}, step=step)
        step += 1
        if first is None and step % 1000 == 0 and run._publisher.sender.records_sent:
            first = time.monotonic() - t0
    assert first is not None, "nothing was sent during 4 s of logging"
    assert run.finish(timeout=120)
    stats = run.stats()
    assert stats["lost_events"] == 0 and stats["events"] == step + 2 - stats["dropped_events"]
