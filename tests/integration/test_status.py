"""`metricbus status` against the real broker, a real sink process and real runs (issue 9)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from metricbus.ops._status import STATUS_TAIL
from metricbus.producers import Run
from metricbus.schemas import client_options

from .conftest import cli, read_topic, spread_run_ids

pytestmark = pytest.mark.integration


def status(settings, *flags: str) -> tuple[int, dict]:
    result = subprocess.run(
        cli(settings, "status", "--json", "--window", "1", *flags), capture_output=True, text=True, timeout=60
    )
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout, parse_constant=pytest.fail)  # strict JSON


def group(snap: dict, name: str) -> dict:
    (found,) = [g for g in snap["groups"] if g["group"] == name]
    return found


def wait_status(settings, name: str, want: str, timeout: float = 60.0, *flags: str) -> tuple[int, dict]:
    """Until ``name`` has status ``want`` (and, for OK, has read everything: a sink commits where
    its partitions start as soon as it joins, so it is listed, OK, before its first flush)."""
    deadline = time.monotonic() + timeout
    rc, snap = status(settings, *flags)
    while time.monotonic() < deadline:
        if any(
            g["group"] == name and g["status"] == want and (want != "OK" or g["lag"] == 0)
            for g in snap["groups"]
        ):
            return rc, snap
        time.sleep(0.5)
        rc, snap = status(settings, *flags)
    raise AssertionError(f"{name} never {want}: {json.dumps(snap['groups'], indent=1)}")


def test_a_stopped_sink_is_stop_with_its_lag_then_ok_after_a_restart(settings, sink):
    from kafka import KafkaProducer

    sink_group = f"{settings.topic_prefix}sink.parquet"
    proc = sink(flush_interval=0.2)
    run = Run("ops", name="status-run", settings=settings, system_metrics=False)
    run.log({"loss": 1.0}, step=0)
    assert run._publisher.flush(20)
    rc, snap = wait_status(settings, sink_group, "OK")
    assert group(snap, sink_group)["lag"] == 0 and rc == 0

    assert proc.stop() == 0  # the sink commits what it took and leaves
    before = len(read_topic(settings, settings.topics.events, 1))
    for step in range(1, 6):  # five records: each flush publishes what was logged since
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        assert run._publisher.flush(20)
    producer = KafkaProducer(**client_options(settings), enable_idempotence=False)
    producer.send(settings.topics.events, key=b"bad", value=b"not avro at all")
    producer.flush()
    producer.close()
    waiting = len(read_topic(settings, settings.topics.events, before + 6)) - before
    assert waiting == 6

    time.sleep(2.5)  # older than --stop-after: nobody consumes them
    # STOP once the broker says the group has no member: at once on Kafka (the sink left the
    # group), after the session timeout on the embedded broker; SLOW or STALL until then
    rc, snap = wait_status(settings, sink_group, "STOP", 60.0, "--stop-after", "2")
    g = group(snap, sink_group)
    assert g["status"] == "STOP", g
    assert g["lag"] == waiting and g["lag_s"] >= 2.0
    assert rc == 1 and snap["healthy"] is False  # cron, compose and probes can use it
    (row,) = [r for r in snap["runs"] if r["run_id"] == run.run_id]
    assert (row["project"], row["name"], row["state"], row["last_step"]) == ("ops", "status-run", "live", 5)

    sink(flush_interval=0.2)  # a new sink process: it consumes the backlog and dead-letters the bad record
    rc, snap = wait_status(settings, sink_group, "OK", 60.0, "--stop-after", "2")
    assert group(snap, sink_group)["lag"] == 0 and rc == 0
    dead = snap["dead_letters"]
    deadline = time.monotonic() + 30
    while dead["count"] is None and time.monotonic() < deadline:  # unknown, said so, on a busy machine
        dead = status(settings, "--stop-after", "2")[1]["dead_letters"]
    assert dead["count"] == 1 and dead["reasons"][0]["reason"].startswith("BadMagicError")
    assert run.finish(timeout=20)


def test_status_lists_unsent_spools_and_finished_runs(settings):
    offline = dataclasses.replace(settings, offline=True)
    spooled = Run("ops", name="offline", settings=offline, system_metrics=False)
    spooled.log({"x": 1.0}, step=0)
    spooled.finish(timeout=5)
    done = Run("ops", name="done", settings=settings, system_metrics=False)
    done.log({"x": 2.0}, step=0)
    assert done.finish(timeout=20)

    from metricbus.sinks._catchup import add_runs

    add_runs(settings, f"{settings.topic_prefix}sink.wandb", {"old-run-1": False, "old-run-2": True})
    result = subprocess.run(
        cli(settings, "status", "--window", "0.5"), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    text = result.stdout
    assert "RUNS" in text and "CONSUMER GROUPS" in text and "DEAD LETTERS" in text
    (behind,) = [ln for ln in text.splitlines() if "catching up" in ln]
    assert (
        f"{settings.topic_prefix}sink.wandb" in behind
        and "2 run(s) from the archive (old-run-1, old-run-2)" in behind
    )
    (line,) = [ln for ln in text.splitlines() if done.run_id in ln]
    assert "finished" in line and " done " in line
    (spool_line,) = [ln for ln in text.splitlines() if spooled.run_id in ln]
    assert "bytes unsent" in spool_line and "metricbus sync" in spool_line


def test_status_against_an_unreachable_broker_says_so_shows_the_spools_and_watch_goes_on(tmp_path):
    """A broker that is down (or restarting under `metricbus up`): the reason, once; what waits
    in the local spools; and `--watch` keeps watching instead of exiting."""

    from metricbus.schemas import Settings

    from .conftest import free_port

    nowhere = Settings(bootstrap=f"127.0.0.1:{free_port()}", data_dir=tmp_path)
    spooled = Run(
        "ops", name="offline", settings=dataclasses.replace(nowhere, offline=True), system_metrics=False
    )
    spooled.log({"x": 1.0}, step=0)
    spooled.finish(timeout=5)
    result = subprocess.run(cli(nowhere, "status"), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == ""  # said once, in the answer, not again on stderr
    assert result.stdout.count(f"cannot reach Kafka at {nowhere.bootstrap_servers}") == 1
    assert "KAFKA UNREACHABLE: cannot reach Kafka" in result.stdout
    (spool_line,) = [ln for ln in result.stdout.splitlines() if spooled.run_id in ln]
    assert "bytes unsent" in spool_line and "metricbus sync" in spool_line
    as_json = subprocess.run(cli(nowhere, "status", "--json"), capture_output=True, text=True, timeout=60)
    snap = json.loads(as_json.stdout)
    assert as_json.returncode == 2 and snap["healthy"] is False and "cannot reach Kafka" in snap["error"]
    assert [s["run_id"] for s in snap["spools"]] == [spooled.run_id]
    watch = subprocess.Popen(
        cli(nowhere, "status", "--json", "--watch", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = [json.loads(watch.stdout.readline()) for _ in range(2)]  # type: ignore[union-attr]
        assert watch.poll() is None  # still watching
        assert all(s["error"] and s["spools"] for s in seen) and seen[1]["at"] > seen[0]["at"]
    finally:
        watch.terminate()
        watch.wait(timeout=30)


def test_status_with_no_stack_samples_in_one_round_and_joins_or_creates_no_consumer_group(settings, sink):
    """How an ops engineer asks a cluster: no group of its own, none joined, every group at once;
    a live sink that is behind is SLOW, never STOP."""
    from metricbus.schemas import make_admin

    sink(flush_interval=0.2)
    run = Run("ops", name="one-round", settings=settings, system_metrics=False)
    for step in range(20):
        run.log({"loss": 1.0}, step=step)
    assert run._publisher.flush(20)
    admin = make_admin(settings, "test-status-groups")
    ours = settings.topic_prefix  # the broker is shared with the other tests: their groups come and go

    def groups() -> list[str]:
        return sorted(
            g["group_id"]
            for g in admin.list_groups()
            if not g["group_id"].startswith("t") or g["group_id"].startswith(ours)
        )

    # a group that reads only the alerts topic (caught up there): the events waiting for the
    # sink are not its lag
    alerts_only = f"{ours}only.alerts"
    admin_offsets = {TopicPartition(settings.topics.alerts, 0): OffsetAndMetadata(0, "", -1)}
    committer = KafkaConsumer(group_id=alerts_only, enable_auto_commit=False, **client_options(settings))
    try:
        committer.commit(admin_offsets)
    finally:
        committer.close()
    try:
        wait_status(settings, f"{ours}sink.parquet", "OK", 60.0, "--window", "0")  # the sink's group is up
        before = groups()
        rc, snap = status(settings, "--window", "0")
        after = groups()
    finally:
        admin.close()
    assert before == after  # status created or joined no group
    assert rc == 0 and all(g["status"] != "STOP" for g in snap["groups"])
    only = group(snap, alerts_only)
    assert {p["topic"] for p in only["partitions"]} == {settings.topics.alerts}, only
    assert only["lag"] == 0 and only["status"] == "OK", only
    assert run.finish(timeout=20)


def test_a_consumer_that_says_it_runs_is_slow_not_stop_though_the_broker_keeps_no_commit_metadata(settings):
    """The embedded broker drops what a commit says beside its offset and lists a member that
    died: a consumer says it runs on the alive topic, and `status` reads that."""
    from kafka import KafkaProducer

    from metricbus.schemas import alive_stamp

    slow = f"{settings.topic_prefix}sink.slowpoke"
    run = Run("ops", name="slow-run", settings=settings, system_metrics=False)
    run.log({"loss": 1.0}, step=0)
    assert run._publisher.flush(20)
    logged = time.time()  # the record is no younger
    member = KafkaConsumer(  # in the group, heartbeating, and reading nothing more
        settings.topics.events, group_id=slow, enable_auto_commit=False, **client_options(settings)
    )
    try:
        deadline = time.monotonic() + 60
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(timeout_ms=200)
        # records wait from the start; the alive stamp in the commit's metadata is lost
        member.commit({tp: OffsetAndMetadata(0, alive_stamp(), -1) for tp in member.assignment()})
        time.sleep(2.5)  # the records waited longer than --stop-after
        rc, snap = status(settings, "--stop-after", "2", "--sample")
        stopped = group(snap, slow)
        assert stopped["status"] == "STOP" and rc == 1, stopped  # nothing says it runs

        time.sleep(max(0.0, logged + 10.0 - time.time()))
        producer = KafkaProducer(**client_options(settings), enable_idempotence=False)
        producer.send(settings.topics.alive, key=slow.encode(), value=alive_stamp().encode())
        producer.flush()
        producer.close()
        # past the records' wait (STOP, but for the stamp) and as long as `status` may take to
        # start on a loaded machine: the stamp is younger than that
        stop_after = time.time() - logged - 0.5
        rc, snap = status(settings, "--stop-after", f"{stop_after:.1f}", "--sample")
        slowed = group(snap, slow)
        assert slowed["status"] == "SLOW" and "consuming (alive " in slowed["reason"], slowed
        assert slowed["lag"] >= 1 and rc == 0
    finally:
        member.close()
    assert run.finish(timeout=20)


def _records(run: Run, steps: range) -> None:
    """One record of the events topic per step (each flush publishes what was logged since)."""
    for step in steps:
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        assert run._publisher.flush(20)


def test_status_names_a_long_runs_project_though_its_start_is_far_before_the_records_it_reads(settings):
    """`status` reads the last records of each partition; a long run's RunStarted (its project,
    name and world size) is hundreds of records back, among another run's."""
    long_id, other_id = spread_run_ids(settings.partitions, 2)[:2]  # one partition
    long_run = Run("ops-long", name="long-run", run_id=long_id, settings=settings, system_metrics=False)
    other = Run("ops-other", name="chatty", run_id=other_id, settings=settings, system_metrics=False)
    for round_ in range(120):  # 480 records: the long run's every fourth
        _records(long_run, range(round_, round_ + 1))
        _records(other, range(3 * round_, 3 * round_ + 3))
    rc, snap = status(settings, "--window", "0")
    assert rc == 0
    rows = {r["run_id"]: r for r in snap["runs"]}
    assert STATUS_TAIL * settings.partitions < 480  # the long run's start is not in what is read
    assert (rows[long_id]["project"], rows[long_id]["name"], rows[long_id]["last_step"]) == (
        "ops-long",
        "long-run",
        119,
    )
    assert (rows[other_id]["project"], rows[other_id]["name"]) == ("ops-other", "chatty")
    assert long_run.finish(timeout=20) and other.finish(timeout=20)


def test_a_runs_start_is_found_before_or_after_stretches_of_records_not_its_own(settings):
    """One run alone for 70 records, then a second beside it for 118: each one's RunStarted is
    found from near the partition's end, with probes of 20 records (a probe that finds none of
    the run's says it started after)."""
    from metricbus.ops._run_starts import find_starts
    from metricbus.schemas import default_codec, topic_reader

    early_id, late_id = spread_run_ids(settings.partitions, 2)[:2]  # one partition
    early = Run("ops", name="early", run_id=early_id, settings=settings, system_metrics=False)
    _records(early, range(0, 70))
    late = Run("ops", name="late", run_id=late_id, settings=settings, system_metrics=False)
    for step in range(0, 59):
        _records(late, range(step, step + 1))
        _records(early, range(70 + step, 71 + step))
    consumer = topic_reader(settings, "test-starts")
    try:
        tp = TopicPartition(settings.topics.events, 0)
        end = consumer.end_offsets([tp])[tp]
        assert end >= 70 + 2 * 59
        found = find_starts(
            consumer,
            {early_id.encode(): (tp, end - 10), late_id.encode(): (tp, end - 10)},
            settings.signer,
            default_codec(),
            time.monotonic() + 60,
            probe_records=20,
        )
    finally:
        consumer.close()
    assert {e.run_id: e.body["name"] for e in found} == {early_id: "early", late_id: "late"}
    assert len(found) == 2
    assert early.finish(timeout=20) and late.finish(timeout=20)
