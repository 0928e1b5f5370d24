import math

import numpy as np
import pytest

from schemas import METRICS, RUN_FINISHED
from stream_jobs._derive import RunDeriver, derive_all


def metrics(step, scalars=None, samples=None, epoch=None):
    return (
        METRICS,
        {"step": step, "epoch": epoch, "rank": 0, "scalars": scalars or {}, "samples": samples or {}},
        1000 + step,
    )


def by_name(points):
    out = {}
    for p in points:
        out.setdefault(p.name, []).append(p)
    return out


def test_seed_002_reward_function_metrics_from_per_sample_scores():
    rng = np.random.default_rng(0)
    batches = [rng.random(8) for _ in range(5)]
    events = [
        metrics(i, samples={"rewards/format_exact": b.tolist(), "rewards/answer_check": (b / 2).tolist()})
        for i, b in enumerate(batches)
    ]
    events.append((RUN_FINISHED, {"status": "finished", "summary": {}}, 9999))
    pts = by_name(derive_all(events))
    last = batches[-1]
    assert pts["rewards/format_exact_mean"][-1].value == pytest.approx(last.mean())
    assert pts["rewards/format_exact_max"][-1].value == pytest.approx(last.max())
    assert pts["rewards/format_exact_min"][-1].value == pytest.approx(last.min())
    # rolling mean of the last 10 scores
    scores = np.concatenate(batches)
    assert pts["rewards/format_exact_recent_mean"][-1].value == pytest.approx(scores[-10:].mean())
    # rewards/total_mean: the sum of all reward function means
    assert pts["rewards/total_mean"][-1].value == pytest.approx(last.mean() + (last / 2).mean())
    assert [p.step for p in pts["rewards/total_mean"]] == list(range(5))
    # final/{name}_* at the end of training
    assert pts["final/format_exact_mean"][0].value == pytest.approx(scores.mean())
    assert pts["final/format_exact_std"][0].value == pytest.approx(scores.std())
    assert pts["final/format_exact_total_samples"][0].value == 40
    assert pts["final/answer_check_max"][0].value == pytest.approx((scores / 2).max())


def test_seed_004_batch_reward_statistics_and_epochs():
    rng = np.random.default_rng(1)
    events, rewards, losses = [], {}, {}
    for step in range(30):
        epoch = step // 10
        r = rng.random(16) * (epoch + 1) / 3
        loss = 1.0 / (step + 1)
        rewards.setdefault(epoch, []).extend(r)
        losses.setdefault(epoch, []).append(loss)
        events.append(
            metrics(
                step,
                {"Train/Loss": loss, "Epoch/APITokens": 100.0},
                {"Train/Reward": r.tolist()},
                epoch=epoch,
            )
        )
    events.append((RUN_FINISHED, {"status": "finished", "summary": {}}, 5000))
    pts = by_name(derive_all(events))
    assert pts["Train/AvgReward"][0].value == pytest.approx(np.mean(events[0][1]["samples"]["Train/Reward"]))
    assert pts["Train/RewardVariance"][0].value == pytest.approx(
        np.var(events[0][1]["samples"]["Train/Reward"])
    )
    assert {"Train/RewardStd", "Train/RewardMin", "Train/RewardMax"} <= set(pts)
    avg = [p.value for p in pts["Epoch/AvgReward"]]
    assert avg == pytest.approx([np.mean(rewards[e]) for e in range(3)])
    assert [p.value for p in pts["Epoch/RewardVariance"]] == pytest.approx(
        [np.var(rewards[e]) for e in range(3)]
    )
    assert [p.value for p in pts["Epoch/RewardTrend"]] == pytest.approx([avg[1] - avg[0], avg[2] - avg[1]])
    loss = [np.mean(losses[e]) for e in range(3)]
    assert [p.value for p in pts["Epoch/AvgLoss"]] == pytest.approx(loss)
    assert [p.value for p in pts["Epoch/LossTrend"]] == pytest.approx([loss[0] - loss[1], loss[1] - loss[2]])
    assert all(p.value > 0 for p in pts["Epoch/LossTrend"])  # loss falling = positive = improving
    assert [p.value for p in pts["Epoch/NumSamples"]] == [160.0] * 3  # 10 steps x 16 samples, counted once
    assert [p.value for p in pts["Epoch/APITokens"]] == [1000.0] * 3
    assert [(p.epoch, p.step) for p in pts["Epoch/AvgReward"]] == [(0, 9), (1, 19), (2, 29)]
    assert pts["stats/Train/Loss/trend"][-1].value == 1.0  # loss falling: improving


def test_epoch_reward_from_a_logged_scalar_and_rolling_stats():
    values = [0.1, 0.5, math.nan, 0.7, 0.9, 1.1]
    events = [metrics(i, {"Train/AvgReward": v}, epoch=i // 3) for i, v in enumerate(values)]
    events.append((RUN_FINISHED, {"status": "finished", "summary": {}}, 99))
    pts = by_name(derive_all(events))
    assert [p.value for p in pts["Epoch/AvgReward"]] == pytest.approx([0.3, np.mean([0.7, 0.9, 1.1])])
    assert pts["stats/Train/AvgReward/recent_mean"][-1].value == pytest.approx(
        np.mean([0.1, 0.5, 0.7, 0.9, 1.1])
    )


def test_throughput_average_and_p99():
    rng = np.random.default_rng(2)
    tps = rng.normal(100, 10, 500)
    pts = by_name(
        derive_all([metrics(i, {"Performance/Generation_TokensPerSec": float(v)}) for i, v in enumerate(tps)])
    )
    assert pts["Performance/Generation_AvgTokensPerSec"][-1].value == pytest.approx(tps.mean())
    assert pts["Performance/Generation_P99TokensPerSec"][-1].value == pytest.approx(np.quantile(tps, 0.99))


def test_nothing_is_derived_twice_after_finish():
    d = RunDeriver("r")
    d.feed(*metrics(0, samples={"rewards/x": [1.0]}))
    first = d.feed(RUN_FINISHED, {"status": "finished", "summary": {}}, 5)
    assert d.feed(RUN_FINISHED, {"status": "finished", "summary": {}}, 6) == []
    assert {p.name for p in first} >= {"final/x_mean"}


def test_seed_002_histograms_every_10_steps_once_10_scores_are_held():
    deriver = RunDeriver("run")
    rng = np.random.default_rng(0)
    logged = []
    for step in range(50):
        scores = rng.random(3).tolist()
        logged.append(scores)
        deriver.feed(*metrics(step, samples={"rewards/answer_check": scores}))
    histograms, tables = deriver.take_objects()
    assert tables == [] and deriver.take_objects() == ([], [])  # taken once
    # 10 scores first held at step 3; then every 10 steps
    assert [h["step"] for h in histograms] == [3, 13, 23, 33, 43]
    last = histograms[-1]
    assert last["name"] == "rewards/answer_check_hist" and last["source"] == "rewards/answer_check"
    recent = [s for scores in logged[:44] for s in scores]  # everything up to step 43 (< 1000 scores)
    counts, edges = np.histogram(recent, bins=20)
    assert last["counts"] == counts.tolist() and last["edges"] == pytest.approx(edges.tolist())


def test_seed_002_rubric_summary_table_at_the_end_of_the_run():
    deriver = RunDeriver("run")
    clarity, accuracy = [], []
    for step in range(5):
        c, a = [0.1 * step, 0.5, 1.0], [1.0, 0.0]
        clarity += c
        accuracy += a
        deriver.feed(*metrics(step, samples={"criteria/essay/clarity": c, "criteria/essay/accuracy": a}))
    deriver.feed(RUN_FINISHED, {"status": "finished", "summary": {}}, 9000)
    (table,) = deriver.take_objects()[1]
    assert table["name"] == "rubric_criteria_summary" and table["step"] == 4
    assert table["columns"] == ["criterion", "mean", "std", "min", "max", "samples"]
    expected = [
        ["essay/accuracy", np.mean(accuracy), np.std(accuracy), 0.0, 1.0, 10],
        ["essay/clarity", np.mean(clarity), np.std(clarity), 0.0, 1.0, 15],
    ]
    for got, want in zip(table["rows"], expected, strict=True):
        assert got[0] == want[0] and got[5] == want[5]
        assert got[1:5] == pytest.approx(want[1:5], rel=1e-12)
    # the per-criterion means of seed 002 come from the same samples, every step
    points = by_name(derive_all([metrics(0, samples={"criteria/essay/clarity": [0.0, 1.0]})]))
    assert points["criteria/essay/clarity_mean"][0].value == 0.5
