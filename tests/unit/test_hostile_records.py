"""Schema-valid hostile records (``tests/hostile.py``) through every in-process reader.

The stream worker's processor, the TensorBoard, Parquet and W&B sinks, the dashboard's board,
the console, webhook and W&B alert consumers (and the W&B sink's ``--alerts``), and ``health``
and the report over what the archive kept: none raises out of its guard, none hangs, and what
they wrote reads back (W&B's rows exactly once, restarted sinks writing nothing twice). Each
finding of the fuzzing is a test of its own as well; this keeps the fuzzing itself in
``make test`` (seeded).
"""

from __future__ import annotations

import asyncio
import http.server
import io
import json
import math
import pickle
import re
import threading
import types

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from metricbus.diagnostics._health import assess
from metricbus.diagnostics._report import build, read_run
from metricbus.ops._board import RunBoard
from metricbus.schemas import (
    HISTOGRAM,
    MEDIA,
    METRICS,
    RUN_STARTED,
    TABLE,
    MediaStore,
    SchemaError,
    Settings,
    decode_aggregates,
    decode_record,
    default_codec,
    describe_alert,
    encode_aggregates,
    encode_events,
    run_started,
)
from metricbus.sinks import Feeder, SinkRunner, iter_events, make_sink
from metricbus.sinks.alerts import AlertRunner, ConsoleAlerts, WandbAlerts, WebhookAlerts, format_alert
from metricbus.sinks.wandb import WandbSink, wandb_key
from metricbus.stream_jobs import DEFAULT_RULES, StreamProcessor, load_rules
from metricbus.stream_jobs._checkpoint import snapshot
from tests.hostile import MEDIA_BLOBS, Hostile
from tests.wandb_reader import read_run as read_wandb_run
from tests.wandb_reader import records as wandb_records
from tests.wandb_reader import run_files

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


SINKS = ("parquet", "tensorboard", "wandb")


def _feed(seed, root):
    """Every sink kind opened on ``root`` takes seed's records; (events each took, refused)."""
    hostile = Hostile(seed)
    store = MediaStore(root / "media")
    for _, data in MEDIA_BLOBS.values():
        store.put(data)
    feeders = {kind: Feeder(make_sink(kind, root / kind, media=store)) for kind in SINKS}
    for feeder in feeders.values():
        feeder.sink.open()
    took = {kind: [] for kind in SINKS}
    refused = {kind: [] for kind in SINKS}

    def write(kind, fresh):
        took[kind] += fresh
        refused[kind] += feeders[kind].write(fresh)

    for i, (events, columns) in enumerate(decoded(hostile.event_records(CODEC, 40))):
        for kind, feeder in feeders.items():
            if columns is not None and not events and feeder.fresh_columns(columns):
                took[kind] += columns.events()
                refused[kind] += feeder.write_columns(columns)
            else:
                write(kind, feeder.fresh([*events, *(columns.events() if columns else [])]))
            if i % 7 == 0:
                feeder.sink.flush()  # raises: the sink could never commit again
    for value in hostile.aggregate_records(CODEC, 20):
        try:
            derived = decode_aggregates(CODEC, value)
        except SchemaError:
            continue
        for kind, feeder in feeders.items():
            write(kind, feeder.fresh_derived(derived.run_id, derived.events, derived.identified))
    for feeder in feeders.values():
        feeder.sink.flush()
        feeder.sink.close()
    return took, refused


def _same(a, b):
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("seed", SEEDS)
def test_the_sinks_take_or_refuse_every_record_flush_and_read_back(seed, tmp_path, monkeypatch):
    """Then restarted sinks take the same records again (a replay) and write nothing twice."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    took, refused = _feed(seed, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*SINKS, "media"])  # nothing beside
    assert refused["tensorboard"] and refused["wandb"]  # histograms without bins, configs no object
    for run in ("r1", "r2"):
        chunks = list(iter_events(tmp_path / "parquet", run, derived=True))
        events = [e for chunk in chunks for e in chunk]
        assert events  # the archive keeps what the topic held, hostile or not
        build(run, read_run([events]))  # the report and health read it whole
        json.dumps(assess(run, events, 0).as_dict(), allow_nan=False)  # the dashboard's health JSON
    for directory in {p.parent for p in (tmp_path / "tensorboard").rglob("events.out.tfevents.*")}:
        EventAccumulator(str(directory), size_guidance={"scalars": 0}).Reload()  # TensorBoard reads it

    # W&B: each event it took that makes a row is one row of its run, with the same step and values
    rows = _wandb_rows(tmp_path / "wandb")
    not_taken = {id(e) for e, _ in refused["wandb"]}
    expected = {
        (e.run_id, f"{e.producer_id}/{e.seq}"): e
        for e in took["wandb"]
        if id(e) not in not_taken and e.seq >= 0 and _makes_a_row(e)
    }
    assert expected and sorted(rows) == sorted(expected)  # no row missing, none extra
    assert any(e.kind == MEDIA for e in expected.values())  # media whose bytes are whole made rows
    assert all(len(found) == 1 for found in rows.values())  # none twice
    for key, e in expected.items():
        (row,) = rows[key]
        assert row["metricbus/step"] == e.body["step"]
        if e.kind == METRICS:
            assert all(_same(row[wandb_key(name)], v) for name, v in e.body["scalars"].items())

    # a restart: new sink processes on the same output take the same records, and write nothing
    # that they hold; what they take again is what was refused (dead-lettered) the first time,
    # and events with no identity (a seq below 0: delivered every time, as documented)
    again, _ = _feed(seed, tmp_path)
    for kind in SINKS:
        first = {id(e) for e, _ in refused[kind]}
        refused_ids = {(e.run_id, e.producer_id, e.seq) for e in took[kind] if id(e) in first}
        taken_again = {(e.run_id, e.producer_id, e.seq) for e in again[kind] if e.seq >= 0}
        assert taken_again <= refused_ids, kind
    assert _wandb_rows(tmp_path / "wandb") == rows  # the runs' files: nothing added


def _makes_a_row(e):
    """Whether the W&B sink logs a history row for ``e`` (every metric name is wanted)."""
    if e.kind == METRICS:
        samples = e.body["samples"].values()
        return bool(e.body["scalars"]) or any(math.isfinite(v) for values in samples for v in values)
    return e.kind in (HISTOGRAM, TABLE, MEDIA)


def _wandb_rows(root):
    """Each W&B history row with an identity, by (run, identity), over every opening of each run."""
    rows = {}
    for run in ("r1", "r2"):
        for row in read_wandb_run(root, run, every_opening=True)["history"]:
            if "_metricbus_id" in row:
                rows.setdefault((run, row["_metricbus_id"]), []).append(row)
    return rows


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
def test_alert_consumers_deliver_each_usable_alert_once_and_dead_letter_the_rest(seed, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
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
    webhook = WebhookAlerts(f"http://127.0.0.1:{server.server_port}/hook", give_up_s=0)
    handlers = [ConsoleAlerts(out), webhook, WandbAlerts(tmp_path / "wandb-alerts")]
    try:
        for handler in handlers:
            runner = AlertRunner(Settings(data_dir=tmp_path), handler)
            runner._producer = runner.dead_letters.producer = runner.commits.producer = letters = _Letters()
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
        handlers[-1].close()
    lines = out.getvalue().splitlines()
    assert lines == [format_alert(a) for a in expected]  # one line each, in order
    assert all(line.isprintable() for line in lines)  # no escape reaches the terminal
    posted = [json.loads(body) for body in _Webhook.bodies]  # strict JSON: NaN is null
    assert [p["alert"]["seq"] for p in posted] == [a["seq"] for a in expected]
    assert [p["text"] for p in posted] == lines
    # the W&B sink with --alerts: the same, on the runs it holds open (their RunStarted first)
    settings = Settings(data_dir=tmp_path)
    runner = SinkRunner(WandbSink(tmp_path / "wandb-sink"), settings, alerts=True)
    runner._producer = runner.dead_letters.producer = runner.commits.producer = letters = _Letters()
    runner.open()
    starts = [
        encode_events(CODEC, run, f"p-{run}", [(0, 0, RUN_STARTED, run_started("p", run))])
        for run in ("r1", "r2")
    ]
    asyncio.run(
        runner._process(
            [
                types.SimpleNamespace(topic=topic, partition=0, offset=i, value=v, key=None)
                for i, (topic, v) in enumerate(
                    [
                        *((settings.topics.events, v) for v in starts),
                        *((settings.topics.alerts, v) for v in values),
                    ]
                )
            ]
        )
    )
    runner.flush()
    runner.close()
    assert len(letters.sent) == unusable and runner.stats.written == 2 + len(expected)
    for run in {a["run_id"] for a in expected}:  # W&B: each an alert of its run, in order
        mine = [a for a in expected if a["run_id"] == run]
        titles = [a["rule"] if a["state"] == "firing" else f"{a['rule']} resolved" for a in mine]
        for root in ("wandb-alerts", "wandb-sink"):
            raised = [
                (r.alert.title, r.alert.text)
                for path in run_files(tmp_path / root, run)
                for r in wandb_records(path)
                if r.WhichOneof("record_type") == "alert"
            ]
            assert raised == list(zip(titles, map(format_alert, mine), strict=True)), root
    board = RunBoard(Settings(data_dir=tmp_path))
    for value in values:
        board.take(board.settings.topics.alerts, value)
    assert board.skipped == unusable  # the unusable run ids, as the deliverers
    assert {a["run_id"] for a in board.alerts()} == {a["run_id"] for a in expected}
    json.dumps(board.alerts(), allow_nan=False)  # the dashboard's alerts page
    for alert in expected:
        assert describe_alert(alert).isprintable()  # `metricbus backtest` and the report
