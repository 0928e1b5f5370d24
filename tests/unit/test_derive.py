import math

import numpy as np
import pytest

from metricbus.schemas import METRICS, RUN_FINISHED, RUN_STARTED, Event, run_started
from metricbus.stream_jobs import StreamConfig, StreamProcessor
from metricbus.stream_jobs._derive import RunDeriver, derive_all
from metricbus.stream_jobs._processor import FINISHED_KEPT, RUNS_KEPT
from metricbus.stream_jobs._stats import Window


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
    # over the epoch's per-step average rewards (here equal batches: the mean of all samples)
    step_means = {e: np.asarray(rewards[e]).reshape(10, 16).mean(axis=1) for e in range(3)}
    avg = [p.value for p in pts["Epoch/AvgReward"]]
    assert avg == pytest.approx([np.mean(rewards[e]) for e in range(3)])
    assert [p.value for p in pts["Epoch/RewardVariance"]] == pytest.approx(
        [np.var(step_means[e]) for e in range(3)]
    )
    assert [p.value for p in pts["Epoch/RewardCV"]] == pytest.approx(
        [np.std(step_means[e]) / np.mean(step_means[e]) for e in range(3)]
    )
    assert [p.value for p in pts["Epoch/RewardTrend"]] == pytest.approx([avg[1] - avg[0], avg[2] - avg[1]])
    loss = [np.mean(losses[e]) for e in range(3)]
    assert [p.value for p in pts["Epoch/AvgLoss"]] == pytest.approx(loss)
    assert [p.value for p in pts["Epoch/LossTrend"]] == pytest.approx([loss[0] - loss[1], loss[1] - loss[2]])
    assert all(p.value > 0 for p in pts["Epoch/LossTrend"])  # loss falling = positive = improving
    assert [p.value for p in pts["Epoch/NumSamples"]] == [160.0] * 3  # 10 steps x 16 samples, counted once
    assert [p.value for p in pts["Epoch/APITokens"]] == [1000.0] * 3
    assert [(p.epoch, p.step) for p in pts["Epoch/AvgReward"]] == [(0, 9), (1, 19), (2, 29)]
    assert pts["Epoch/LossTrendClass"][-1].value == 1.0  # loss falling: improving
    assert pts["Epoch/LossTrendClass"][-1].source == "Train/Loss"
    # the reward is logged as samples here: its trend follows their per-step means
    assert [p.source for p in pts["Epoch/RewardTrendClass"]] == ["Train/Reward"] * 3
    assert "Train/Loss_trend" not in pts  # one name, one definition: the per-record trend is metric_stats'


def test_epoch_reward_is_the_same_logged_as_samples_or_as_step_averages():
    """Seed 004: Epoch/AvgReward and RewardVariance mean one thing however rewards are logged."""
    rng = np.random.default_rng(7)
    batches = [rng.random(int(rng.integers(4, 40))) for _ in range(40)]
    batches[5][2] = math.nan  # a NaN-scored sample: out of its step's average, as everywhere
    as_samples = [metrics(i, {}, {"Train/Reward": b.tolist()}, epoch=i // 10) for i, b in enumerate(batches)]
    as_scalars = [
        metrics(
            i, {"Train/AvgReward": float(np.nanmean(b)), "Train/NumSamples": float(b.size)}, epoch=i // 10
        )
        for i, b in enumerate(batches)
    ]
    end = (RUN_FINISHED, {"status": "finished", "summary": {}}, 5000)
    one, other = by_name(derive_all([*as_samples, end])), by_name(derive_all([*as_scalars, end]))
    for name in (
        "Epoch/AvgReward",
        "Epoch/RewardVariance",
        "Epoch/RewardCV",
        "Epoch/RewardTrend",
        "Epoch/NumSamples",
    ):
        assert [p.value for p in one[name]] == pytest.approx([p.value for p in other[name]], rel=1e-12), name
    means = [np.nanmean(b) for b in batches[10:20]]
    assert one["Epoch/RewardVariance"][1].value == pytest.approx(np.var(means), rel=1e-12)
    assert [p.value for p in one["Epoch/NumSamples"]] == [
        float(sum(b.size for b in batches[e * 10 : e * 10 + 10])) for e in range(4)
    ]


def test_num_samples_counts_samples_never_log_calls():
    plain = [metrics(i, {"Train/Loss": 1.0}, epoch=i // 5) for i in range(10)]
    end = (RUN_FINISHED, {"status": "finished", "summary": {}}, 5000)
    assert "Epoch/NumSamples" not in by_name(derive_all([*plain, end]))  # nothing counted: nothing said
    counted = [
        metrics(i, {"Train/Loss": 1.0, "Train/NumSamples": 64.0}, {"x": [1.0] * 8}, epoch=i // 5)
        for i in range(10)
    ]
    pts = by_name(derive_all([*counted, end]))
    assert [p.value for p in pts["Epoch/NumSamples"]] == [320.0, 320.0]  # the user's count wins over arrays


def test_final_total_samples_counts_nan_scored_samples():
    scores = [[0.5, math.nan, 1.0], [math.inf, 0.0]]
    events = [metrics(i, {}, {"rewards/judge": s}) for i, s in enumerate(scores)]
    events.append((RUN_FINISHED, {"status": "finished", "summary": {}}, 5000))
    pts = by_name(derive_all(events))
    assert pts["final/judge_total_samples"][0].value == 5.0
    assert pts["final/judge_nonfinite_samples"][0].value == 2.0
    assert pts["final/judge_mean"][0].value == pytest.approx(0.5)


def test_stats_count_is_finite_values_and_nonfinite_is_separate():
    cfg = StreamConfig(metric_stats=("count", "nonfinite", "std"), smooth_every=1)
    deriver = RunDeriver("r", cfg)
    values = [1.0, math.nan, 2.0, math.inf, 3.0]
    points = []
    for i, v in enumerate(values):
        points += deriver.feed(METRICS, metrics(i, {"m": v})[1], i)
    pts = by_name(points)
    assert pts["m_count"][-1].value == 3.0
    assert pts["m_nonfinite"][-1].value == 2.0


def test_stats_std_is_exact_on_a_large_offset():
    """A loss of 1e9 + 1e-3 noise: the window's std uses a shifted mean."""
    rng = np.random.default_rng(3)
    values = (1e9 + 1e-3 * rng.standard_normal(10)).tolist()
    window = Window(10)
    window.extend(values)
    exact = float(np.std(np.asarray(values) - values[0]))
    assert window.std() == pytest.approx(exact, rel=1e-9)


def test_epoch_reward_from_a_logged_scalar_and_rolling_stats():
    values = [0.1, 0.5, math.nan, 0.7, 0.9, 1.1]
    events = [metrics(i, {"Train/AvgReward": v}, epoch=i // 3) for i, v in enumerate(values)]
    events.append((RUN_FINISHED, {"status": "finished", "summary": {}}, 99))
    pts = by_name(derive_all(events))
    assert [p.value for p in pts["Epoch/AvgReward"]] == pytest.approx([0.3, np.mean([0.7, 0.9, 1.1])])
    assert pts["Train/AvgReward_recent_mean"][-1].value == pytest.approx(np.mean([0.1, 0.5, 0.7, 0.9, 1.1]))


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


def test_a_long_lived_worker_keeps_the_state_of_the_last_finished_runs_only_and_numbering_goes_on():
    """A worker up for a week of sweeps held every finished run's windows (~120 kB each) for ever."""
    proc = StreamProcessor()

    def attempt(run_id, first_seq, steps):
        bodies = [(RUN_STARTED, run_started("p", "n"))]
        bodies += [metrics(s, {"Train/Loss": s + 0.5})[:2] for s in steps]
        bodies.append((RUN_FINISHED, {"status": "finished", "summary": {}}))
        producer = f"{run_id}-p"
        return proc.process(
            [Event(run_id, producer, first_seq + i, 1_000 + i, k, b, b"") for i, (k, b) in enumerate(bodies)]
        )

    attempt("r0", 0, range(10))
    numbered = proc._out_seq["r0"]  # the derived events r0's first attempt took
    for i in range(1, FINISHED_KEPT + 20):
        attempt(f"r{i}", 0, range(10))
    assert len(proc._runs) == FINISHED_KEPT and "r0" not in proc._runs  # the oldest forgotten
    resumed = attempt("r0", 12, range(10, 15))  # a new attempt, its producer's seqs going on
    assert resumed.first_seq["r0"] == numbered  # numbered after what went before: no sink drops it
    recent = [p for p in resumed.points["r0"] if p.name == "Train/Loss_recent_mean"]
    assert recent[-1].value == sum(range(10, 15)) / 5 + 0.5  # derived afresh: the attempt's 5 values


def test_runs_killed_without_their_run_finished_are_forgotten_once_enough_others_logged_after_them():
    proc = StreamProcessor()

    def log(run_id, seq):
        body = metrics(seq, {"Train/Loss": 1.0})[1]
        return proc.process([Event(run_id, f"{run_id}-p", seq, 1_000 + seq, METRICS, body, b"")])

    for i in range(RUNS_KEPT):
        log(f"r{i}", 0)
    log("r0", 1)  # r0 is active again: r1 is now the least recently active
    for i in range(RUNS_KEPT, RUNS_KEPT + 10):
        log(f"r{i}", 0)
    assert len(proc._runs) == RUNS_KEPT
    assert "r0" in proc._runs and not any(f"r{i}" in proc._runs for i in range(1, 11))


def test_a_run_logging_a_new_name_every_step_derives_its_first_max_series_names_only(caplog):
    """~2 kB of state a name: f"loss_{step}" grew the worker until it ran out of memory."""
    proc = StreamProcessor(StreamConfig(max_series=50, smooth_every=1))

    def log(seq, scalars, samples=None):
        body = metrics(seq, scalars, samples)[1]
        return proc.process([Event("r", "p", seq, 1_000 + seq, METRICS, body, b"")])

    names = set()
    for step in range(100):  # two new scalar names a step, and a new samples name
        out = log(step, {"Train/Loss": 0.5, f"u/{step}": 0.5}, {f"s/{step}": [1.0, 2.0]})
        names |= {p.source for p in out.points.get("r", [])}
    deriver = proc._runs["r"]
    assert len(deriver._series) + len(deriver._sample_windows) == 50
    assert "Train/Loss" in names and "u/0" in names and "s/0" in names and "u/99" not in names
    assert deriver.refused == 2 * 100 + 1 - 50  # every value of a name past the 50th
    assert [r.message for r in caplog.records].count(  # said once
        "run r: s/24: more than 50 series; later names are not derived (counted; said once per run)"
    ) == 1
    assert "Train/Loss_recent_mean" in {p.name for p in log(100, {"Train/Loss": 0.5}).points["r"]}  # goes on


def test_label_series_count_toward_a_runs_max_series():
    """One event of 10,000 scalars under 8 labels made 80,000 label series (~1.1 kB each)."""
    proc = StreamProcessor(StreamConfig(max_series=50))
    labels = {f"k{k}": "v" for k in range(8)}
    body = {**metrics(0, {f"m{i}": 1.0 for i in range(20)})[1], "labels": labels}
    proc.process([Event("r", "p", 0, 1_000, METRICS, body, b"")])
    deriver = proc._runs["r"]
    assert len(deriver._series) == 20 and deriver.labels.series() == 30 and deriver.series() == 50
    assert deriver.labels.refused == 8 * 20 - 30
    body = metrics(1, {"later": 1.0})[1]
    out = proc.process([Event("r", "p", 1, 1_001, METRICS, {**body, "labels": {"k0": "v"}}, b"")])
    by_label = {p.name for p in out.points["r"] if p.name.startswith("by_") and p.step == 0}
    assert len(by_label) == 30 + 8  # step 0's points once step 1 began: 30 series' means, each key's share
    assert "later" not in deriver._series and deriver.refused == 1  # the run's bound is reached


def test_the_worker_forgets_the_least_recently_active_runs_past_max_partition_series(caplog):
    """1,024 runs of 10,000 names each were ~20 GB of worker state; now max_partition_series bounds it."""
    proc = StreamProcessor(StreamConfig(max_partition_series=100, smooth_every=1))

    def log(run_id, seq, names):
        body = metrics(seq, {f"m{i}": seq + 0.5 for i in range(names)})[1]
        return proc.process([Event(run_id, f"{run_id}-p", seq, 1_000 + seq, METRICS, body, b"")])

    for run_id in ("r0", "r1", "r2"):
        log(run_id, 0, 30)
    log("r0", 1, 30)  # r0 is active again: r1 is now the least recently active
    assert proc._series_total == 90 and proc.forgotten_for_memory == 0
    log("r3", 0, 30)  # 120 series: r1 forgotten
    assert list(proc._runs) == ["r2", "r0", "r3"] and proc._series_total == 90
    log("r4", 0, 95)  # alone near the bound: every other run forgotten
    assert list(proc._runs) == ["r4"] and proc._series_total == 95 and proc.forgotten_for_memory == 4
    assert (
        sum(
            r.message.startswith("the runs of a partition derive from more than 100 series")
            for r in caplog.records
        )
        == 1
    )
    out = log("r1", 1, 6)  # a forgotten run logs again: derived afresh, numbered after what went before
    assert {p.name for p in out.points["r1"]} >= {"m0_recent_mean"} and list(proc._runs) == ["r1"]
    restored = StreamProcessor(StreamConfig(max_partition_series=100, smooth_every=1))
    restored.load_state(proc.state())  # a checkpoint: counted again
    assert restored._series_total == proc._series_total == 6


def test_a_partition_checkpointed_and_replayed_forgets_the_same_runs_as_one_that_went_on():
    """The bound is per partition, so a rebuilt partition (its checkpoint, then its records)
    holds the state and derives the output of the uninterrupted one."""
    import pickle

    from metricbus.stream_jobs._checkpoint import snapshot

    cfg = StreamConfig(max_partition_series=50)
    batches = [
        [
            Event(
                f"r{i % 5}",
                f"p{i % 5}",
                i // 5,
                1_000 + i,
                METRICS,
                metrics(i // 5, {f"m{i % 7}_{j}": 1.0 * i for j in range(12)})[1],
                b"",
            )
        ]
        for i in range(60)
    ]
    went_on = StreamProcessor(cfg)
    live = [went_on.process(b) for b in batches]
    first = StreamProcessor(cfg)
    for b in batches[:30]:
        first.process(b)
    rebuilt = StreamProcessor(cfg)
    rebuilt.load_state(pickle.loads(snapshot(first, 0, 30))["state"])
    again = [rebuilt.process(b) for b in batches[30:]]
    assert went_on.forgotten_for_memory > 10  # the bound was hit, again and again
    assert [o.points for o in again] == [o.points for o in live[30:]]
    assert list(rebuilt._runs) == list(went_on._runs) and rebuilt._series_total == went_on._series_total


def test_a_finished_run_forgotten_leaves_no_rule_state_and_a_stray_event_of_it_is_no_stalled_run():
    """The rules' states of every finished run were kept for ever: ~3.5 kB a run (six states
    with the default rules), in memory and in every checkpoint."""
    from metricbus.stream_jobs._rules import load_rules

    proc = StreamProcessor(StreamConfig(), load_rules())

    def run_events(run_id, first, steps, finish=True):
        producer = f"{run_id}-p"
        events = [Event(run_id, producer, first, 1_000, RUN_STARTED, run_started("p", run_id), b"")]
        for s in range(1, steps):
            events.append(
                Event(
                    run_id, producer, first + s, 1_000 + s, METRICS, metrics(s, {"Train/Loss": 1.0})[1], b""
                )
            )
        if finish:
            events.append(
                Event(
                    run_id,
                    producer,
                    first + steps,
                    2_000,
                    RUN_FINISHED,
                    {"status": "finished", "summary": {}},
                    b"",
                )
            )
        return events

    for i in range(FINISHED_KEPT + 10):
        proc.process(run_events(f"r{i}", 0, 5))
    kept = {f"r{i}" for i in range(10, FINISHED_KEPT + 10)}
    assert {key[0] for key in proc.alerts._state} == kept  # r0..r9 forgotten, rules' states too
    assert set(proc.alerts._last_seen) == kept
    stray = [Event("r0", "r0-p", 99, 3_000, METRICS, metrics(9, {"Train/Loss": 1.0})[1], b"")]
    proc.process(stray)  # a late event of a forgotten finished run: derived afresh
    assert not proc.tick(3_000 + 3_600_000).alerts  # an hour later: r0 is still known as finished
    proc.process(run_events("r1", 10, 3, finish=False))  # resumed: watched again
    (alert,) = proc.tick(3_000 + 7_200_000).alerts
    assert (alert["run_id"], alert["rule"], alert["state"]) == ("r1", "run_stalled", "firing")


def test_counters_and_schedules_get_no_smoothing_and_everything_else_does():
    """SB3 logs step counts and schedules beside its losses: an EMA of train/n_updates says nothing."""
    events = [
        metrics(
            i,
            scalars={
                "train/loss": 1.0 / (i + 1),
                "train/n_updates": float(i * 10),
                "time/total_timesteps": float(i * 2048),
                "train/learning_rate": 3e-4,
                "time/fps": 900.0 + 0.25 * i,
            },
        )
        for i in range(5)
    ]
    names = {p.name for p in derive_all(events, cfg=StreamConfig(smooth_every=1))}
    assert {"train/loss_ema", "train/loss_recent_mean", "time/fps_ema"} <= names
    assert not {
        n
        for n in names
        if n.startswith(("train/n_updates_", "time/total_timesteps_", "train/learning_rate_"))
    }
    everything = {
        p.name
        for p in derive_all(events, cfg=StreamConfig(unsmoothed=(), detect_counters=False, smooth_every=1))
    }
    assert "train/n_updates_ema" in everything  # the list and the detection are configuration
    found = {p.name for p in derive_all(events, cfg=StreamConfig(unsmoothed=(), smooth_every=1))}
    assert "train/learning_rate_ema" in found and "train/n_updates_ema" not in found  # counts, by value


def test_a_series_is_a_counter_until_a_value_says_otherwise_in_any_batching():
    """Episode lengths rise by whole steps while a policy learns, then fall: smoothed from then."""
    from metricbus.schemas import RUN_FINISHED

    lengths = [10.0, 12.0, 12.0, 15.0, 20.0, 18.0, 25.0, 30.0, 22.0, 40.0, 41.0, 39.0]
    events = [metrics(i, {"episode/length": v}) for i, v in enumerate(lengths)]
    events.append((RUN_FINISHED, {"status": "finished", "summary": {}}, 99))
    points = [
        p for p in derive_all(events, cfg=StreamConfig(smooth_every=1)) if p.name == "episode/length_ema"
    ]
    assert [p.step for p in points] == list(range(5, 12))  # from the first fall (20 -> 18) on
    deriver = RunDeriver("r", StreamConfig(smooth_every=1))
    bodies = [b for _, b, _ in events[:-1]]
    whole = deriver.feed_many([Event("r", "p", i, i, METRICS, b, b"") for i, b in enumerate(bodies)])[0]
    assert [(p.step, p.value) for p in whole if p.name == "episode/length_ema"] == [
        (p.step, p.value) for p in points
    ]


def test_no_two_definitions_share_a_derived_name():
    """Every series the worker can derive (every feature, every metric_stat, a catalog throughput
    that is smoothed) has one definition: one source and kind per name, one point per step."""
    from metricbus.stream_jobs._config import METRIC_STATS
    from tests.every_feature import every_feature_run

    points = derive_all(every_feature_run(), cfg=StreamConfig(metric_stats=METRIC_STATS))
    definitions: dict[str, set[tuple[str, str]]] = {}
    at: dict[tuple[str, int, int | None], int] = {}
    for p in points:
        definitions.setdefault(p.name, set()).add((p.source, p.kind))
        at[p.name, p.step, p.epoch] = at.get((p.name, p.step, p.epoch), 0) + 1
    assert "time/fps_recent_mean" in definitions and "time/fps_p99" in definitions  # the run smooths fps
    assert {n: d for n, d in definitions.items() if len(d) > 1} == {}
    assert {k: n for k, n in at.items() if n > 1} == {}
    assert definitions["time/fps_p99"] == {("time/fps", "p99")}
    assert [p.value for p in points if p.name == "time/fps_p99"][-1] == 51.0  # over p99_window: all 40 values


def test_the_reward_cv_is_undefined_where_the_epochs_mean_is_near_0_beside_its_values():
    """A mean of 0.01 among per-step rewards of -0.5..0.5: std / |mean| would read 30, meaning nothing."""
    events = [(RUN_STARTED, run_started("p", "n"), 0)]
    steps = [(0, 1.0), (1, 2.0), (2, 3.0), (10, -0.5), (11, 0.53), (12, -0.0)]
    for step, reward in steps:
        body = {
            "step": step,
            "epoch": step // 10,
            "rank": 0,
            "scalars": {"Train/AvgReward": reward},
            "samples": {},
        }
        events.append((METRICS, body, 1000 + step))
    events.append((RUN_FINISHED, {"status": "finished", "summary": {}}, 5000))
    pts = by_name(derive_all(events))
    assert [p.epoch for p in pts["Epoch/AvgReward"]] == [0, 1]
    (cv,) = pts["Epoch/RewardCV"]  # epoch 1's mean 0.01 is under a tenth of 0.53: no point
    assert cv.epoch == 0 and cv.value == pytest.approx(np.std([1, 2, 3]) / 2)
