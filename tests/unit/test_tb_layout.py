"""The custom-scalars layout, read back through TensorBoard's own custom-scalars plugin."""

import json

import pytest
from tensorboard import context
from tensorboard.backend.event_processing import data_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer as pem
from tensorboard.plugins import base_plugin
from tensorboard.plugins.custom_scalar.custom_scalars_plugin import CustomScalarsPlugin

from metricbus.schemas import METRICS, RUN_STARTED, ConfigError, Event, default_codec, run_started
from metricbus.sinks import make_sink
from metricbus.sinks._tb_layout import load_layout
from metricbus.sinks.tensorboard import TensorBoardSink

FP = default_codec().newest("EventBatch").fingerprint


def events(run, scalars_by_step, first_seq=1):
    out = [Event(run, "p", 0, 1_700_000_000_000, RUN_STARTED, run_started("proj", run), FP)]
    out += [
        Event(
            run,
            "p",
            first_seq + i,
            1_700_000_000_000 + i,
            METRICS,
            {"step": step, "epoch": None, "rank": 0, "scalars": scalars, "samples": {}},
            FP,
        )
        for i, (step, scalars) in enumerate(scalars_by_step)
    ]
    return out if first_seq == 1 else out[1:]


def layout(logdir):
    """What TensorBoard's custom-scalars page gets: {category: {chart: [tag patterns]}}."""
    mux = pem.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    plugin = CustomScalarsPlugin(
        base_plugin.TBContext(data_provider=provider, multiplexer=mux, logdir=str(logdir))
    )
    got = json.loads(plugin.layout_impl(context.RequestContext(), "") or "{}")  # the JSON it serves
    return {
        c["title"]: {chart["title"]: chart["multiline"]["tag"] for chart in c["chart"]}
        for c in got.get("category", [])
    }


def write(sink, batch):
    sink.write(batch)
    sink.flush()


def test_charts_come_from_what_the_run_logs_and_grow_with_it(tmp_path):
    sink = TensorBoardSink(tmp_path)
    sink.open()
    sb3 = {"rollout/ep_rew_mean": 20.0, "train/loss": 0.5, "time/fps": 900.0, "my/own": 1.0}
    write(sink, events("r1", [(256, sb3)]))
    got = layout(tmp_path)
    assert got == {
        "Reward": {"Reward": ["rollout/ep_rew_mean(?:_recent_mean|_ema)?"]},
        "Loss": {"Training loss": ["train/loss(?:_recent_mean|_ema)?"]},
        "Performance": {"Throughput": ["time/fps(?:_recent_mean|_ema)?"]},
    }
    # the worker's derived series arrive later: the charts they belong to appear then
    derived = {
        "Epoch/AvgReward": 20.0,
        "Epoch/RewardVariance": 3.0,
        "Train/RewardStd": 1.7,
        "time/fps_p99": 1.0,
    }
    write(sink, events("r1", [(512, derived)], first_seq=2))
    got = layout(tmp_path)
    assert got["Reward"]["Epoch reward"] == ["Epoch/AvgReward"]
    assert got["Reward"]["Reward variance"] == ["Epoch/RewardVariance"]
    assert got["Reward"]["Reward std"] == ["Train/RewardStd"]  # never on the variance's axis
    assert len(got["Performance"]["Throughput"]) == 2
    assert "System" not in got and all(charts for charts in got.values())
    sink.close()

    # a restarted sink keeps what it had placed, and adds to it
    again = TensorBoardSink(tmp_path)
    again.open()
    write(again, events("r1", [(768, {"System/CPU_Percent": 50.0})], first_seq=3))
    got = layout(tmp_path)
    assert got["System"] == {"CPU and memory": ["System/CPU_Percent"]}
    assert got["Reward"]["Epoch reward"] == ["Epoch/AvgReward"] and "Loss" in got
    again.close()


def test_runs_that_log_the_same_names_share_charts(tmp_path):
    sink = TensorBoardSink(tmp_path)
    sink.open()
    for run in ("a", "b"):
        write(sink, events(run, [(1, {"loss": 1.0, "learning_rate": 1e-3})]))
    assert layout(tmp_path) == {
        "Loss": {"Training loss": ["loss(?:_recent_mean|_ema)?"]},
        "Optimisation": {"Learning rate": ["learning_rate"]},
    }
    sink.close()


def test_a_users_layout_file_adds_charts(tmp_path):
    path = tmp_path / "layout.yaml"
    path.write_text("Mine:\n  Accuracy: ['acc/.*']\nLoss:\n  Training loss: ['my_loss']\n")
    sink = make_sink("tensorboard", tmp_path / "tb", layout=path)
    sink.open()
    write(sink, events("r", [(1, {"acc/top1": 0.5, "my_loss": 2.0, "loss": 1.0})]))
    got = layout(tmp_path / "tb")
    assert got["Mine"] == {"Accuracy": ["acc/.*"]}
    assert got["Loss"] == {"Training loss": ["my_loss"]}  # theirs replaces the template's chart
    sink.close()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("- a\n", "expected category"),
        ("C:\n  T: [1]\n", "expected category"),
        ("C:\n  T: ['(']\n", "not a regex"),
    ],
)
def test_a_bad_layout_file_is_refused_with_the_fix(tmp_path, text, fragment):
    path = tmp_path / "layout.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        load_layout(path)


def test_a_run_logging_a_new_name_every_step_keeps_one_tag_a_pattern_and_a_bounded_memory(monkeypatch):
    """Every placed tag was kept, in memory and in the layout file each change rewrote."""
    from metricbus.sinks import _tb_layout

    monkeypatch.setattr(_tb_layout, "TAGS_KEPT", 100)
    run = _tb_layout.RunLayout(_tb_layout.merged(None))
    changed = [run.add(f"rewards/{i}_mean") for i in range(1000)] + [run.add("Train/Loss")]
    assert changed[0] and not any(changed[1:-1]) and changed[-1]  # two charts gained a series
    assert run.held() == ["Train/Loss", "rewards/0_mean"] and len(run.seen) <= 100
    again = _tb_layout.RunLayout(_tb_layout.merged(None), held=run.held())  # a restarted sink
    assert again.charts() == run.charts()
