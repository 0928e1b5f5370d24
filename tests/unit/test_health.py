"""Run health: each injected defect lowers its part and is named in the evidence; a clean run scores high."""

import math

import pytest

from metricbus.diagnostics._health import assess
from metricbus.schemas import METRICS, RUN_FINISHED, RUN_STARTED, Event, run_started

T0 = 1_700_000_000_000


def run(n=200, loss=None, interval_ms=None, world=1, silent_rank_after=None, **_):
    """A clean run: loss falling, reward rising, one event every 100 ms."""
    loss = loss or (lambda s: 1.0 / (s + 1) + 0.001 * (s % 3))
    interval_ms = interval_ms or (lambda s: 100)
    out, ts = [], T0
    producers = [f"p{r}" for r in range(world)]
    seqs = dict.fromkeys(producers, 0)

    def add(producer, kind, body, ts):
        out.append(Event("r", producer, seqs[producer], ts, kind, body, b""))
        seqs[producer] += 1

    for r, p in enumerate(producers):
        add(p, RUN_STARTED, run_started("proj", "n", {}, rank=r, world_size=world), ts)
    for s in range(n):
        ts += interval_ms(s)
        for r, p in enumerate(producers):
            if silent_rank_after is not None and r == 1 and s >= silent_rank_after:
                continue
            body = {"step": s, "epoch": s // 20, "rank": r, "samples": {}}
            body["scalars"] = {"Train/Loss": loss(s), "Train/AvgReward": s / n}
            add(p, METRICS, body, ts)
    for p in producers:
        add(p, RUN_FINISHED, {"status": "finished", "summary": {}}, ts + 100)
    return out


def evidence(health, part):
    return " | ".join(health.part(part).evidence)


def test_a_clean_run_scores_high():
    health = assess("r", run(), dead_letters=0)
    assert health.score == 100
    assert "Train/Loss" in evidence(health, "progress")


def test_lost_events_lower_completeness_with_the_missing_seqs():
    events = [e for e in run() if not 50 <= e.seq < 60]
    health = assess("r", events, dead_letters=0)
    assert health.part("completeness").deducted > 10 and health.score < 90
    assert "10 event(s) missing" in evidence(health, "completeness") and "50-59" in evidence(
        health, "completeness"
    )


def test_one_record_with_a_huge_seq_is_judged_from_the_gaps_without_a_set_of_every_seq():
    """A topic is untrusted: one event's seq of 10**12 made health (and the report, and the
    dashboard's run page) build a set of a trillion seqs until memory ran out."""
    events = [e for e in run() if not 50 <= e.seq < 52 and e.seq != 80]
    events.append(events[-1]._replace(seq=10**12))
    health = assess("r", events, dead_letters=0)
    said = evidence(health, "completeness")
    held = 202 - 3 + 1  # RunStarted, 200 steps, RunFinished; three left out; the huge one
    assert f"{10**12 + 1 - held} event(s) missing" in said and "(seqs 50-51, 80, 202-999999999999)" in said
    assert health.part("completeness").deducted == pytest.approx(20)  # 10 + 10 x nearly all of it


def test_a_batch_archived_twice_is_found():
    events = run()
    events += events[100:110]
    health = assess("r", events, dead_letters=0)
    assert "10 event(s) archived twice" in evidence(health, "completeness")


def test_a_run_that_never_finished_says_so():
    events = [e for e in run() if e.kind != RUN_FINISHED]
    assert "no RunFinished" in evidence(assess("r", events, 0), "completeness")


def test_a_nan_burst_lowers_validity_from_its_first_step():
    health = assess("r", run(loss=lambda s: math.nan if 120 <= s < 130 else 1 / (s + 1)), 0)
    assert health.part("validity").deducted >= 5
    assert "Train/Loss: 10 of 200 values NaN or infinite, first at step 120" in evidence(health, "validity")


def test_a_loss_spike_lowers_stability_at_its_step():
    health = assess("r", run(loss=lambda s: 50.0 if s == 80 else 1 / (s + 1)), 0)
    assert "spike(s)" in evidence(health, "stability") and "80" in evidence(health, "stability")
    assert health.part("validity").deducted == 0


def test_a_stall_and_a_collection_frequency_regression_lower_timing():
    stalled = assess("r", run(interval_ms=lambda s: 120_000 if s == 150 else 100), 0)
    assert "no event for 120 s" in evidence(stalled, "timing")
    slower = assess("r", run(interval_ms=lambda s: 100 if s < 100 else 500), 0)
    assert "collection-frequency regression" in evidence(slower, "timing")
    assert "logged every 0.50 s late in the run, every 0.10 s early" in evidence(slower, "timing")


def test_a_stall_between_any_two_events_counts_and_the_events_are_read_once():
    """The stall is judged on every event's time, not only a metric's (RunFinished two minutes
    after the last step here); ``assess`` takes an iterator (a run read a chunk at a time)."""
    events = run()
    events[-1] = events[-1]._replace(ts_ms=events[-1].ts_ms + 120_000)
    health = assess("r", iter(events), 0)
    assert "no event for 120 s" in evidence(health, "timing")
    assert health.part("completeness").deducted == 0  # RunFinished and every seq seen in the one pass


def test_a_rank_that_goes_silent_lowers_completeness():
    health = assess("r", run(world=2, silent_rank_after=50), 0)
    assert "rank 1 stopped reporting at step 49; others reached 199" in evidence(health, "completeness")
    assert assess("r", run(world=2), 0).score == 100


def test_a_run_declaring_two_billion_ranks_is_judged_without_a_loop_over_them():
    """A RunStarted is untrusted: its world_size of 2**31 - 1 once made health loop that often."""
    events = run(world=2)
    events[0] = events[0]._replace(body={**events[0].body, "world_size": 2**31 - 1})
    text = evidence(assess("r", events, 0), "completeness")
    assert "rank 2 of 2147483647 never reported a metric" in text
    assert "rank 9 of 2147483647 never reported" in text and "rank 10 of" not in text
    assert f"and {2**31 - 1 - 10} more rank(s) of 2147483647 never reported a metric" in text


def test_no_progress_and_dead_letters():
    health = assess("r", run(loss=lambda s: 1.0 + s / 100), dead_letters=3)
    assert "did not improve" in evidence(health, "progress")
    assert health.part("pipeline").deducted == 6 and "3 record(s)" in evidence(health, "pipeline")
    assert "not checked" in evidence(assess("r", run(), dead_letters=None), "pipeline")


@pytest.mark.parametrize("part", ["completeness", "validity", "progress", "stability", "timing", "pipeline"])
def test_no_part_deducts_more_than_its_weight(part):
    events = [e for e in run(loss=lambda s: math.nan if s % 2 else 50.0 * (s % 7)) if e.seq % 3]
    health = assess("r", events, dead_letters=100)
    assert 0 <= health.part(part).deducted <= health.part(part).weight
    assert health.score >= 0


def test_labels_are_broken_down_and_a_label_that_does_not_improve_is_named():
    out = []
    for i in range(300):
        task = ("logo_a", "logo_b", "logo_c")[i % 3]
        reward = 0.3 if task == "logo_c" else i / 300  # logo_c never improves; the run does
        body = {"step": i, "epoch": None, "rank": 0, "samples": {}, "labels": {"task": task}}
        body["scalars"] = {"episode/reward": reward, "episode/success": float(task != "logo_c")}
        out.append(Event("r", "p", i, T0 + 100 * i, METRICS, body, b""))
    out.append(Event("r", "p", 300, T0 + 30_100, RUN_FINISHED, {"status": "finished", "summary": {}}, b""))
    health = assess("r", out, dead_letters=0)
    rows = {row["label"]: row for row in health.labels}
    assert set(rows) == {"task=logo_a", "task=logo_b", "task=logo_c"}
    assert rows["task=logo_c"]["events"] == 100
    assert rows["task=logo_c"]["episode/success"] == 0.0 and rows["task=logo_a"]["episode/success"] == 1.0
    assert rows["task=logo_c"]["episode/reward"] == pytest.approx(0.3)
    progress = health.part("progress")
    assert progress.deducted == 3 and "episode/reward [task=logo_c] did not improve" in evidence(
        health, "progress"
    )
    assert health.as_dict()["labels"] == health.labels
    # validity and the other parts see each value once, not once per label
    assert health.score == 97


def test_with_no_broker_the_dead_letters_are_not_checked_and_no_client_is_left_open(tmp_path, monkeypatch):
    """A client that cannot reach the broker is stopped too (asyncio said "Unclosed AIOKafkaConsumer")."""
    import socket

    import aiokafka

    from metricbus.diagnostics._health import dead_letters_of
    from metricbus.schemas import Settings

    made = []

    class Consumer(aiokafka.AIOKafkaConsumer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(aiokafka, "AIOKafkaConsumer", Consumer)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(data_dir=tmp_path, bootstrap=f"127.0.0.1:{port}")
    assert dead_letters_of(settings, "r", timeout_s=1.0) is None
    assert made == []  # nothing listens: said before any client is made (no aiokafka ERROR lines)
    from metricbus.schemas import read_topic

    with pytest.raises(Exception):  # noqa: B017 - aiokafka's own connection error
        read_topic(settings, settings.topics.deadletter, timeout_s=1.0)
    assert len(made) == 1 and made[0]._closed  # stopped, its connections closed


@pytest.mark.parametrize("reward", ["Train/Reward", "rollout/episode_return"])
def test_a_reward_logged_as_samples_is_judged_like_one_logged_as_a_scalar(reward):
    """The README's own example logs per-sample rewards; SB3's adapter logs episode returns so."""
    events = []
    for e in run():
        if e.kind == METRICS:
            s = e.body["step"]
            samples = {reward: [s / 200 - 0.1, s / 200 + 0.1, math.nan]}  # a NaN-scored sample: left out
            body = {**e.body, "scalars": {"Train/Loss": e.body["scalars"]["Train/Loss"]}, "samples": samples}
            e = e._replace(body=body)
        events.append(e)
    health = assess("r", events)
    assert f"reward {reward}: 0.0475 -> 0.9475" in evidence(health, "progress")  # medians of the tenths
    falling = [
        e._replace(body={**e.body, "samples": {reward: [1 - e.body["step"] / 200]}})
        if e.kind == METRICS
        else e
        for e in events
    ]
    assert f"reward {reward} did not improve" in evidence(assess("r", falling), "progress")


def test_episodes_that_lengthen_as_the_agent_learns_are_no_collection_frequency_regression():
    """``run.log_episode`` logs once an episode: 10 episodes a second early, 2 late is learning."""
    events = run(interval_ms=lambda s: 100 if s < 100 else 500)
    episodes = [e for e in events if e.kind == METRICS]
    for e in episodes:
        e.body["scalars"] = {"episode/length": 10.0 + e.body["step"], "episode/reward": 1.0}
    assert "collection-frequency" not in evidence(assess("r", events, 0), "timing")


def test_a_parts_points_as_shown_add_up_to_its_weight():
    """One NaN in 200 deducts 5.05 of validity's 20: shown as 15.0 kept and 5.0 deducted, never
    14.9 and 5.0 (each rounded on its own)."""
    from metricbus.cli._archive import points_of
    from metricbus.diagnostics._health import shown_points

    assert shown_points(20, 5 + 10 * 1 / 200) == (15.0, 5.0)
    assert points_of({"weight": 20, "deducted": 5 + 10 * 1 / 200}) == "15.0 of 20  (5.0 deducted)"
    assert points_of({"weight": 30, "deducted": 0}) == "30.0 of 30  (nothing deducted)"
