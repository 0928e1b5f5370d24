"""Windows, names and per-metric statistics are configuration, read from YAML with clear errors."""

import subprocess
import sys

import numpy as np
import pytest

from metricbus.schemas import RUN_FINISHED, ConfigError
from metricbus.stream_jobs import StreamConfig, load_config, parse_config
from metricbus.stream_jobs._derive import RunDeriver

from .test_derive import metrics


def test_a_config_file_sets_fields_and_keeps_the_seed_defaults_for_the_rest(tmp_path):
    path = tmp_path / "stream.yaml"
    path.write_text(
        "window: 5\nema_weight: 0.9\nmetric_stats: [recent_mean, p99, count]\n"
        "sample_aliases: {Train/Score: {mean: Train/AvgScore}}\n"
    )
    cfg = load_config(path)
    assert cfg.window == 5 and cfg.ema_weight == 0.9 and cfg.metric_stats == ("recent_mean", "p99", "count")
    assert cfg.sample_aliases == {"Train/Score": {"mean": "Train/AvgScore"}}
    assert cfg.reward_metric == StreamConfig().reward_metric and cfg.hist_every == 10


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"windw": 5}, "unknown field(s) ['windw']; allowed:"),
        ({"window": "ten"}, "window must be like its default 10, got 'ten'"),
        ({"window": 2.5}, "window must be like its default 10"),
        ({"metric_stats": ["mean"]}, "metric_stats ['mean'] unknown; choose from recent_mean, ema"),
        ({"window": 0}, "window must be at least 1"),
        ({"ema_weight": 1}, "ema_weight must be in [0, 1)"),
        (["window"], "expected a mapping"),
    ],
)
def test_a_bad_config_fails_at_load_naming_the_field_and_the_fix(doc, fragment):
    with pytest.raises(ConfigError) as info:
        parse_config(doc, source="stream.yaml")
    assert str(info.value).startswith("stream.yaml: ") and fragment in str(info.value)


def test_the_worker_refuses_a_bad_config_before_it_connects(tmp_path):
    path = tmp_path / "stream.yaml"
    path.write_text("window: [1]\n")
    done = subprocess.run(
        [sys.executable, "-m", "metricbus", "--bootstrap", "127.0.0.1:9", "worker", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and f"{path}: window must be like its default 10" in done.stderr


def test_slope_and_trend_of_every_metric_with_its_direction():
    cfg = StreamConfig(metric_stats=("slope", "trend"), smooth_every=1)
    deriver = RunDeriver("run", cfg)
    points = {}
    for step in range(30):
        fed = deriver.feed(
            *metrics(step, scalars={"Train/Loss": 10.0 - 0.5 * step, "Accuracy": 0.5 + 0.01 * step})
        )
        points |= {p.name: p.value for p in fed}
    assert points["Train/Loss_slope"] == pytest.approx(-0.5)
    assert points["Accuracy_slope"] == pytest.approx(0.01)
    assert points["Train/Loss_trend"] == 1.0  # loss falling: improving
    assert points["Accuracy_trend"] == 1.0
    assert {p.name: p.value for p in deriver.feed(*metrics(30, scalars={"Train/Loss": 50.0}))}[
        "Train/Loss_trend"
    ] == -1.0


def test_metric_stats_over_the_recent_window_every_smooth_every_values_and_at_the_end():
    cfg = StreamConfig(metric_stats=("std", "min", "max", "median", "p99", "count", "nonfinite"))
    deriver = RunDeriver("run", cfg)
    values = [float(v) for v in np.random.default_rng(3).normal(5, 2, 37)]
    values[20] = float("nan")  # counted, never in a window statistic
    fed = []
    for step, v in enumerate(values):
        fed += deriver.feed(*metrics(step, scalars={"Train/Loss": v}))
    assert {p.step for p in fed} == {9, 19, 29}  # the 10th, 20th and 30th value's steps
    end = deriver.feed(RUN_FINISHED, {"status": "finished"}, 99)
    points = {p.name: p for p in end if p.name.startswith("Train/Loss_")}  # and the last value's
    assert set(points) == {f"Train/Loss_{s}" for s in cfg.metric_stats}
    recent = np.array([v for v in values if v == v][-10:])
    assert points["Train/Loss_std"].value == pytest.approx(recent.std())
    assert points["Train/Loss_min"].value == recent.min()
    assert points["Train/Loss_max"].value == recent.max()
    assert points["Train/Loss_median"].value == pytest.approx(np.median(recent))
    assert points["Train/Loss_p99"].value == pytest.approx(np.quantile(recent, 0.99))
    assert points["Train/Loss_count"].value == 36 and points["Train/Loss_count"].step == 36
    assert points["Train/Loss_nonfinite"].value == 1  # the NaN: counted apart, like everywhere
