"""run.config.update after the start: a ConfigUpdate event every sink applies to the run's config."""

import copy
import io
import json
import pickle

import avro.io
import avro.schema
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from metricbus.producers import Run
from metricbus.schemas import (
    CONFIG_UPDATE,
    HEADER_SIZE,
    RUN_STARTED,
    Event,
    Settings,
    config_update,
    decode_events,
    default_codec,
    encode_events,
    run_config,
    run_started,
)
from metricbus.sinks.tensorboard import TensorBoardSink
from metricbus.sinks.wandb import WandbSink
from tests.fakes import FakeTransport
from tests.wandb_reader import read_run

FP = default_codec().newest("EventBatch").fingerprint


def test_run_config_update_publishes_the_keys_and_merges_them(tmp_path):
    fake = FakeTransport()
    run = Run(
        "p",
        config={"lr": 0.1, "model": {"layers": 2, "width": 8}},
        settings=Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1"),
        transport=fake,
        system_metrics=False,
    )
    run.log({"loss": 1.0}, step=7)
    run.config.update({"lr": 0.05, "model": {"width": 16}}, batch=32)
    run.config["schedule"] = object()  # not JSON: sent as its str, never raised
    run.config.setdefault("lr", 99)  # present: nothing sent
    assert run.finish(timeout=10)
    assert run.config["model"] == {"layers": 2, "width": 16} and run.config["lr"] == 0.05
    assert type(copy.deepcopy(run.config)) is dict and type(pickle.loads(pickle.dumps(run.config))) is dict
    updates = [body for _, _, (kind, body) in fake.events() if kind == CONFIG_UPDATE]
    assert [json.loads(u["config_json"]) for u in updates][0] == {
        "batch": 32,
        "lr": 0.05,
        "model": {"width": 16},
    }
    assert updates[0]["step"] == 7 and "<object object" in updates[1]["config_json"]
    assert len(updates) == 2
    events = [e for record in fake.records for e in decode_events(default_codec(), record)]
    assert run_config(events) == json.loads(json.dumps(dict(run.config), default=str))  # what readers rebuild
    run.config.update(lr=1.0)  # after finish: said, not raised


def test_a_config_update_record_reads_with_apache_avro_too():
    codec = default_codec()
    value = encode_events(codec, "r", "p", [(0, 1, CONFIG_UPDATE, config_update({"lr": 0.5}, 3))])
    ((kind, body),) = [(e.kind, e.body) for e in decode_events(codec, value)]
    assert kind == CONFIG_UPDATE and json.loads(body["config_json"]) == {"lr": 0.5}
    schema = avro.schema.parse(json.dumps(codec.newest("EventBatch").raw))
    datum = avro.io.DatumReader(schema).read(avro.io.BinaryDecoder(io.BytesIO(value[HEADER_SIZE:])))
    assert datum["events"][0]["body"] == {"config_json": '{"lr": 0.5}', "step": 3}


def _events(run="run-c"):
    return [
        Event(
            run, "p", 0, 1_700_000_000_000, RUN_STARTED, run_started("proj", "n", {"lr": 0.1, "seed": 1}), FP
        ),
        Event(run, "p", 1, 1_700_000_001_000, CONFIG_UPDATE, config_update({"lr": 0.02, "hidden": 4}, 5), FP),
    ]


def test_tensorboard_shows_the_update_as_text_at_its_step(tmp_path):
    sink = TensorBoardSink(tmp_path)
    sink.open()
    assert sink.write(_events()) == []
    bad = Event("run-c", "p", 2, 1, CONFIG_UPDATE, {"config_json": "[1]", "step": None}, FP)
    (refused,) = sink.write([bad])  # hostile: not an object -> refused with the reason, no crash
    assert "JSON object" in refused[1]
    sink.flush()
    acc = EventAccumulator(str(tmp_path / "proj" / "n-run-c"), size_guidance={"tensors": 0})
    acc.Reload()
    (update,) = acc.Tensors("run/config_update")
    assert update.step == 5 and '"hidden": 4' in update.tensor_proto.string_val[0].decode()
    sink.close()


def test_wandb_merges_the_update_into_the_runs_config(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    sink = WandbSink(tmp_path)
    sink.open()
    assert sink.write(_events()) == []
    sink.flush()
    sink.close()
    config = read_run(tmp_path, "run-c")["config"]
    assert config["lr"] == 0.02 and config["hidden"] == 4 and config["seed"] == 1


@pytest.mark.parametrize("raw", ["not json", "[1, 2]", "3"])
def test_run_config_skips_unreadable_updates(raw):
    events = _events() + [
        Event("run-c", "p", 2, 1_700_000_002_000, CONFIG_UPDATE, {"config_json": raw, "step": None}, FP)
    ]
    assert run_config(events) == {"lr": 0.02, "seed": 1, "hidden": 4}
