"""A checkpointed processor continues exactly as one that never stopped."""

import logging
import pickle
import random

import pytest

from metricbus.stream_jobs import StreamProcessor
from metricbus.stream_jobs._checkpoint import FORMAT, load, snapshot, write
from metricbus.stream_jobs._rules import DEFAULT_RULES, load_rules

from .test_columns import keyed, run_events


def outputs(processor, events):
    points, alerts = {}, []
    for i in range(0, len(events), 97):
        out = processor.process(events[i : i + 97])
        points |= keyed(p for pts in out.points.values() for p in pts)
        alerts += out.alerts
    return points, alerts


def test_a_restored_processor_derives_and_alerts_like_the_one_that_never_stopped(tmp_path):
    events = run_events(random.Random(11), n=2000)
    for e in events[1510:1700]:  # reward_collapse: a block's median far below the 60 before
        e.body["scalars"]["Train/AvgReward"] = -10.0
    first, second = events[:1005], events[1005:]  # mid-block: the detector's block is half full
    uninterrupted = StreamProcessor(rules=load_rules(DEFAULT_RULES))
    outputs(uninterrupted, first)
    expected = outputs(uninterrupted, second)

    before = StreamProcessor(rules=load_rules(DEFAULT_RULES))
    outputs(before, first)
    path = tmp_path / "stream" / "g" / "partition-3.checkpoint"
    write(path, snapshot(before, 3, 40))
    after = StreamProcessor(rules=load_rules(DEFAULT_RULES))  # the rules are read again at restart
    assert load(path, after) == 40
    assert after.events == 1005 and outputs(after, events[950:1005]) == ({}, [])  # redelivered: dropped
    got = outputs(after, second)
    assert got[1] == expected[1]
    # nan_loss fired at step 400 and is still firing (its 30 s of event time never passed): the
    # restored state must not fire it again; the run's end resolves it (finite for 1,600 steps)
    assert {a["rule"] for a in expected[1] if a["state"] == "firing"} == {"reward_collapse"}
    assert "nan_loss" in {a["rule"] for a in expected[1] if a["state"] == "resolved"}
    assert got[0].keys() == expected[0].keys()
    assert got[0] == pytest.approx(expected[0], nan_ok=True)


def test_a_missing_unreadable_or_foreign_checkpoint_is_ignored(tmp_path, caplog):
    processor = StreamProcessor()
    assert load(tmp_path / "none", processor) is None
    (tmp_path / "bad").write_bytes(b"not a pickle")
    (tmp_path / "old").write_bytes(pickle.dumps({"format": 4, "positions": {0: 7}, "state": {}}))
    with caplog.at_level(logging.WARNING, logger="metricbus.stream"):
        assert load(tmp_path / "bad", processor) is None
        assert load(tmp_path / "old", processor) is None
    assert "unreadable" in caplog.text and f"of format 4 (this worker reads format {FORMAT})" in caplog.text
    assert "rebuilding the partition from the start of the topic" in caplog.text
    assert processor.events == 0


def test_derived_events_are_numbered_the_same_by_a_restored_processor(tmp_path):
    """The derived identity (run, seq) survives a restart: re-derived events keep their seqs."""
    from metricbus.schemas import decode_aggregates, default_codec, encode_aggregates

    codec = default_codec()
    events = run_events(random.Random(5), n=600)

    def numbered(processor, chunk):
        out = {}
        for i in range(0, len(chunk), 97):
            for record in processor.process(chunk[i : i + 97]).aggregate_batches():
                decoded = decode_aggregates(codec, encode_aggregates(codec, **record))
                out.update({e.seq: e.body for e in decoded.events})
        return out

    uninterrupted = StreamProcessor()
    expected = numbered(uninterrupted, events)
    assert sorted(expected) == list(range(len(expected)))  # per run: 0, 1, 2, ... with no gap

    before = StreamProcessor()
    numbered(before, events[:291])
    path = tmp_path / "g.checkpoint"
    write(path, snapshot(before, 0, 3))
    after = StreamProcessor()
    load(path, after)
    resumed = numbered(after, events[291:])
    assert resumed and all(expected[seq] == body for seq, body in resumed.items())


def test_the_one_file_checkpoint_of_older_workers_is_removed_saying_so(tmp_path, caplog):
    from metricbus.schemas import Settings
    from metricbus.stream_jobs import checkpoint_dir, retire_single_file

    settings = Settings(data_dir=tmp_path)
    old = tmp_path / "stream" / "g.checkpoint"
    old.parent.mkdir(parents=True)
    old.write_bytes(pickle.dumps({"format": 4, "positions": {0: 9}, "state": {}}))
    with caplog.at_level(logging.WARNING, logger="metricbus.stream"):
        retire_single_file(settings, "g")
    assert not old.exists() and "rebuilt from the topic once" in caplog.text
    assert checkpoint_dir(settings, "g") == tmp_path / "stream" / "g"
    shared = Settings(data_dir=tmp_path, checkpoint_dir=tmp_path / "shared")
    assert checkpoint_dir(shared, "g") == tmp_path / "shared" / "g"  # METRICBUS_CHECKPOINT_DIR
