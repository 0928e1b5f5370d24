import json

import pytest

from metricbus.schemas import (
    HISTOGRAM,
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    TABLE,
    Event,
    default_codec,
    run_started,
)
from metricbus.sinks.wandb import WandbSink
from tests.wandb_reader import read_run

FP = default_codec().newest("EventBatch").fingerprint


def ev(seq, kind, body, run="run-wb1"):
    return Event(run, "p1", seq, 1_700_000_000_000 + seq, kind, body, FP)


def metrics(seq, step, scalars, samples=None, epoch=None):
    return ev(
        seq, METRICS, {"step": step, "epoch": epoch, "rank": 0, "scalars": scalars, "samples": samples or {}}
    )


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_offline_run_has_config_history_with_steps_histograms_tables_and_summary(tmp_path, offline):
    sink = WandbSink(tmp_path, exclude=["debug/*"])
    assert sink.mode == "offline"
    sink.open()
    sink.write(
        [
            ev(
                0,
                RUN_STARTED,
                run_started("grpo", "gemma", {"beta": 0.04, "num_steps": 3}, tags=["t"]),
            ),
            metrics(1, 10, {"rewards/total_mean": 1.5, "debug/x": 9.0}, epoch=0),
            metrics(2, 5, {"rewards/total_mean": 2.5}),  # a step that goes backwards is kept
            metrics(3, 11, {}, {"rewards/format_exact": [0.0, 1.0, 1.0]}),
            ev(
                4,
                HISTOGRAM,
                {
                    "step": 12,
                    "name": "rewards/answer_check_hist",
                    "edges": [0.0, 0.5, 1.0],
                    "counts": [1, 3],
                    "rank": 0,
                },
            ),
            ev(
                5,
                TABLE,
                {
                    "step": 12,
                    "name": "rubric_criteria_summary",
                    "columns": ["criterion", "mean"],
                    "rows": [["clarity", 0.75]],
                },
            ),
            ev(6, RUN_FINISHED, {"status": "finished", "summary": {"final/format_exact_mean": 0.66}}),
        ]
    )
    sink.flush()
    sink.close()
    run = read_run(tmp_path, "run-wb1")
    assert run["config"]["beta"] in (0.04, {"value": 0.04})
    rows = run["history"]
    assert [(r.get("rewards/total_mean"), r["metricbus/step"]) for r in rows[:2]] == [(1.5, 10), (2.5, 5)]
    assert rows[0]["metricbus/epoch"] == 0
    assert all("debug/x" not in r for r in rows)  # excluded by the glob
    assert rows[2]["rewards/format_exact"]["_type"] == "histogram"
    assert rows[3]["rewards/answer_check_hist"]["values"] == [1, 3]
    table = rows[4]["rubric_criteria_summary"]
    assert table["_type"] == "table-file"
    files = next(tmp_path.glob("wandb/*run-wb1/files"))
    assert json.loads((files / table["path"]).read_text())["data"] == [["clarity", 0.75]]
    assert run["summary"]["final/format_exact_mean"] == 0.66
    assert run["summary"]["metricbus/status"] == "finished"
    assert "metric" in run["kinds"]  # define_metric: the metricbus/step axis
    assert sink.recover("run-wb1") == {"p1": [(0, 6)]}


def test_online_when_an_api_key_is_set(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert WandbSink(tmp_path).mode == "online"


def test_wandb_alert_consumer_raises_an_alert_on_the_run(tmp_path, offline):
    import asyncio

    from metricbus.sinks.alerts import WandbAlerts
    from tests.wandb_reader import records, run_file

    sink = WandbSink(tmp_path / "wandb")  # what `metricbus sink wandb` keeps of the run's start
    sink.open()
    sink.write([ev(0, RUN_STARTED, run_started("grpo/gemma", "g"), run="run-al1")])
    sink.close()
    handler = WandbAlerts(tmp_path / "alerts", runs=tmp_path / "wandb")
    alert = {
        "run_id": "run-al1",
        "rule": "nan_loss",
        "state": "firing",
        "severity": "critical",
        "metric": "Train/Loss",
        "value": None,
        "step": 3,
        "message": "loss is NaN",
        "ts_ms": 0,
    }
    from metricbus.sinks.alerts import Delivery

    assert asyncio.run(handler(alert, Delivery(asyncio.Event())))
    handler.close()
    (got,) = [
        r.alert
        for r in records(run_file(tmp_path / "alerts", "run-al1"))
        if r.WhichOneof("record_type") == "alert"
    ]
    assert read_run(tmp_path / "alerts", "run-al1")["projects"] == {"grpo-gemma"}  # the sink's run's
    assert (got.title, got.level) == ("nan_loss", "ERROR")
    assert got.text == "[FIRING] critical nan_loss: run run-al1 Train/Loss step 3: loss is NaN"


def test_a_restarted_sink_learns_from_the_run_file_what_wandb_wrote_and_logs_only_the_rest(tmp_path, offline):
    """Exactly once after a crash: the W&B run file is the ledger of rows (there is no flush)."""
    from metricbus.sinks import Feeder
    from metricbus.sinks._wandb_file import run_files

    events = [ev(0, RUN_STARTED, run_started("grpo", "gemma"))]
    events += [metrics(i, i - 1, {"Train/Loss": 1.0 / i}) for i in range(1, 201)]
    first = WandbSink(tmp_path)
    first.open()
    Feeder(first).write(events[:151])
    first.close()  # W&B wrote 150 rows
    (path,) = run_files(tmp_path, "run-wb1")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])  # the writer was killed: the file ends mid-record

    second = WandbSink(tmp_path)  # a new process: nothing in memory, no ledger of rows
    second.open()
    feeder = Feeder(second)
    fresh = feeder.fresh(events)  # the consumer group re-delivers everything from the start
    assert 50 < len(fresh) < 200  # the rows the torn file kept are not logged again
    feeder.write(fresh)
    second.close()
    run = read_run(tmp_path, "run-wb1", every_opening=True)
    steps = sorted(r["metricbus/step"] for r in run["history"] if "Train/Loss" in r)
    assert steps == list(range(200))  # every row exactly once across the two openings


def test_a_resumed_run_reopens_the_same_wandb_run_with_its_new_config(tmp_path, offline):
    sink = WandbSink(tmp_path)
    sink.open()
    first = [
        ev(0, RUN_STARTED, run_started("grpo", "gemma", {"lr": 0.1})),
        metrics(1, 0, {"loss": 1.0}),
        ev(2, RUN_FINISHED, {"status": "finished", "summary": {}}),
    ]
    sink.write(first)
    sink.derived_complete("run-wb1")  # the worker closed the run: W&B finishes it
    second = [  # a new attempt (another producer) of the same run id
        Event("run-wb1", "p2", 0, 1_700_000_100_000, RUN_STARTED, run_started("grpo", "x", {"lr": 0.05}), FP),
        Event(
            "run-wb1",
            "p2",
            1,
            1_700_000_100_001,
            METRICS,
            {"step": 1, "epoch": None, "rank": 0, "scalars": {"loss": 0.5}, "samples": {}},
            FP,
        ),
    ]
    assert sink.write(second) == []
    sink.flush()
    sink.close()
    wb = read_run(tmp_path, "run-wb1", every_opening=True)
    assert wb["files"] == 2 and wb["projects"] == {"grpo"}  # one W&B run, opened twice
    assert [r["loss"] for r in wb["history"] if "loss" in r] == [1.0, 0.5]
    assert wb["config"]["lr"] == 0.05


def test_a_rebalance_releases_the_runs_and_the_next_event_reopens_them_once(tmp_path, offline):
    """Two instances pass a run between them: this one finishes its W&B run and reloads what
    the run file holds when the run comes back, so nothing is logged twice."""
    from metricbus.sinks import Feeder

    sink = WandbSink(tmp_path)
    sink.open()
    feeder = Feeder(sink)
    first = [ev(0, RUN_STARTED, run_started("grpo", "gemma", {})), metrics(1, 1, {"loss": 1.0})]
    feeder.write(feeder.fresh(first))
    sink.flush()
    sink.release()  # what the runtime does after the flush of a revocation
    feeder.forget()
    again = first + [metrics(2, 2, {"loss": 0.5})]  # redelivered from the last commit, plus one
    fresh = feeder.fresh(again)
    assert [e.seq for e in fresh] == [2]  # what the W&B run file already held is recognised
    feeder.write(fresh)
    sink.flush()
    sink.close()
    wb = read_run(tmp_path, "run-wb1", every_opening=True)
    assert [r["loss"] for r in wb["history"] if "loss" in r] == [1.0, 0.5]


def test_a_run_finished_before_a_handover_is_closed_by_its_next_owner_once_its_series_end(tmp_path, offline):
    """A run's RunFinished was written, then its partitions moved before the worker's last
    derived points came: the next owner, to whom that RunFinished is a duplicate, still closes
    the run when its derived series end, so W&B writes those points (it holds the rows of an
    open run unwritten: nothing would be committed past them, for ``idle_close_s``)."""
    from metricbus.schemas import DERIVED_PRODUCER
    from metricbus.sinks import Feeder
    from metricbus.sinks._wandb_file import closed, run_files

    sink = WandbSink(tmp_path, finish_grace_s=3600.0)
    sink.open()
    feeder = Feeder(sink)
    logged = [
        ev(0, RUN_STARTED, run_started("grpo", "gemma")),
        metrics(1, 1, {"loss": 1.0}),
        ev(2, RUN_FINISHED, {"status": "failed", "summary": {}}),
    ]
    feeder.write(feeder.fresh(logged))
    sink.flush()
    sink.release()  # a rebalance: the worker's last points are not in yet
    feeder.forget()

    assert feeder.fresh(logged) == []  # redelivered: this owner holds them all, RunFinished too
    final = Event(
        "run-wb1",
        DERIVED_PRODUCER,
        0,
        1_700_000_000_100,
        METRICS,
        metrics(0, 1, {"final/loss": 1.0}).body,
        FP,
    )
    feeder.write(feeder.fresh_derived("run-wb1", [final], True))
    sink.derived_complete("run-wb1")  # the record that closes the run
    sink.flush()
    assert sink.pending() == 0  # W&B wrote the point: it can be committed past
    assert all(closed(path) for path in run_files(tmp_path, "run-wb1"))
    wb = read_run(tmp_path, "run-wb1", every_opening=True)
    assert [r["final/loss"] for r in wb["history"] if "final/loss" in r] == [1.0]
    assert wb["exit_codes"] == [1, 1]  # each opening closed as its RunFinished said: failed

    later = Event(
        "run-wb1", DERIVED_PRODUCER, 1, 1_700_000_000_200, METRICS, metrics(0, 1, {"x": 2.0}).body, FP
    )
    feeder.write(feeder.fresh_derived("run-wb1", [later], True))  # after both: closed by the flush
    sink.flush()
    assert sink.pending() == 0 and all(closed(path) for path in run_files(tmp_path, "run-wb1"))
    sink.close()


def test_a_finished_run_file_is_complete_when_finish_returns(tmp_path, offline):
    """W&B's own finish() returns before its service writes the file (read right after, it
    can be empty); the next opening reads that file as its ledger, so the sink waits for it."""
    from metricbus.sinks import Feeder
    from metricbus.sinks._wandb_file import closed, run_files

    sink = WandbSink(tmp_path)
    sink.open()
    feeder = Feeder(sink)
    events = [ev(0, RUN_STARTED, run_started("grpo", "g"))]
    for seq in range(1, 11):  # ten openings of one run, as ten rebalances would give
        events.append(metrics(seq, seq, {"x": float(seq)}))
        feeder.write(feeder.fresh(events))
        sink.flush()
        sink.release()
        feeder.forget()
        assert all(closed(path) for path in run_files(tmp_path, "run-wb1"))  # at once: no waiting
    run = read_run(tmp_path, "run-wb1", every_opening=True)
    assert [r["x"] for r in run["history"]] == [float(seq) for seq in range(1, 11)]


def test_a_run_file_the_writer_never_flushed_holds_no_rows(tmp_path, offline):
    """W&B buffers a run file until it closes it: a sink killed before that leaves it empty,
    and the restarted sink logs every row again instead of failing to read it."""
    from metricbus.sinks._wandb_file import closed, records

    path = tmp_path / "wandb" / "offline-run-20260101_000000-run-wb1" / "run-run-wb1.wandb"
    path.parent.mkdir(parents=True)
    for written in (b"", b":W&"):  # nothing yet, or killed within the header
        path.write_bytes(written)
        assert list(records(path)) == [] and not closed(path)
    sink = WandbSink(tmp_path)
    sink.open()
    assert sink.recover("run-wb1") == {}
    (tmp_path / "not-wandb.wandb").write_bytes(b"garbage!")
    with pytest.raises(ValueError, match="not a W&B run file"):
        list(records(tmp_path / "not-wandb.wandb"))
    assert not closed(tmp_path / "not-wandb.wandb")


def test_closed_reads_a_long_run_file_s_last_blocks_and_agrees_with_a_full_read_at_every_cut(
    tmp_path, offline
):
    """``closed`` reads only the last two 32 KiB blocks; cut there (every 389th byte, and every
    byte around a block boundary), it must say what a read of the whole file says (the last
    whole record is the run's exit, or not)."""
    from collections import deque

    from metricbus.sinks._wandb_file import BLOCK, closed, records, run_files

    sink = WandbSink(tmp_path)
    sink.open()
    events = [ev(0, RUN_STARTED, run_started("grpo", "g"))]
    events += [metrics(seq, seq, {f"m{j}": seq + j / 10 for j in range(10)}) for seq in range(1, 800)]
    events.append(ev(800, RUN_FINISHED, {"status": "finished", "summary": {}}))
    sink.write(events)
    sink.flush()
    sink.close()
    [path] = run_files(tmp_path, "run-wb1")
    data = path.read_bytes()
    assert len(data) > 4 * BLOCK and closed(path)
    cut = tmp_path / "wandb" / "cut" / "run-cut.wandb"
    cut.parent.mkdir()
    start = len(data) - 2 * BLOCK
    # every 389th byte, and around each block boundary (a chunk's 7-byte header starts there)
    ends = (
        set(range(start, len(data) + 1, 389))
        | {len(data) - 1, len(data)}
        | {b + d for b in range(start // BLOCK * BLOCK, len(data), BLOCK) for d in range(-2, 10)}
    )
    for end in sorted(e for e in ends if start <= e <= len(data)):
        cut.write_bytes(data[:end])
        last = deque(records(cut), maxlen=1)
        assert closed(cut) == (bool(last) and last[0].WhichOneof("record_type") == "exit"), end


def test_recover_reads_each_run_file_once_and_then_only_new_or_grown_ones(tmp_path, offline, monkeypatch):
    import metricbus.sinks.wandb as module
    from metricbus.sinks import Feeder

    read: list = []
    real = module.logged_ids
    monkeypatch.setattr(
        module, "logged_ids", lambda path, key: read.append(path.parent.name) or real(path, key)
    )
    sink = WandbSink(tmp_path)
    sink.open()
    feeder = Feeder(sink)
    events = [ev(0, RUN_STARTED, run_started("grpo", "g"))]
    for seq in range(1, 4):  # three openings of the run, as three restarts of the sink would give
        events.append(metrics(seq, seq, {"x": float(seq)}))
        feeder.write(feeder.fresh(events))
        sink.flush()
        sink.release()
        feeder.forget()
    # each opening's recover read the files it had not read before: 0, then 1, then 1 more
    assert len(read) == 2 and len(set(read)) == 2
    restarted = WandbSink(tmp_path)  # a new process: the ledger on disk says what was read
    restarted.open()
    assert restarted.recover("run-wb1") == {"p1": [(0, 3)]}  # RunStarted by the ledger, rows by the files
    assert len(read) == 3  # only the third opening's file, closed since
    restarted.recover("run-wb1")
    assert len(read) == 3


def _log_file(path, records):
    """A run file in W&B's LevelDB log format (header, 32 KiB blocks, records split across them)."""
    import struct

    from metricbus.sinks._wandb_file import BLOCK, HEADER

    out = bytearray(b":W&B\xe1\xbe\x00")
    for data in (r.SerializeToString() for r in records):
        first = True
        while True:
            room = BLOCK - len(out) % BLOCK
            if room < HEADER:
                out += b"\x00" * room
                continue
            piece, data = data[: room - HEADER], data[room - HEADER :]
            kind = (1 if not data else 2) if first else (4 if not data else 3)
            out += struct.pack("<IHB", 0, len(piece), kind) + piece
            first = False
            if not data:
                break
    path.write_bytes(bytes(out))
    return bytes(out)


def test_closed_finds_an_exit_record_that_begins_in_the_block_before_the_last(tmp_path):
    from wandb.proto import wandb_internal_pb2 as pb

    from metricbus.sinks._wandb_file import BLOCK, HEADER, closed, records

    def history(size):
        r = pb.Record()
        r.history.item.add(key="pad", value_json='"' + "x" * size + '"')
        return r

    exit_record = pb.Record()
    exit_record.exit.exit_code = 0
    exit_record.exit.runtime = 123456
    exit_size = len(exit_record.SerializeToString())
    path = tmp_path / "run-x.wandb"
    for n in range(3 * BLOCK - 300, 3 * BLOCK):  # a padding row (split across blocks) of n bytes
        start = len(_log_file(path, [history(10), history(n)]))  # where the exit record begins
        if 0 < 3 * BLOCK - start - HEADER < exit_size:  # its first piece in the third block
            break
    data = _log_file(path, [history(10), history(n), exit_record])
    assert 3 * BLOCK < len(data) < 4 * BLOCK  # ... and its last piece in the fourth
    assert [r.WhichOneof("record_type") for r in records(path)] == ["history", "history", "exit"]
    assert closed(path)
    path.write_bytes(data[:-1])  # torn: its last piece is short
    assert not closed(path)


def test_a_run_started_whose_config_is_no_object_is_refused_but_its_run_keeps_its_project(tmp_path, offline):
    """A RunStarted with config_json "[1]" once made every later event of its run fail (dict([1]))."""
    sink = WandbSink(tmp_path)
    sink.open()
    bad = ev(0, RUN_STARTED, {**run_started("grpo", "gemma", {}), "config_json": "[1]"})
    no_bins = ev(1, HISTOGRAM, {"step": 1, "name": "h", "edges": [], "counts": [], "rank": 0})
    rejected = sink.write(
        [bad, no_bins, metrics(2, 3, {"Train/Loss": 0.5}), metrics(3, 4, {"Train/Loss": 0.25})]
    )
    sink.flush()
    sink.close()
    assert [(e.seq, why) for e, why in rejected] == [
        (
            0,
            "wandb cannot take this metricbus.RunStarted event: ValueError: config_json must be a JSON object, got list",
        ),
        (
            1,
            "wandb cannot take this metricbus.Histogram event: ValueError: a histogram needs one edge more than counts: 0 for 0",
        ),
    ]
    run = read_run(tmp_path, "run-wb1")
    assert run["projects"] == {"grpo"}
    assert [(r["Train/Loss"], r["metricbus/step"]) for r in run["history"]] == [(0.5, 3), (0.25, 4)]


def test_tags_wandb_refuses_are_mended_and_the_run_opens(tmp_path, offline):
    """W&B refuses a tag that is empty or over 64 characters: every event of the run was refused."""
    long = "t" * 65
    sink = WandbSink(tmp_path)
    sink.open()
    started = ev(0, RUN_STARTED, run_started("grpo", "gemma", {"lr": 0.1}, tags=["", long, "ok", "ok"]))
    assert sink.write([started, metrics(1, 3, {"Train/Loss": 0.5})]) == []
    sink.flush()
    sink.close()
    run = read_run(tmp_path, "run-wb1")
    (mended,) = [t for t in run["tags"] if t != "ok"]
    assert run["tags"] == [mended, "ok"]  # in their order, once each
    assert len(mended) == 64 and mended.startswith("t" * 47 + "~")
    assert run["config"]["metricbus/tags"] == ["", long, "ok", "ok"] and run["config"]["lr"] == 0.1
    assert [(r["Train/Loss"], r["metricbus/step"]) for r in run["history"]] == [(0.5, 3)]


def test_the_cache_of_wanted_names_is_bounded_and_its_verdicts_hold(tmp_path, monkeypatch):
    monkeypatch.setattr("metricbus.sinks._protocol.NAMES_KEPT", 4)
    sink = WandbSink(tmp_path, exclude=["debug/*"])
    verdicts = [sink._wanted(f"{'debug' if i % 2 else 'train'}/{i}") for i in range(20)]
    assert verdicts == [i % 2 == 0 for i in range(20)] and len(sink._wanted._verdicts) <= 4


def test_names_wandb_or_the_sink_give_a_meaning_are_kept_under_keys_of_their_own(tmp_path, offline):
    """W&B dropped a logged _step, took _timestamp as the row's time; _metricbus_id and
    metricbus/step were overwritten by the sink's own (a seq-less row's float id broke the
    ledger a restart reads); an empty name was dropped."""
    from metricbus.sinks.wandb import wandb_key

    names = ["_step", "_timestamp", "_runtime", "_metricbus_id", "metricbus/step", ""]
    sink = WandbSink(tmp_path)
    sink.open()
    scalars = {name: float(i) for i, name in enumerate(names)}
    assert sink.write([ev(0, RUN_STARTED, run_started("p", "n")), metrics(1, 5, {"a": 1.0, **scalars})]) == []
    sink.flush()
    sink.close()
    (row,) = read_run(tmp_path, "run-wb1")["history"]
    assert {name: row[wandb_key(name)] for name in names} == scalars
    assert len({wandb_key(name) for name in names} | set(names)) == 2 * len(names)  # all distinct
    assert (row["metricbus/step"], row["_metricbus_id"], row["a"]) == (5, "p1/1", 1.0)
    assert row["_timestamp"] > 1e9  # W&B's own time of the row
    assert dict(WandbSink(tmp_path).recover("run-wb1")) == {"p1": [(0, 1)]}


class _Letters:
    """The dead-letter topic, as a runner's producer sees it."""

    def __init__(self) -> None:
        self.sent: list = []

    async def send_and_wait(self, topic, value, key, headers):
        self.sent.append((value, dict(headers)))


class _Consumer:
    """Where a runner's partitions end and where it stands, as its aiokafka consumer says."""

    def __init__(self) -> None:
        self.ends: dict = {}
        self.positions: dict = {}
        self.stopped: set = set()

    def assignment(self):
        return set(self.positions)

    def pause(self, *partitions):
        self.stopped.update(partitions)

    def paused(self):
        return set(self.stopped)

    def resume(self, *partitions):
        self.stopped.difference_update(partitions)

    async def end_offsets(self, partitions):
        return {tp: self.ends[tp] for tp in partitions}

    async def position(self, tp):
        return self.positions[tp]


def _alert(run, seq, state="firing", rule="nan_loss"):
    return {
        "run_id": run,
        "rule": rule,
        "state": state,
        "severity": "critical",
        "metric": "Train/Loss",
        "value": None,
        "step": 3,
        "message": "loss is NaN",
        "ts_ms": 1_700_000_000_000 + seq,
        "seq": seq,
    }


def test_sink_alerts_raise_each_alert_once_on_the_run_the_sink_holds_open(tmp_path, offline):
    """`sink wandb --alerts`: the alerts land in the sink's own run (its file, its project), not
    in a second process's run of the same id (W&B: "unexpected results"); an alert that
    overtakes its run's RunStarted waits for it; a restarted sink raises none twice."""
    import asyncio
    import types

    from metricbus.schemas import Settings, encode_events
    from metricbus.sinks import SinkRunner
    from tests.wandb_reader import records, run_files

    codec = default_codec()
    settings = Settings(data_dir=tmp_path)
    topics = settings.topics
    started = encode_events(
        codec, "run-al2", "p1", [(0, 1_700_000_000_000, RUN_STARTED, run_started("grpo", "g"))]
    )
    first = [
        (topics.alerts, codec.encode("Alert", _alert("run-al2", 0))),  # before its RunStarted
        (topics.events, started),
        (topics.alerts, codec.encode("Alert", _alert("run-al2", 0))),  # the worker sent it again
        (topics.alerts, codec.encode("Alert", _alert("run-al2", 1, "resolved"))),
        (topics.alerts, codec.encode("Alert", _alert("..", 2))),  # unusable: a dead letter
        (topics.alerts, codec.encode("EventBatch", codec.decode(started)[1])),  # not an alert
    ]

    def run(batches):
        runner = SinkRunner(WandbSink(tmp_path / "wandb"), settings, alerts=True)
        assert topics.alerts in runner.topics
        runner._producer = runner.dead_letters.producer = runner.commits.producer = letters = _Letters()
        runner.open()
        held = []
        for batch in batches:
            asyncio.run(
                runner._process(
                    [
                        types.SimpleNamespace(topic=t, partition=0, offset=i, value=v, key=None)
                        for i, (t, v) in enumerate(batch)
                    ]
                )
            )
            held.append(sorted(runner.held.alerts))
        runner.flush()
        runner.close()
        return letters, held

    letters, held = run([first[:1], first[1:]])
    assert held == [["run-al2"], []]  # the first alert waited for its run's RunStarted
    reasons = [headers["metricbus.reason"] for _, headers in letters.sent]
    assert len(reasons) == 2 and b"not usable" in reasons[0] and b"a EventBatch record" in reasons[1]
    (path,) = run_files(tmp_path / "wandb", "run-al2")
    raised = [(r.alert.title, r.alert.level) for r in records(path) if r.WhichOneof("record_type") == "alert"]
    assert raised == [("nan_loss", "ERROR"), ("nan_loss resolved", "INFO")]
    assert read_run(tmp_path / "wandb", "run-al2")["projects"] == {"grpo"}  # the sink's own run
    run([first])  # a restart, the same records again
    again = [
        r.alert.title
        for p in run_files(tmp_path / "wandb", "run-al2")
        for r in records(p)
        if r.WhichOneof("record_type") == "alert"
    ]
    assert again == ["nan_loss", "nan_loss resolved"]  # none twice


def test_an_alert_whose_run_never_comes_is_let_go_once_the_events_are_read_past_it(tmp_path, offline):
    """Held while the events partitions are read up to where they ended after it came (its run's
    RunStarted may be there); past them with no sight of its run, it is dead-lettered with the
    reason and its partition committed past it (it was held, and the commit held back, for ever)."""
    import asyncio
    import types

    from aiokafka import TopicPartition

    from metricbus.schemas import Settings, encode_events
    from metricbus.sinks import SinkRunner
    from tests.wandb_reader import records, run_files

    codec = default_codec()
    settings = Settings(data_dir=tmp_path)
    topics = settings.topics
    runner = SinkRunner(WandbSink(tmp_path / "wandb"), settings, alerts=True)
    runner._producer = runner.dead_letters.producer = runner.commits.producer = letters = _Letters()
    runner._consumer = runner.commits.consumer = consumer = _Consumer()
    events, alerts = TopicPartition(topics.events, 0), TopicPartition(topics.alerts, 0)
    consumer.ends = {events: 2}  # the RunStarted of run-al3 is its last record, at offset 1
    consumer.positions = {events: 1, alerts: 2}
    runner.open()

    def record(tp, offset, value):
        return types.SimpleNamespace(topic=tp.topic, partition=0, offset=offset, value=value, key=None)

    overtaking = [
        record(alerts, 0, codec.encode("Alert", _alert("run-al3", 0))),
        record(alerts, 1, codec.encode("Alert", _alert("ghost", 0))),
    ]
    asyncio.run(runner._process_sliced(overtaking))
    assert (
        sorted(runner.held.alerts) == ["ghost", "run-al3"] and letters.sent == []
    )  # events not read to their end
    assert runner._uncommitted[alerts] == 0
    consumer.positions[events] = 2
    runner._next_let_go_check = 0.0
    started = encode_events(
        codec, "run-al3", "p1", [(0, 1_700_000_000_000, RUN_STARTED, run_started("grpo", "g"))]
    )
    asyncio.run(runner._process_sliced([record(events, 1, started)]))
    assert runner.held.alerts == {}
    ((value, headers),) = letters.sent
    assert value == overtaking[1].value
    assert (
        headers["metricbus.reason"]
        .decode()
        .startswith(f"run 'ghost' was not seen on {topics.events} (no RunStarted nor any logged event of it)")
    )
    assert runner._uncommitted[alerts] == 2  # committed past it at the next flush
    runner.flush()
    runner.close()
    (path,) = run_files(tmp_path / "wandb", "run-al3")
    assert [r.alert.title for r in records(path) if r.WhichOneof("record_type") == "alert"] == ["nan_loss"]


def test_a_sink_holding_too_much_for_unseen_runs_reads_only_the_events_until_half_is_released(
    tmp_path, offline, monkeypatch
):
    """A sink catching up reads the small alerts and aggregates topics far ahead of the events
    that bring their runs' RunStarted: what it held for them grew without bound."""
    import asyncio
    import types

    from aiokafka import TopicPartition

    from metricbus.schemas import Settings, encode_events
    from metricbus.sinks import SinkRunner, _held

    monkeypatch.setattr(_held, "MAX_HELD_RECORDS", 4)
    codec = default_codec()
    settings = Settings(data_dir=tmp_path)
    topics = settings.topics
    runner = SinkRunner(WandbSink(tmp_path / "wandb"), settings, alerts=True)
    runner._producer = runner.dead_letters.producer = runner.commits.producer = _Letters()
    runner._consumer = runner.commits.consumer = consumer = _Consumer()
    events, alerts = TopicPartition(topics.events, 0), TopicPartition(topics.alerts, 0)
    consumer.ends = {events: 10}
    consumer.positions = {events: 0, alerts: 4}
    runner.open()

    def record(tp, offset, value):
        return types.SimpleNamespace(topic=tp.topic, partition=0, offset=offset, value=value, key=None)

    runs = ["run-a", "run-a", "run-a", "run-b"]
    overtaking = [record(alerts, i, codec.encode("Alert", _alert(r, i))) for i, r in enumerate(runs)]
    asyncio.run(runner._process_sliced(overtaking[:3]))
    assert consumer.stopped == set()  # 3 held
    asyncio.run(runner._process_sliced(overtaking[3:]))
    assert consumer.stopped == {alerts}  # 4 held: the alerts wait, the events are read
    started = encode_events(
        codec, "run-b", "p1", [(0, 1_700_000_000_000, RUN_STARTED, run_started("p", "b"))]
    )
    consumer.positions[events] = 1
    asyncio.run(runner._process_sliced([record(events, 0, started)]))
    assert consumer.stopped == {alerts}  # 3 held: more than half
    started = encode_events(
        codec, "run-a", "p2", [(0, 1_700_000_000_001, RUN_STARTED, run_started("p", "a"))]
    )
    consumer.positions[events] = 2
    asyncio.run(runner._process_sliced([record(events, 1, started)]))
    assert runner.held.alerts == {} and consumer.stopped == set()  # read again
    runner.close()


def test_a_run_nothing_was_written_to_for_a_while_is_closed_and_reopened_on_its_next_event(tmp_path, offline):
    """A run killed without its RunFinished stayed open in the sink for ever (a descriptor here
    and three in wandb-core, ~0.3 MB each, measured): after ~340 such runs wandb-core would run
    out of descriptors under a usual limit of 1,024."""
    sink = WandbSink(tmp_path, idle_close_s=0.0)
    sink.open()
    sink.write([ev(0, RUN_STARTED, run_started("grpo", "g")), metrics(1, 0, {"x": 1.0})])
    sink.flush()  # idle since: closed
    assert sink._runs == {} and sink._ledgers == {}
    sink.write([metrics(2, 1, {"x": 2.0})])
    assert list(sink._runs) == ["run-wb1"]  # reopened
    sink.close()
    run = read_run(tmp_path, "run-wb1", every_opening=True)
    assert run["files"] == 2 and [(r["metricbus/step"], r["x"]) for r in run["history"]] == [
        (0, 1.0),
        (1, 2.0),
    ]
    assert WandbSink(tmp_path).recover("run-wb1") == {"p1": [(0, 2)]}  # each event once, from the files


def test_a_run_written_to_lately_stays_open_across_flushes(tmp_path, offline):
    sink = WandbSink(tmp_path)  # closed after 10 minutes without a row
    sink.open()
    sink.write([ev(0, RUN_STARTED, run_started("grpo", "g")), metrics(1, 0, {"x": 1.0})])
    sink.flush()
    assert list(sink._runs) == ["run-wb1"]
    sink.close()


def test_the_ledgers_of_runs_not_open_are_not_kept_in_memory_after_a_flush(tmp_path, offline):
    """Each run a sink was asked about (a restart's catch-up, a run its feeder forgot and saw
    again) kept its ledger in memory for ever."""
    sink = WandbSink(tmp_path)
    sink.open()
    sink.write([ev(0, RUN_STARTED, run_started("grpo", "g")), metrics(1, 0, {"x": 1.0})])
    sink.close()
    again = WandbSink(tmp_path)
    again.open()
    assert again.recover("run-wb1") == {"p1": [(0, 1)]}
    again.flush()
    assert again._ledgers == {}
    assert again.recover("run-wb1") == {"p1": [(0, 1)]}  # read again, from its files and ledger


def test_rows_wandb_takes_but_does_not_write_are_held_up_to_a_bound_then_the_flush_fails(
    tmp_path, offline, monkeypatch
):
    """Each row waits in memory until W&B's file shows it: a W&B that never writes (its disk
    full, a stalled service) must not make the sink hold rows without end."""
    from metricbus.sinks import wandb as module

    reads = module.logged_ids_from
    monkeypatch.setattr(module, "MAX_WAITING_ROWS", 50)
    monkeypatch.setattr(module, "logged_ids_from", lambda path, key, start: ([], start))  # writes nothing
    sink = WandbSink(tmp_path)
    sink.open()
    sink.write(
        [ev(0, RUN_STARTED, run_started("p", "n")), *(metrics(i, i, {"x": 1.0}) for i in range(1, 41))]
    )
    sink.flush()  # 40 rows waiting: under the bound
    assert sink.confirmed() == (41, 1)  # only RunStarted (ledgered) is durable
    sink.write([metrics(i, i, {"x": 1.0}) for i in range(41, 61)])
    with pytest.raises(RuntimeError, match="has not written 60 rows"):
        sink.flush()
    monkeypatch.setattr(module, "logged_ids_from", reads)  # W&B's file is read again: the rows are there
    sink.close_run("run-wb1")
    sink.flush()
    assert sink.confirmed() == (61, 61) and sink.pending() == 0


def test_media_the_full_disk_cannot_take_wait_and_are_not_dead_lettered(small_disk, tmp_path, offline):
    """The bytes of a Media event are put beside the W&B runs for W&B to copy; on a full disk that
    is the destination's state (Unavailable: nothing committed, read again later), not a bad event."""
    from metricbus.schemas import MEDIA, MediaStore, ref_of
    from metricbus.sinks._protocol import Unavailable
    from tests.conftest import fill

    store = MediaStore(tmp_path / "media")
    digest = store.put(b"a text sample")
    body = {
        "step": 1,
        "name": "completion",
        "rank": 0,
        "kind": "text",
        "media_type": "text/plain; charset=utf-8",
        "size": 13,
        "digest": digest,
        "ref": ref_of(digest),
        "caption": None,
        "width": 0,
        "height": 0,
        "frames": 0,
        "rate": 0.0,
        "channels": 0,
    }
    sink = WandbSink(small_disk / "wandb", media=store)
    sink.open()
    assert sink.write([ev(0, RUN_STARTED, run_started("p", "r")), metrics(1, 0, {"x": 1.0})]) == []
    filler = fill(small_disk)
    with pytest.raises(Unavailable, match="cannot put media for W&B"):
        sink.write([ev(2, MEDIA, body)])
    filler.unlink()
    assert sink.write([ev(2, MEDIA, body)]) == []  # room again: taken
    sink.close()
    history = read_run(small_disk / "wandb", "run-wb1")["history"]
    assert [r["completion"]["_type"] for r in history if "completion" in r] == ["html-file"]
