"""The alias catalog: Epoch/*, trends and the default rules on every framework's names."""

import math

import numpy as np
import pytest

from metricbus.schemas import METRICS, RUN_FINISHED, Event
from metricbus.stream_jobs import StreamConfig, StreamProcessor
from metricbus.stream_jobs._config import parse_config
from metricbus.stream_jobs._derive import derive_all
from metricbus.stream_jobs._rules import DEFAULT_RULES, load_rules


def metrics(step, scalars=None, samples=None, epoch=None):
    body = {"step": step, "epoch": epoch, "rank": 0, "scalars": scalars or {}, "samples": samples or {}}
    return METRICS, body, 1000 + step


FINISHED = (RUN_FINISHED, {"status": "finished", "summary": {}}, 99_999)


def epoch_points(events, cfg=None):
    """{(name, epoch): (value, source)} of the Epoch/* points."""
    return {
        (p.name, p.epoch): (p.value, p.source)
        for p in derive_all([*events, FINISHED], cfg=cfg)
        if p.name.startswith("Epoch/")
    }


@pytest.mark.parametrize(
    ("framework", "reward", "loss"),
    [
        ("seed 004", "Train/AvgReward", "Train/Loss"),
        ("SB3 logger", "rollout/ep_rew_mean", "train/loss"),
        ("HF Trainer / TRL", "reward", "loss"),
        ("Lightning", "train/reward", "train_loss"),
        ("CleanRL", "charts/episodic_return", "losses/td_loss"),
    ],
)
def test_each_frameworks_reward_and_loss_make_the_epoch_series(framework, reward, loss):
    rng = np.random.default_rng(3)
    values = {e: (rng.random(5) * (e + 1)).tolist() for e in range(3)}
    losses = {e: (1 / (1 + e + rng.random(5))).tolist() for e in range(3)}
    events = [
        metrics(10 * e + i, {reward: values[e][i], loss: losses[e][i], "other/x": 1.0}, epoch=e)
        for e in range(3)
        for i in range(5)
    ]
    got = epoch_points(events)
    for e in range(3):
        assert got["Epoch/AvgReward", e] == (pytest.approx(np.mean(values[e])), reward), framework
        assert got["Epoch/RewardVariance", e][0] == pytest.approx(np.var(values[e]))
        assert got["Epoch/AvgLoss", e] == (pytest.approx(np.mean(losses[e])), loss)
    assert got["Epoch/RewardTrend", 2][0] == pytest.approx(np.mean(values[2]) - np.mean(values[1]))
    assert got["Epoch/LossTrend", 2][0] == pytest.approx(np.mean(losses[1]) - np.mean(losses[2]))
    trend = {(p.name, p.source) for p in derive_all([*events, FINISHED])}
    assert {
        ("Epoch/RewardTrendClass", reward),
        ("Epoch/RewardConverged", reward),
        ("Epoch/LossTrendClass", loss),
    } <= trend


def test_sb3_episode_returns_as_samples_win_over_sb3s_100_episode_mean():
    """metricbus.sb3 logs every episode's return as samples beside SB3's smoothed ep_rew_mean."""
    returns = {0: [[10.0, 12.0], [20.0]], 1: [[30.0], [50.0, 70.0]]}
    events = []
    for epoch, steps in returns.items():
        for i, batch in enumerate(steps):
            events.append(metrics(100 * epoch + i, samples={"rollout/episode_return": batch}, epoch=epoch))
        events.append(metrics(100 * epoch + 50, {"rollout/ep_rew_mean": 999.0}, epoch=epoch))
    got = epoch_points(events)
    assert got["Epoch/AvgReward", 0] == (pytest.approx((11 + 20) / 2), "rollout/episode_return")
    assert got["Epoch/AvgReward", 1][0] == pytest.approx((30 + 60) / 2)


def test_a_run_keeps_the_reward_it_bound_first_and_the_catalog_order_breaks_ties():
    # one record with two catalog names: the earlier catalog entry wins
    both = [metrics(i, {"reward": 0.1, "Train/AvgReward": 0.9}, epoch=0) for i in range(3)]
    assert epoch_points(both)["Epoch/AvgReward", 0] == (pytest.approx(0.9), "Train/AvgReward")
    # TRL's "reward" first: a later Train/AvgReward does not take the role over mid-run
    later = [
        metrics(0, {"reward": 0.1}, epoch=0),
        metrics(1, {"reward": 0.3, "Train/AvgReward": 5.0}, epoch=0),
    ]
    assert epoch_points(later)["Epoch/AvgReward", 0] == (pytest.approx(0.2), "reward")


def test_the_catalog_is_extended_from_the_stream_config_file():
    cfg = parse_config({"reward_aliases": ["my/score"], "loss_aliases": ["my/objective"]})
    events = [
        metrics(i, {"my/score": float(i), "my/objective": 2.0, "reward": 7.0}, epoch=0) for i in range(4)
    ]
    got = epoch_points(events, cfg)
    assert got["Epoch/AvgReward", 0] == (pytest.approx(1.5), "my/score")
    assert got["Epoch/AvgLoss", 0] == (pytest.approx(2.0), "my/objective")
    assert ("Epoch/AvgReward", 0) not in epoch_points(events, StreamConfig(reward_aliases=()))
    assert StreamConfig().reward_catalog()[:2] == ("Train/AvgReward", "Train/Reward")


def test_throughput_catalog_names_get_avg_and_p99_beside_them():
    events = [metrics(i, {"time/fps": float(100 + i), "charts/SPS": 50.0}) for i in range(10)]
    pts = {p.name: p.value for p in derive_all(events)}
    assert pts["time/fps_avg"] == pytest.approx(104.5)
    assert pts["time/fps_p99"] == pytest.approx(np.quantile(np.arange(100, 110), 0.99))
    assert pts["charts/SPS_avg"] == 50.0
    assert StreamConfig().higher_is_better("time/fps")  # "time" in the name, yet more is better


def _default_rules_on(step_rewards, reward, as_samples=False, loss=None, epoch_len=10, every=1):
    """Alerts the default pack raises on a run whose reward series is ``reward``, logged every
    ``every`` steps (as SB3 and the HF Trainer log: every n-th step, not each one)."""
    proc = StreamProcessor(rules=load_rules(DEFAULT_RULES))
    events = []
    for i, v in enumerate(step_rewards):
        step = i * every
        scalars = {} if as_samples else {reward: v}
        if loss is not None:
            scalars[loss] = math.nan if i == 7 else 1.0
        samples = {reward: [v - 0.01, v + 0.01]} if as_samples else {}
        body = {"step": step, "epoch": step // epoch_len, "rank": 0, "scalars": scalars, "samples": samples}
        events.append(Event("r", "p", i, 1000 + i, METRICS, body, b""))
    events.append(
        Event("r", "p", len(events), 2000, RUN_FINISHED, {"status": "finished", "summary": {}}, b"")
    )
    return {a["rule"] for a in proc.process(events).alerts if a["state"] == "firing"}


@pytest.mark.parametrize(
    ("reward", "as_samples"),
    [
        ("reward", False),
        ("Train/Reward", True),
        ("rollout/episode_return", True),
        ("charts/episodic_return", False),
    ],
)
def test_the_default_reward_rules_follow_the_runs_reward_whatever_its_name(reward, as_samples):
    rng = np.random.default_rng(5)
    # rewards in [0, 1], low, spread and not improving over two spans of 10,000 steps (30
    # epochs of 1,000 steps, logged every 10th step: the target rule's patience is in steps)
    unit = (0.2 + 0.4 * rng.random(3_000)).tolist()
    fired = _default_rules_on(unit, reward, as_samples, epoch_len=1000, every=10)
    assert {"epoch_reward_below_target", "epoch_reward_unstable"} <= fired
    erratic = (100 + 120 * rng.random(3_000)).tolist()  # CartPole's scale: no absolute target applies
    assert not _default_rules_on(erratic, reward, as_samples, epoch_len=1000, every=10)
    collapse = [0.8 + 0.01 * (i % 3) for i in range(1300)] + [0.05] * 30  # rewards in [0, 1], then 0.05
    assert "reward_collapse" in _default_rules_on(collapse, reward, as_samples)


@pytest.mark.parametrize("loss", ["Train/Loss", "loss", "train/loss", "train_loss", "losses/value_loss"])
def test_the_default_nan_loss_rule_catches_every_frameworks_loss(loss):
    assert "nan_loss" in _default_rules_on([0.5] * 12, "reward", loss=loss)
