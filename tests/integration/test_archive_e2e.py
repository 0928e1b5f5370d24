import asyncio
import subprocess
import threading
import time

import duckdb
import pyarrow.compute as pc
import pytest

from metricbus.producers import Run
from metricbus.schemas import (
    RUN_STARTED,
    client_options,
    default_codec,
    encode_aggregates,
    encode_events,
    run_started,
)
from metricbus.sinks import ParquetArchive, SinkRunner, read_table, tidy

from .conftest import cli, read_topic

pytestmark = pytest.mark.integration


def wait_for_rows(archive, run_id, predicate, timeout=40.0):
    deadline = time.monotonic() + timeout
    table = None
    while time.monotonic() < deadline:
        table = read_table(archive, run_id)
        if predicate(table):
            return table
        time.sleep(0.3)
    return table


def held_seqs(table):
    return sorted(set(zip(table["producer_id"].to_pylist(), table["seq"].to_pylist())))


def test_a_metric_logged_in_a_loop_lands_in_the_archive_with_the_same_value_and_step(settings, sink):
    sink()
    run = Run("grpo/gemma", name="e2e", settings=settings, system_metrics=False, config={"beta": 0.04})
    expected = {}
    for step in range(200):
        values = {
            "Train/Loss": 1.0 / (step + 1),
            "rewards/total_mean": step * 0.01,
            "Epoch/AvgReward": step / 200,
        }
        run.log(values, step=step, epoch=step // 50)
        expected.update({(step, k): v for k, v in values.items()})
    run.log({"rewards/format_exact": [0.0, 1.0, 1.0]}, step=200)
    run.log_histogram("rewards/answer_check_hist", [0.1, 0.2, 0.9], bins=3, step=200)
    run.log_table("rubric_criteria_summary", ["criterion", "mean"], [["clarity", 0.7]])
    assert run.finish(timeout=20)
    events = run.stats()["events"]
    table = wait_for_rows(settings.archive_dir, run.run_id, lambda t: len(held_seqs(t)) >= events)
    assert len(held_seqs(table)) == events
    assert table.num_rows == len(table.to_pylist())
    got = {
        (r[0], r[1]): r[2]
        for r in duckdb.sql(
            f"SELECT step, name, value FROM read_parquet('{settings.archive_dir}/**/*.parquet', hive_partitioning=true) "
            f"WHERE run='{run.run_id}' AND project='grpo/gemma' AND value IS NOT NULL AND name NOT LIKE 'final/%'"
        ).fetchall()
    }
    assert got == expected
    kinds = set(table["kind"].to_pylist())
    assert {
        "metricbus.RunStarted",
        "metricbus.Metrics",
        "metricbus.Histogram",
        "metricbus.Table",
        "metricbus.RunFinished",
    } <= kinds
    samples = [r["samples"] for r in table.to_pylist() if r["name"] == "rewards/format_exact"]
    assert samples == [[0.0, 1.0, 1.0]]


def test_sink_killed_with_sigkill_mid_stream_loses_nothing_and_duplicates_nothing(settings, sink):
    run = Run("p", settings=settings, system_metrics=False)
    stop = threading.Event()

    def produce():
        step = 0
        while not stop.is_set():
            run.log({"a": float(step), "b": -float(step)}, step=step)
            step += 1
            time.sleep(0.0005)

    producer = threading.Thread(target=produce)
    producer.start()
    first = sink(flush_interval=0.2)
    time.sleep(6)  # group join (~3 s on the embedded broker) and a few flushes
    first.kill9()
    second = sink(flush_interval=0.2)
    time.sleep(10)  # the dead member holds its partitions until its session times out (6 s)
    second.kill9()
    third = sink(flush_interval=0.2)
    time.sleep(2)
    stop.set()
    producer.join()
    assert run.finish(timeout=20)
    events = run.stats()["events"]
    table = wait_for_rows(settings.archive_dir, run.run_id, lambda t: len(held_seqs(t)) >= events, timeout=60)
    assert third.stop() == 0
    seqs = held_seqs(table)
    assert [s for _, s in seqs] == list(range(events))  # nothing lost
    scalar_rows = table.filter(pc.equal(table["kind"], "metricbus.Metrics"))
    assert scalar_rows.num_rows == 2 * (events - 2)  # nothing duplicated: one row per scalar
    rows = tidy(settings.archive_dir, run.run_id).to_pylist()
    by_step = {}
    for r in rows:
        by_step.setdefault(r["step"], {})[r["name"]] = r["value"]
    assert len(by_step) == events - 2
    assert all(v == {"a": float(step), "b": -float(step)} for step, v in by_step.items())


class _CrashAfterDurableFlush(ParquetArchive):
    """Dies like kill -9 would, at the worst moment: files renamed into place, offsets not committed."""

    def flush(self):
        super().flush()
        raise _Crash


class _Crash(BaseException):
    pass


def test_crash_between_durable_flush_and_commit_is_deduplicated_on_restart(settings):
    run = Run("p", settings=settings, system_metrics=False)
    for step in range(300):
        run.log({"x": float(step)}, step=step)
    assert run.finish(timeout=20)
    events = run.stats()["events"]

    crashing = SinkRunner(_CrashAfterDurableFlush(settings.archive_dir), settings, flush_interval_s=0.5)
    with pytest.raises(_Crash):
        asyncio.run(crashing.run())
    assert len(held_seqs(read_table(settings.archive_dir, run.run_id))) == crashing.stats.written > 0

    restarted = SinkRunner(ParquetArchive(settings.archive_dir), settings, flush_interval_s=0.5)

    async def until_done():
        task = asyncio.create_task(restarted.run())
        while restarted.stats.events < events and not task.done():
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        restarted.stop()
        return await task

    stats = asyncio.run(until_done())
    assert stats.duplicates == crashing.stats.written  # everything re-delivered was recognised
    table = read_table(settings.archive_dir, run.run_id)
    assert [s for _, s in held_seqs(table)] == list(range(events))
    assert table.num_rows == events  # one row per event here (one scalar each): no duplicate row


class _SlowArchive(ParquetArchive):
    """An archive as slow as W&B's log() is (~0.3 ms an event: here 30 µs), that says when it has begun."""

    def __init__(self, root):
        super().__init__(root)
        self.began = asyncio.Event()

    def write(self, events):
        self.began.set()
        time.sleep(30e-6 * len(events))
        return super().write(events)

    def write_columns(self, columns):
        self.began.set()
        time.sleep(30e-6 * len(columns.seqs))
        return super().write_columns(columns)


def test_a_sink_far_behind_hears_a_stop_within_a_slice_and_the_next_process_writes_the_rest_once(settings):
    from metricbus.sinks._loop import SLICE_BYTES

    run = Run("p", settings=settings, system_metrics=False)
    for step in range(100_000):  # ~9 MB of records, one poll's worth, ~5 slices
        run.log({f"m{j}": step + j / 10 for j in range(10)}, step=step)
    assert run.finish(timeout=60)
    events = run.stats()["events"]

    slow = _SlowArchive(settings.archive_dir)
    first = SinkRunner(slow, settings, flush_interval_s=0.5)

    async def stopped_once_begun():
        task = asyncio.create_task(first.run())
        await asyncio.wait_for(slow.began.wait(), 60)  # set in the first slice: the stop is heard after it
        first.stop()
        return await task

    asyncio.run(stopped_once_begun())
    assert 9 * 1_000_000 // SLICE_BYTES >= 3  # the poll is several slices
    assert 0 < first.stats.written < events // 2, first.stats  # a slice, not the whole poll
    second = SinkRunner(ParquetArchive(settings.archive_dir), settings, flush_interval_s=0.5)

    async def until_done():
        task = asyncio.create_task(second.run())
        while second.stats.events + first.stats.written < events and not task.done():
            await asyncio.sleep(0.1)
        second.stop()
        return await task

    stats = asyncio.run(until_done())
    assert stats.duplicates == 0  # the first committed exactly what it wrote
    table = read_table(settings.archive_dir, run.run_id)
    assert [s for _, s in held_seqs(table)] == list(range(events))
    assert table.num_rows == 10 * (events - 2) + 2  # one row per scalar, RunStarted and RunFinished


def test_undecodable_records_go_to_the_dead_letter_topic_and_the_sink_goes_on(settings, sink):
    from kafka import KafkaProducer

    proc = sink(flush_interval=0.2)
    producer = KafkaProducer(**client_options(settings), enable_idempotence=False)
    producer.send(settings.topics.events, key=b"bad-run", value=b"not avro at all")
    producer.send(settings.topics.events, key=b"bad-run", value=b"\xc3\x01" + b"\x00" * 8 + b"xx")
    escaping = encode_events(
        default_codec(), "a/../../../../escaped", "p", [(0, 1, RUN_STARTED, run_started("x", "y"))]
    )
    producer.send(settings.topics.events, key=b"bad-run", value=escaping)  # decodes; its run id would escape
    point = {"name": "m", "source": "m", "kind": "recent_mean", "epoch": None, "value": 1.0, "ts_ms": 1}
    past_long = encode_aggregates(
        default_codec(), "bad-run", [{**point, "step": s} for s in range(3)], first_seq=2**63 - 2
    )
    producer.send(settings.topics.aggregates, key=b"bad-run", value=past_long)  # its flush failed for ever
    producer.flush()
    producer.close()
    run = Run("p", settings=settings, system_metrics=False)
    run.log({"after": 1.0}, step=0)
    assert run.finish(timeout=20)
    table = wait_for_rows(settings.archive_dir, run.run_id, lambda t: len(held_seqs(t)) >= 3)
    assert len(held_seqs(table)) == 3
    dead = read_topic(settings, settings.topics.deadletter, 4)
    sent = [b"not avro at all", b"\xc3\x01" + b"\x00" * 8 + b"xx", escaping, past_long]
    assert sorted(r.value for r in dead) == sorted(sent)  # two topics: no order between them
    by_value = {r.value: dict(r.headers)["metricbus.reason"].decode() for r in dead}
    reasons = [by_value[v] for v in sent]
    assert "BadMagicError" in reasons[0] and "UnknownSchemaError" in reasons[1]
    assert "UnsafeRecordError: run_id 'a/../../../../escaped' is not usable" in reasons[2]
    assert "SchemaError: first_seq 9223372036854775806: its 3 events would be numbered past" in reasons[3]
    assert not (settings.data_dir.parent / "escaped").exists()
    assert proc.proc.poll() is None  # still running


def test_what_is_held_for_a_run_never_seen_is_let_go_and_its_partition_committed_past(settings, sink):
    """A derived record waits for its run's RunStarted, which may come after it (another topic).

    One whose run never comes (hostile, or its logged events on partitions another instance
    reads) was held for ever and never committed past: the sink's memory grew, and `metricbus
    up`, which restarts the broker only once every group has committed past everything, put its
    restarts off for good. Now it is dead-lettered, with the reason, once the events partitions
    are read past where they ended, and the group's commits reach the end (what `up` reads).
    """
    from kafka import KafkaProducer

    from metricbus.stack._restart import committed

    proc = sink(flush_interval=0.2)
    producer = KafkaProducer(**client_options(settings), enable_idempotence=False)
    point = {
        "name": "m_ema",
        "source": "m",
        "kind": "ema",
        "step": 0,
        "epoch": None,
        "value": 1.0,
        "ts_ms": 1,
    }
    ghost = encode_aggregates(default_codec(), "ghost-run", [point], first_seq=0)
    producer.send(settings.topics.aggregates, key=b"ghost-run", value=ghost)
    producer.flush()
    producer.close()
    run = Run("p", settings=settings, system_metrics=False)
    run.log({"m": 1.0}, step=0)
    assert run.finish(timeout=20)
    wait_for_rows(settings.archive_dir, run.run_id, lambda t: len(held_seqs(t)) >= 3)
    (dead,) = read_topic(settings, settings.topics.deadletter, 1)
    assert dead.value == ghost
    reason = dict(dead.headers)["metricbus.reason"].decode()
    assert reason.startswith(f"run 'ghost-run' was not seen on {settings.topics.events} (no RunStarted")
    group = f"{settings.topic_prefix}sink.parquet"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lags = committed(settings).get(group, [])
        behind = [lag for lag in lags if lag.topic == settings.topics.aggregates and lag.committed != lag.end]
        if lags and not behind:
            break
        time.sleep(0.3)
    assert lags and not behind, lags  # committed past the record let go: `up` may restart the broker
    assert proc.proc.poll() is None  # still running


def test_export_cli_writes_tidy_rows(settings, sink):
    sink()
    run = Run("p", settings=settings, system_metrics=False)
    for step in range(5):
        run.log({"Train/Loss": step / 10}, step=step)
    assert run.finish(timeout=20)
    wait_for_rows(settings.archive_dir, run.run_id, lambda t: len(held_seqs(t)) >= 7)
    out = subprocess.run(
        cli(settings, "export", "--run", run.run_id, "--format", "csv"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[0] == '"run","step","name","value","wall_time"'
    rows = [line.split(",") for line in out[1:]]
    assert [(int(r[1]), r[2], float(r[3])) for r in rows] == [(s, '"Train/Loss"', s / 10) for s in range(5)]
    missing = subprocess.run(cli(settings, "export", "--run", "nope"), capture_output=True, text=True)
    assert missing.returncode == 2 and "no run 'nope' in the archive" in missing.stderr


def test_health_cli_scores_an_archived_run_and_names_a_nan_burst(settings, sink):
    import json

    sink()
    run = Run("p", settings=settings, system_metrics=False)
    for step in range(100):
        loss = float("nan") if 60 <= step < 65 else 1.0 / (step + 1)
        run.log({"Train/Loss": loss, "Train/AvgReward": step / 100}, step=step)
    run.log({"forged\n  validity -0.0 of 20\x1b[2J": float("nan")}, step=100)  # names are untrusted
    assert run.finish(timeout=20)
    wait_for_rows(settings.archive_dir, run.run_id, lambda t: len(held_seqs(t)) >= 103)
    out = subprocess.run(
        cli(settings, "health", run.run_id, "--json"), capture_output=True, text=True, check=True
    ).stdout
    health = json.loads(out, parse_constant=pytest.fail)  # strict JSON: jq and JavaScript read it
    parts = {p["name"]: p for p in health["parts"]}
    assert parts["completeness"]["deducted"] == 0 and parts["pipeline"]["deducted"] == 0  # broker read
    assert "first at step 60" in " ".join(parts["validity"]["evidence"])
    assert 70 < health["score"] < 100
    text = subprocess.run(
        cli(settings, "health", run.run_id), capture_output=True, text=True, check=True
    ).stdout
    assert text.startswith(f"run {run.run_id}: health ") and "validity" in text
    assert "forged\\n  validity -0.0 of 20\\x1b[2J: 1 of 1 values NaN" in text and "\x1b" not in text
    missing = subprocess.run(cli(settings, "health", "nope"), capture_output=True, text=True)
    assert missing.returncode == 2 and "no run 'nope' in the archive" in missing.stderr


def test_compare_cli_shows_the_config_difference_and_flags_a_regression(settings, sink):
    import json
    import random

    sink()
    rng = random.Random(3)
    runs = {}
    for name, lr, level in (("base", 0.1, 1.0), ("slower", 0.01, 1.3)):
        run = Run("p", name=name, settings=settings, system_metrics=False, config={"lr": lr, "seed": 1})
        for step in range(100):
            run.log({"Train/Loss": level + 0.02 * rng.gauss(0, 1), "Train/AvgReward": 0.5}, step=step)
        assert run.finish(timeout=20)
        runs[name] = run.run_id
    for run_id in runs.values():
        wait_for_rows(settings.archive_dir, run_id, lambda t: len(held_seqs(t)) >= 102)
    done = subprocess.run(
        cli(settings, "compare", runs["base"], runs["slower"], "--metric", "Train/Loss", "--json"),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr  # a regression
    out = json.loads(done.stdout, parse_constant=pytest.fail)  # strict JSON
    assert out["config_diff"] == {"lr": {runs["base"]: 0.1, runs["slower"]: 0.01}}  # seed is the same
    (loss,) = out["metrics"]
    assert loss["verdict"] == "worse" and loss["p_value"] < 1e-6 and loss["effect_size"] > 5
    same = subprocess.run(
        cli(settings, "compare", runs["base"], runs["slower"], "--metric", "Train/AvgReward"),
        capture_output=True,
        text=True,
    )
    assert same.returncode == 0 and "lr:" in same.stdout


def test_replay_to_kafka_republishes_every_archived_event_once_in_records_that_fit(settings, sink):
    """`metricbus replay --to kafka --to-prefix NEW.` reads the archive back into fresh topics.

    A run of per-sample arrays: 500 events of 2,000 samples encode to one 8 MB record, over the
    1 MB request a default Kafka producer sends; each record must be cut to fit.
    """
    import dataclasses

    from .conftest import read_events

    sink()
    run = Run("replay/samples", settings=settings, system_metrics=False)
    for step in range(600):
        run.log({"loss": 1.0 / (step + 1), "grads": [step + i / 2000 for i in range(2000)]}, step=step)
    assert run.finish(timeout=60)
    events = run.stats()["events"]
    wait_for_rows(settings.archive_dir, run.run_id, lambda t: len(held_seqs(t)) >= events, timeout=90)
    out = subprocess.run(
        cli(settings, "replay", "--run", run.run_id, "--to", "kafka", "--to-prefix", "copy."),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"republished {events} events" in out.stdout
    copied = read_events(dataclasses.replace(settings, topic_prefix="copy."), events, timeout=60)
    assert sorted(seq for _, seq, _, _ in copied) == list(range(events))
    logged = {b["step"]: b for _, _, kind, b in copied if kind == "metricbus.Metrics"}
    assert sorted(logged) == list(range(600))
    assert logged[599]["scalars"] == {"loss": 1.0 / 600}
    assert logged[599]["samples"]["grads"] == [599 + i / 2000 for i in range(2000)]


def test_a_forged_repeat_of_a_runs_events_is_dead_lettered_by_the_sink_and_the_worker_and_replaces_nothing(
    settings, sink, worker
):
    """Someone writes a record with a real run's (producer_id, seqs) and other values: the sink
    and the worker each dead-letter it with the reason and count it; the genuine values stay,
    once; the genuine record sent again (a producer's retry) is a plain repeat."""
    from kafka import KafkaProducer

    from metricbus.schemas import METRICS, RUN_FINISHED

    codec = default_codec()
    body = {"step": 0, "epoch": None, "rank": 0, "samples": {}}  # x not a whole number: not a counter
    genuine = encode_events(
        codec,
        "forged-run",
        "prod",
        [(0, 1, RUN_STARTED, run_started("p", "n")), (1, 2, METRICS, {**body, "scalars": {"x": 1.5}})],
    )
    forged = encode_events(
        codec,
        "forged-run",
        "prod",
        [(0, 1, RUN_STARTED, run_started("p", "n")), (1, 2, METRICS, {**body, "scalars": {"x": 666.5}})],
    )
    end = encode_events(
        codec, "forged-run", "prod", [(2, 3, RUN_FINISHED, {"status": "finished", "summary": {}})]
    )
    proc = sink(flush_interval=0.2)
    producer = KafkaProducer(**client_options(settings), enable_idempotence=False)
    for value in (genuine, forged, genuine, end):
        producer.send(settings.topics.events, key=b"forged-run", value=value)
    producer.flush()
    producer.close()
    # the worker's derived points (producer metricbus.stream) may be archived before or with these
    logged = lambda t: [s for s in held_seqs(t) if s[0] == "prod"]  # noqa: E731
    table = wait_for_rows(settings.archive_dir, "forged-run", lambda t: len(logged(t)) >= 3)
    assert logged(table) == [("prod", 0), ("prod", 1), ("prod", 2)]
    values = [
        v for n, v in zip(table["name"].to_pylist(), table["value"].to_pylist(), strict=True) if n == "x"
    ]
    assert values == [1.5]
    dead = read_topic(settings, settings.topics.deadletter, 2)
    assert [r.value for r in dead] == [forged, forged]
    headers = [dict(r.headers) for r in dead]
    assert {h["metricbus.consumer"] for h in headers} == {
        settings.groups.sink("parquet").encode(),
        settings.groups.stream.encode(),
    }
    for h in headers:
        assert h["metricbus.reason"].decode() == (
            "ForgedRepeatError: producer 'prod' seqs 0-1: a record with these events was taken before "
            "with other content (forged or corrupted); the first one is kept"
        )
    derived = wait_for_rows(
        settings.archive_dir, "forged-run", lambda t: "x_recent_mean" in t["name"].to_pylist()
    )
    means = [
        v
        for n, v in zip(derived["name"].to_pylist(), derived["value"].to_pylist(), strict=True)
        if n == "x_recent_mean"
    ]
    assert means == [1.5]  # the worker derived from the genuine value only
    assert proc.proc.poll() is None and worker.poll() is None
