"""Schema-valid hostile records (``tests/hostile.py``) through every in-process reader.

The stream worker's processor, the TensorBoard and Parquet sinks, the dashboard's board, and
``health`` and the report over what the archive kept: none raises out of its guard, none hangs,
and what they wrote reads back. Each finding of the twelfth session's fuzzing was a test of its
own; this keeps the fuzzing itself in ``make test`` (seeded; the W&B sink, a wandb-core process
per run, is fuzzed by hand: see the README).
"""

from __future__ import annotations

import json
import pickle

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from metricbus._board import RunBoard
from metricbus._health import assess
from metricbus._report import build, read_run
from schemas import SchemaError, Settings, decode_aggregates, decode_record, default_codec, encode_aggregates
from sinks import Feeder, iter_events, make_sink
from stream_jobs import DEFAULT_RULES, StreamProcessor, load_rules
from stream_jobs._checkpoint import snapshot
from tests.hostile import Hostile

SEEDS = range(3)
CODEC = default_codec()


def decoded(values):
    """(events, columns) of each record that decodes; the rest are dead letters, not our subject."""
    for value in values:
        try:
            yield decode_record(CODEC, value)
        except SchemaError:
            continue


@pytest.mark.parametrize("seed", SEEDS)
def test_the_stream_processor_takes_every_record_and_what_it_outputs_encodes(seed):
    proc = StreamProcessor(rules=load_rules(DEFAULT_RULES))
    outputs = 0
    for events, columns in decoded(Hostile(seed).event_records(CODEC, 60)):
        out = proc.process_record(events, columns)
        for later in (out, proc.tick(1_700_000_000_000 + 10**9)):
            for record in later.aggregate_batches():
                decode_aggregates(CODEC, encode_aggregates(CODEC, **record))
                outputs += 1
            for alert in later.alerts:
                CODEC.encode("Alert", alert)
    assert outputs > 0  # it derived something from them
    assert pickle.loads(snapshot(proc, 0, 1))["state"]["events"] == proc.events  # checkpoints


@pytest.mark.parametrize("seed", SEEDS)
def test_the_sinks_take_or_refuse_every_record_flush_and_read_back(seed, tmp_path):
    hostile = Hostile(seed)
    sinks = {kind: make_sink(kind, tmp_path / kind) for kind in ("parquet", "tensorboard")}
    feeders = {kind: Feeder(sink) for kind, sink in sinks.items()}
    for sink in sinks.values():
        sink.open()
    refused = {kind: 0 for kind in sinks}
    records = [*decoded(hostile.event_records(CODEC, 40))]
    for i, (events, columns) in enumerate(records):
        for kind, feeder in feeders.items():
            if columns is not None and not events and feeder.fresh_columns(columns):
                refused[kind] += len(feeder.write_columns(columns))
            else:
                refused[kind] += len(
                    feeder.write(feeder.fresh([*events, *(columns.events() if columns else [])]))
                )
            if i % 7 == 0:
                feeder.sink.flush()  # raises: the sink could never commit again
    for value in hostile.aggregate_records(CODEC, 20):
        try:
            derived = decode_aggregates(CODEC, value)
        except SchemaError:
            continue
        for kind, feeder in feeders.items():
            refused[kind] += len(
                feeder.write(feeder.fresh_derived(derived.run_id, derived.events, derived.identified))
            )
    for sink in sinks.values():
        sink.flush()
        sink.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parquet", "tensorboard"]  # nothing beside
    assert refused["tensorboard"] > 0  # histograms without bins, configs that are no object...
    for run in ("r1", "r2"):
        chunks = list(iter_events(tmp_path / "parquet", run, derived=True))
        events = [e for chunk in chunks for e in chunk]
        assert events  # the archive keeps what the topic held, hostile or not
        build(run, read_run([events]))  # the report and health read it whole
        json.dumps(assess(run, events, 0).as_dict(), allow_nan=False)  # the dashboard's health JSON
    for directory in {p.parent for p in (tmp_path / "tensorboard").rglob("events.out.tfevents.*")}:
        EventAccumulator(str(directory), size_guidance={"scalars": 0}).Reload()  # TensorBoard reads it


@pytest.mark.parametrize("seed", SEEDS)
def test_the_dashboards_board_folds_every_record_and_its_pages_are_json(seed, tmp_path):
    hostile = Hostile(seed)
    board = RunBoard(Settings(data_dir=tmp_path))
    topics = board.settings.topics
    undecodable = 0
    for value in hostile.event_records(CODEC, 60):
        board.take(topics.events, value)
    for value in hostile.aggregate_records(CODEC, 20):
        board.take(topics.aggregates, value)
        try:
            decode_aggregates(CODEC, value)
        except SchemaError:  # numbered past 2**63 - 1: a dead letter, skipped by the board too
            undecodable += 1
    assert board.skipped == undecodable  # every record that decodes was folded
    json.dumps(board.runs_table(), allow_nan=False)
    for run in ("r1", "r2"):
        json.dumps(board.run(run), allow_nan=False)  # the page's JSON: NaN drawn as gaps (None)
