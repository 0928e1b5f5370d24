import numpy as np
import pytest

from schemas import METRICS, RUN_FINISHED, RUN_STARTED, run_started
from stream_jobs import DEFAULT_RULES, StreamProcessor, derive_all, load_rules
from stream_jobs._ranks import RankMerger


def started(world):
    return (RUN_STARTED, run_started("p", "n", world_size=world), 0)


def m(rank, step, loss):
    return (
        METRICS,
        {"step": step, "epoch": None, "rank": rank, "scalars": {"Train/Loss": loss}, "samples": {}},
        step,
    )


def by(points, name):
    return {p.step: p.value for p in points if p.name == name}


def test_ranks_are_merged_per_step_once_all_reported_matching_numpy():
    rng = np.random.default_rng(0)
    values = rng.normal(1.0, 0.2, size=(20, 4))  # step x rank
    events = [started(4)] + [m(r, s, float(values[s, r])) for s in range(20) for r in range(4)]
    pts = derive_all(events)
    assert by(pts, "ranks/Train/Loss/mean") == pytest.approx({s: values[s].mean() for s in range(20)})
    assert by(pts, "ranks/Train/Loss/std") == pytest.approx({s: values[s].std() for s in range(20)})
    assert by(pts, "ranks/Train/Loss/max") == pytest.approx({s: values[s].max() for s in range(20)})
    assert set(by(pts, "ranks/reported").values()) == {4.0}


def test_a_late_rank_times_out_is_counted_and_raises_the_straggler_alert():
    merger = RankMerger(world_size=2, timeout_steps=3)
    out = []
    for step in range(10):
        out += merger.feed(0, step, {"x": 1.0})  # rank 1 never keeps up
    reported = {s: v for n, s, v in out if n == "ranks/reported"}
    assert reported == {s: 1.0 for s in range(7)}  # emitted without rank 1 once rank 0 was 3 ahead
    assert merger.feed(1, 0, {"x": 2.0}) == [("ranks/late_events", 0, 1.0)]

    processor = StreamProcessor(rules=load_rules(DEFAULT_RULES))
    from schemas import Event

    def ev(seq, kind, body, producer):
        return Event("run", producer, seq, seq, kind, body, b"")

    alerts = processor.process(
        [ev(0, RUN_STARTED, started(2)[1], "a"), ev(0, METRICS, m(1, 0, 1.0)[1], "b")]
    ).alerts
    for step in range(30):
        alerts += processor.process([ev(step + 1, METRICS, m(0, step, 1.0)[1], "a")]).alerts
    assert any(a["rule"] == "straggler_rank" and a["state"] == "firing" for a in alerts)


def test_single_rank_runs_have_no_rank_series():
    pts = derive_all([started(1), m(0, 0, 1.0), (RUN_FINISHED, {"status": "finished", "summary": {}}, 9)])
    assert not any(p.name.startswith("ranks/") for p in pts)
