import numpy as np
import pytest

from metricbus.schemas import METRICS, RUN_FINISHED, RUN_STARTED, Event, run_started
from metricbus.stream_jobs import DEFAULT_RULES, StreamProcessor, derive_all, load_rules
from metricbus.stream_jobs._ranks import RankMerger


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


def ev(producer, seq, kind, body, ts):
    return Event("run", producer, seq, ts, kind, body, b"")


def rank_events(world, steps, values, step_ms=10):
    """Per rank, its events in order (its producer's seqs): RunStarted, a step every step_ms."""
    out = {}
    for r in range(world):
        body = run_started("p", "n", world_size=world, rank=r)
        evs = [ev(f"rank{r}", 0, RUN_STARTED, body, 1000)]
        evs += [
            ev(f"rank{r}", 1 + s, METRICS, m(r, s, float(values[s, r]))[1], 1000 + s * step_ms + r)
            for s in range(steps)
        ]
        evs.append(
            ev(
                f"rank{r}",
                1 + steps,
                RUN_FINISHED,
                {"status": "finished", "summary": {}},
                1000 + steps * step_ms + 5,
            )
        )
        out[r] = evs
    return out


def interleaved(per_rank, rng, most):
    """The ranks' events as records of 1 to ``most`` events, randomly interleaved, each
    producer's events in order."""
    cursors = dict.fromkeys(per_rank, 0)
    records = []
    while any(cursors[r] < len(per_rank[r]) for r in per_rank):
        r = int(rng.choice([r for r in per_rank if cursors[r] < len(per_rank[r])]))
        n = int(rng.integers(1, most))
        records.append(per_rank[r][cursors[r] : cursors[r] + n])
        cursors[r] += n
    return records


def merged_series(processor_output_points):
    return {
        name: {p.step: p.value for p in processor_output_points if p.name == name}
        for name in (
            "ranks/Train/Loss/mean",
            "ranks/Train/Loss/min",
            "ranks/Train/Loss/max",
            "ranks/reported",
        )
    }


def run_through(records):
    """Feed records (lists of events, one producer's each) to a processor; the merged series."""
    proc = StreamProcessor()
    points = []
    for record in records:
        points += proc.process(record).points.get("run", [])
    return merged_series(points)


def test_the_merge_depends_on_the_events_only_not_on_batching_or_arrival_order():
    """Issue 15: one rank's burst used to outrun the others and be emitted alone."""
    rng = np.random.default_rng(11)
    world, steps = 3, 300
    values = rng.normal(1.0, 0.3, size=(steps, world))
    per_rank = rank_events(world, steps, values)
    expected = {
        "ranks/Train/Loss/mean": {s: pytest.approx(values[s].mean()) for s in range(steps)},
        "ranks/Train/Loss/min": {s: values[s].min() for s in range(steps)},
        "ranks/Train/Loss/max": {s: values[s].max() for s in range(steps)},
        "ranks/reported": {s: 3.0 for s in range(steps)},
    }
    # whole ranks one after the other (a rank's spool synced late, or a rank started later)
    assert run_through([per_rank[r] for r in (2, 0, 1)]) == expected
    # random record sizes, randomly interleaved, each producer's events in order
    for trial in range(5):
        assert run_through(interleaved(per_rank, rng, 80)) == expected, trial


def test_a_dead_rank_is_left_out_after_the_timeout_in_event_time_and_the_straggler_alert_fires_once():
    world, steps = 2, 120
    values = np.ones((steps, world))
    per_rank = rank_events(world, steps, values, step_ms=1000)  # a step a second: 80 s past the death
    dead_after = 40
    rank1 = [e for e in per_rank[1] if e.kind != METRICS or e.body["step"] < dead_after][
        :-1
    ]  # killed: no RunFinished
    proc = StreamProcessor(rules=load_rules(DEFAULT_RULES))
    points, alerts = [], []
    records = [r[i : i + 5] for r in (rank1, per_rank[0]) for i in range(0, len(r), 5)]
    for record in sorted(records, key=lambda r: r[0].ts_ms):  # live: the ranks' records interleave
        out = proc.process(record)
        points += out.points.get("run", [])
        alerts += out.alerts
    series = merged_series(points)
    assert set(series["ranks/reported"]) == set(range(steps))  # every step emitted, in the end
    assert {s: v for s, v in series["ranks/reported"].items() if s < dead_after} == {
        s: 2.0 for s in range(dead_after)
    }
    assert {s: v for s, v in series["ranks/reported"].items() if s >= dead_after} == {
        s: 1.0 for s in range(dead_after, steps)
    }
    straggler = [a for a in alerts if a["rule"] == "straggler_rank"]
    assert [a["state"] for a in straggler] == ["firing", "ended"]  # fired once; closed as the run finished
    assert proc._runs["run"].finished  # rank 0's RunFinished ends it: rank 1 fell silent long before
    # a value that arrives after its step was emitted is counted, never merged
    late = proc.process([ev("rank1", 500, METRICS, m(1, 50, 99.0)[1], 1000 + 50 * 1000)])
    assert [p.value for p in late.points["run"] if p.name == "ranks/late_events"] == [1.0]


def test_a_burst_within_the_timeout_waits_for_the_other_rank():
    merger = RankMerger(world_size=2, timeout_s=30)
    out = []
    for step in range(100):  # rank 0 logs 100 steps in one second of event time
        out += merger.feed(0, step, {"x": 1.0}, 1000 + step * 10)
    assert out == []  # nothing emitted with one rank
    for step in range(100):
        out += merger.feed(1, step, {"x": 3.0}, 1000 + step * 10 + 5)
    means = {s: v for n, s, v in out if n == "ranks/x/mean"}
    assert means == {s: 2.0 for s in range(100)}
    assert {v for n, s, v in out if n == "ranks/lag_steps"} == {0.0}  # in event time the ranks were in step


def test_the_run_finishes_when_every_rank_has():
    values = np.ones((10, 2))
    per_rank = rank_events(2, 10, values)
    proc = StreamProcessor()
    proc.process(per_rank[1][:3])
    proc.process(per_rank[0])
    assert not proc._runs["run"].finished  # rank 1 is still sending
    proc.process(per_rank[1][3:])
    assert proc._runs["run"].finished


def test_single_rank_runs_have_no_rank_series():
    pts = derive_all([started(1), m(0, 0, 1.0), (RUN_FINISHED, {"status": "finished", "summary": {}}, 9)])
    assert not any(p.name.startswith("ranks/") for p in pts)


def test_a_rank_that_dies_just_before_the_end_is_given_up_on_by_the_clock():
    """No later event can tell that a rank died within the timeout of the end: the tick does."""
    per_rank = rank_events(2, 10, np.ones((10, 2)))
    proc = StreamProcessor()
    proc.process(per_rank[1][:-1])  # rank 1: every step, then killed (no RunFinished)
    proc.process(per_rank[0])
    assert not proc._runs["run"].finished
    last = per_rank[0][-1].ts_ms
    assert not proc.tick(last + 29_000).closing  # within the rank timeout (30 s): still waiting
    out = proc.tick(last + 31_000)
    assert out.closing == {"run"} and proc._runs["run"].finished
    assert out.first_seq["run"] >= 0 and out.aggregate_batches()[0]["closes_run"]


def test_a_run_declaring_two_billion_ranks_costs_what_two_do_and_its_steps_wait_for_the_timeout():
    """A hostile RunStarted (world_size 2**31 - 1) once made every event loop over the world."""
    world = 2**31 - 1
    proc = StreamProcessor()
    body = run_started("p", "n", world_size=world, rank=0)
    events = [ev("rank0", 0, RUN_STARTED, body, 1000)]
    events += [ev("rank0", 1 + s, METRICS, m(0, s, float(s))[1], 1000 + s * 1000) for s in range(100)]
    events.append(ev("rank0", 101, RUN_FINISHED, {"status": "finished", "summary": {}}, 101_000))
    points = []
    for i in range(0, len(events), 7):
        points += proc.process(events[i : i + 7]).points.get("run", [])
    reported = by(points, "ranks/reported")
    assert reported == {s: 1.0 for s in range(100)}  # every step, with the one rank there is
    assert set(by(points, "ranks/missing").values()) == {float(world - 1)}
    # the steps waited for the timeout: none went out before 30 s of event time had passed
    first_emitted = min(p.ts_ms for p in points if p.name == "ranks/reported")
    assert first_emitted > 1000 + 30_000
    assert by(points, "ranks/lag_steps")[0] == 1.0  # the ranks never seen: behind by step + 1
    assert proc._runs["run"].finished  # rank 0 finished, the rest are silent


def test_a_rank_heard_only_by_its_heartbeats_holds_its_steps_back_until_it_falls_silent():
    merger = RankMerger(world_size=2, timeout_s=30)
    assert merger.seen(1, 1000) == []  # rank 1 started, logged nothing yet
    out = []
    for step in range(10):
        out += merger.feed(0, step, {"x": 1.0}, 1000 + step * 1000)
    assert out == []  # waiting for rank 1, which is alive
    out += merger.feed(0, 10, {"x": 1.0}, 32_000)  # 31 s after rank 1's last heartbeat
    assert {s for n, s, v in out if n == "ranks/reported"} == set(range(11))
    assert {v for n, s, v in out if n == "ranks/missing"} == {1.0}


def test_lag_steps_depends_on_the_events_only_not_on_how_far_the_first_ranks_records_arrived():
    """A straggler 8 steps behind in event time reads 8 at every step, whatever the arrival order
    (counted when the last rank reported, it read 7 where the leader's next record was late)."""
    rng = np.random.default_rng(5)
    world, steps, behind = 2, 200, 8
    values = rng.normal(1.0, 0.3, size=(steps, world))
    per_rank = rank_events(world, steps, values)
    for i, e in enumerate(per_rank[1]):  # rank 1's events come `behind` steps later in event time
        per_rank[1][i] = e._replace(ts_ms=e.ts_ms + behind * 10)

    def lags(records):
        proc = StreamProcessor()
        points = []
        for record in records:
            points += proc.process(record).points.get("run", [])
        found = [(p.step, p.value) for p in points if p.name == "ranks/lag_steps"]
        assert len(found) == len({s for s, _ in found}) == steps  # one a step
        return dict(found)

    whole = lags([per_rank[0], per_rank[1]])
    assert {whole[s] for s in range(steps - behind)} == {float(behind)}
    assert lags([per_rank[1], per_rank[0]]) == whole
    for trial in range(8):
        assert lags(interleaved(per_rank, rng, 30)) == whole, trial
