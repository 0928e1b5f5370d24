"""Schema-valid hostile records (``tests/hostile.py``) through every in-process reader.

The stream worker's processor, the TensorBoard and Parquet sinks, the dashboard's board, the
console and webhook alert consumers, and ``health`` and the report over what the archive kept:
none raises out of its guard, none hangs, and what they wrote reads back. Each finding of the twelfth session's fuzzing was a test of its
own; this keeps the fuzzing itself in ``make test`` (seeded; the W&B sink, a wandb-core process
per run, is fuzzed by hand: see the README).
"""

from __future__ import annotations

import asyncio
import http.server
import io
import json
import pickle
import re
import threading
import types

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from metricbus._board import RunBoard
from metricbus._health import assess
from metricbus._replay import describe_alert
from metricbus._report import build, read_run
from schemas import SchemaError, Settings, decode_aggregates, decode_record, default_codec, encode_aggregates
from sinks import Feeder, iter_events, make_sink
from sinks.alerts import AlertRunner, ConsoleAlerts, WebhookAlerts, format_alert
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


class _Letters:
    """The dead-letter topic, as the alert consumer's producer sees it."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, dict[str, bytes]]] = []

    async def send_and_wait(self, topic, value, key, headers):
        self.sent.append((value, dict(headers)))


class _Webhook(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        """Quiet."""


@pytest.mark.parametrize("seed", SEEDS)
def test_alert_consumers_deliver_each_usable_alert_once_and_dead_letter_the_rest(seed, tmp_path):
    values = [*Hostile(seed).alert_records(CODEC, 80)]
    # what should happen, from the records alone: usable run ids delivered, a (run, seq) once
    expected, seen, unusable = [], set(), 0
    for value in values:
        alert = CODEC.decode(value)[1]
        unusable += 1
        if re.fullmatch(r"[A-Za-z0-9._-]{1,128}", alert["run_id"]) and alert["run_id"] not in {".", ".."}:
            unusable -= 1
            if alert["seq"] < 0 or (alert["run_id"], alert["seq"]) not in seen:
                expected.append(alert)
            seen.add((alert["run_id"], alert["seq"]))
    assert 0 < len(expected) < len(values)  # the seed has both kinds
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Webhook.bodies = []
    out = io.StringIO()
    handlers = [ConsoleAlerts(out), WebhookAlerts(f"http://127.0.0.1:{server.server_port}/hook", retries=1)]
    try:
        for handler in handlers:
            runner = AlertRunner(Settings(data_dir=tmp_path), handler)
            runner._producer = letters = _Letters()
            records = [
                types.SimpleNamespace(topic="alerts", partition=0, offset=i, value=v, key=None)
                for i, v in enumerate(values)
            ]
            asyncio.run(runner._process(records))
            runner.flush()  # the ledger saves
            assert runner.stats.written == len(expected)
            assert len(letters.sent) == len(values) - len(expected) - runner.stats.duplicates
            assert all(b"not usable" in headers["metricbus.reason"] for _, headers in letters.sent)
    finally:
        server.shutdown()
    lines = out.getvalue().splitlines()
    assert lines == [format_alert(a) for a in expected]  # one line each, in order
    assert all(line.isprintable() for line in lines)  # no escape reaches the terminal
    posted = [json.loads(body) for body in _Webhook.bodies]  # strict JSON: NaN is null
    assert [p["alert"]["seq"] for p in posted] == [a["seq"] for a in expected]
    assert [p["text"] for p in posted] == lines
    board = RunBoard(Settings(data_dir=tmp_path))
    for value in values:
        board.take(board.settings.topics.alerts, value)
    assert board.skipped == unusable  # the unusable run ids, as the deliverers
    assert {a["run_id"] for a in board.alerts()} == {a["run_id"] for a in expected}
    json.dumps(board.alerts(), allow_nan=False)  # the dashboard's alerts page
    for alert in expected:
        assert describe_alert(alert).isprintable()  # `metricbus backtest` and the report
