"""The stream job takes each input record a column per metric; the outcome must equal value by value.

Every columnar path (statistics, alert rules, derivation, dedupe) is checked here against
the one-value-at-a-time path on the same data, cut into records of random sizes.
"""

import math
import random

import numpy as np
import pytest

from metricbus.schemas import METRICS, RUN_FINISHED, Event, SeqSet
from metricbus.stream_jobs import StreamProcessor
from metricbus.stream_jobs._alerts import AlertEngine
from metricbus.stream_jobs._derive import RunDeriver
from metricbus.stream_jobs._rules import DEFAULT_RULES, load_rules, parse_rules
from metricbus.stream_jobs._stats import EMA, RollingMoments, Window


def chunks(items, rng, largest=150):
    i = 0
    while i < len(items):
        n = rng.randint(1, largest)
        yield items[i : i + n]
        i += n


def series(kind, n, rng):
    if kind == "noisy":
        xs = [rng.gauss(50, 10) for _ in range(n)]
    elif kind == "sawtooth":
        xs = [(i % 100) / 100 for i in range(n)]
    elif kind == "spikes":
        xs = [100.0 if rng.random() < 0.03 else rng.gauss(10, 0.5) for _ in range(n)]
    else:  # flat with NaN and inf sprinkled in
        xs = [1.0 + 1e-9 * i for i in range(n)]
    for i in rng.sample(range(n), n // 50):
        xs[i] = rng.choice([math.nan, math.inf, -math.inf])
    return xs


def test_window_ema_and_moments_extend_like_adding_one_by_one():
    rng = random.Random(1)
    xs = series("spikes", 2000, rng)
    w1, w2, e1, e2 = Window(10), Window(10), EMA(0.6), EMA(0.6)
    finite = [x for x in xs if math.isfinite(x)]
    m1, m2 = RollingMoments(20), RollingMoments(20)
    for part in chunks(xs, rng):
        for x in part:
            w1.add(x)
            e1.add(x)
        w2.extend(part)
        e2.extend(part)
        assert list(w1.values) == list(w2.values) and w1.nonfinite == w2.nonfinite
        assert e2.value == pytest.approx(e1.value, rel=1e-12)
    for part in chunks(finite, rng):
        scores = m2.scores(part, min_count=10)
        for x, z in zip(part, scores):  # the score against the window just before each value
            enough = len(m1) >= 10 and m1.std() > 0
            assert (z == pytest.approx((x - m1.mean()) / m1.std(), rel=1e-6)) if enough else math.isnan(z)
            m1.add(x)
        m2.extend(part)
        assert m2.mean() == pytest.approx(m1.mean(), rel=1e-12)
        assert m2.std() == pytest.approx(m1.std(), rel=1e-6)


RULES = """
rules:
  - {name: high, kind: threshold, metric: "*", op: ">", value: 60, for: 3, resolve_after_s: 0.05}
  - {name: low_warm, kind: threshold, metric: "*", op: "<=", value: 0.05, warmup: 30, resolve_after_s: 0}
  - {name: nan, kind: nonfinite, metric: "*", resolve_after_s: 0.02}
  - {name: jump, kind: rate, metric: "*", max_change: 30, resolve_after_s: 0.01}
  - {name: collapse, kind: zscore, metric: "*", window: 20, z: 3, direction: below, resolve_after_s: 0.04}
  - {name: outlier, kind: zscore, metric: "*", window: 12, z: 3, direction: both, for: 2}
"""


@pytest.mark.parametrize("kind", ["noisy", "sawtooth", "spikes", "flat"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_alert_rules_on_columns_fire_and_resolve_exactly_as_value_by_value(kind, seed):
    rng = random.Random(seed)
    xs = series(kind, 3000, rng)
    steps, stamps = list(range(len(xs))), [5 * i for i in range(len(xs))]
    one, many = AlertEngine(parse_rules(RULES)), AlertEngine(parse_rules(RULES))
    expected = [a for x, s, t in zip(xs, steps, stamps) for a in one.observe("r", "m", x, s, t)]
    got, i = [], 0
    for part in chunks(xs, rng):
        got += many.observe_many("r", "m", part, steps[i : i + len(part)], stamps[i : i + len(part)])
        i += len(part)
    order = {r: n for n, r in enumerate(["high", "low_warm", "nan", "jump", "collapse", "outlier"])}
    expected.sort(key=lambda a: (order[a["rule"]], a["step"]))  # per series, rule after rule
    got.sort(key=lambda a: (order[a["rule"]], a["step"]))
    assert got == expected
    assert len(expected) >= 2  # the data really exercises the rules


def run_events(rng, n=1200):
    """One run: changing epochs, a missing name now and then, samples, throughput, tokens, NaN."""
    events = []
    for step in range(n):
        scalars = {"Train/Loss": 1 / (step + 1) + rng.gauss(0, 0.01), "Train/AvgReward": rng.random()}
        if step % 7:
            scalars["Performance/Generation_TokensPerSec"] = rng.gauss(200, 20)
        if step % 3 == 0:
            scalars["Epoch/APITokens"] = float(rng.randint(0, 500))
        if step == 400:
            scalars["Train/Loss"] = math.nan
        samples = {"Train/Reward": [rng.random() for _ in range(8)]} if step % 50 == 0 else {}
        body = {"step": step, "epoch": step // 90, "rank": 0, "scalars": scalars, "samples": samples}
        events.append(Event("run", "p", step, 1000 + step, METRICS, body, b"\0" * 8))
    events.append(Event("run", "p", n, 1000 + n, RUN_FINISHED, {"status": "finished"}, b"\0" * 8))
    return events


def keyed(points):
    return {(p.name, p.kind, p.step, p.epoch, p.ts_ms): p.value for p in points}


def test_deriving_a_record_at_a_time_equals_event_by_event():
    rng = random.Random(7)
    events = run_events(rng)
    one, many = RunDeriver("run"), RunDeriver("run")
    expected = [p for e in events for p in one.feed(e.kind, e.body, e.ts_ms)]
    got, columns = [], {}
    for part in chunks(events, rng):
        points, cols = many.feed_many(part)
        got += points
        for c in cols:
            assert len(c.values) == len(c.steps) == len(c.ts_ms)
            columns.setdefault(c.name, []).extend(zip(c.steps, c.values))
    exp, have = keyed(expected), keyed(got)
    assert have.keys() == exp.keys()
    for key, value in exp.items():  # bit for bit: a derived series is a function of the events
        assert have[key] == value or (math.isnan(have[key]) and math.isnan(value)), key
    assert {p.name for p in expected} >= {"Epoch/AvgLoss", "Epoch/APITokens", "final/Train/Reward_mean"}
    assert {"Train/Loss_ema", "Train/Loss_recent_mean"} <= {p.name for p in expected}
    # the columns carry every logged scalar, in order, for the alert rules
    for name in ("Train/Loss", "Performance/Generation_TokensPerSec"):
        logged = [(e.body["step"], e.body["scalars"][name]) for e in events[:-1] if name in e.body["scalars"]]
        assert np.array_equal(np.array(columns[name]), np.array(logged), equal_nan=True)


def test_a_redelivered_record_is_dropped_even_when_it_overlaps_new_events():
    events = run_events(random.Random(3), n=300)
    rules = load_rules(DEFAULT_RULES)
    reference, redelivered = StreamProcessor(rules=rules), StreamProcessor(rules=rules)
    expected = [reference.process(events[i : i + 100]) for i in range(0, len(events), 100)]
    got = [redelivered.process(events[0:100]), redelivered.process(events[50:150])]  # half seen before
    got += [redelivered.process(events[150:200]), redelivered.process(events[100:200])]  # all seen
    got += [redelivered.process(events[200:])]
    assert reference.events == redelivered.events == len(events)
    assert redelivered.dedupe.duplicates == 50 + 100

    def derived(outputs):
        return keyed(
            p  # the rolling statistics are per input record, and redelivery changes the records
            for o in outputs
            for points in o.points.values()
            for p in points
            if not p.name.endswith(("_recent_mean", "_ema"))
        )

    assert derived(got) == pytest.approx(derived(expected), rel=1e-9, nan_ok=True)


def test_seqset_add_range_matches_a_python_set():
    rng = random.Random(5)
    seqs, seen = SeqSet(), set()
    for _ in range(2000):
        start = rng.randint(0, 3000)
        end = start + rng.randint(0, 40)
        fresh = not any(s in seen for s in range(start, end + 1))
        assert seqs.add_range(start, end) == fresh
        if fresh:
            seen.update(range(start, end + 1))
    assert [s for a, b in seqs.intervals() for s in range(a, b + 1)] == sorted(seen)


def test_alerts_of_one_record_come_out_in_event_order_across_series():
    rules = parse_rules(
        "rules:\n  - {name: nan, kind: nonfinite, metric: a}\n  - {name: high, kind: threshold, metric: b, op: '>', value: 1}\n"
    )
    events = []
    for step in range(40):
        scalars = {"b": 5.0 if step == 10 else 0.0, "a": math.nan if step == 30 else 0.0}
        body = {"step": step, "epoch": None, "rank": 0, "scalars": scalars, "samples": {}}
        events.append(Event("run", "p", step, 1000 + step, METRICS, body, b"\0" * 8))
    alerts = StreamProcessor(rules=rules).process(events).alerts
    assert [(a["rule"], a["step"]) for a in alerts] == [("high", 10), ("nan", 30)]


def test_a_record_taken_from_its_columns_derives_and_fires_exactly_as_its_events(monkeypatch):
    """The worker takes a columns-only record without an object per event
    (StreamProcessor.process_record); every output must equal processing its decoded events:
    uniform records, epochs changing within a record, names varying, samples beside columns,
    NaN and inf, a redelivered record, the run's end."""
    from metricbus.schemas import decode_events, decode_record, default_codec, encode_events

    rng = random.Random(11)
    codec = default_codec()
    events = []
    for step in range(1500):
        scalars = {"Train/Loss": 1 / (step + 1) + rng.gauss(0, 0.01), "Train/AvgReward": rng.random()}
        if step < 700 or step % 7:  # the same names every step until 700, then now and then one less
            scalars["Performance/Generation_TokensPerSec"] = rng.gauss(200, 20)
        if step in (400, 401):
            scalars["Train/Loss"] = [math.nan, math.inf][step - 400]
        if step > 1100 and step % 40 == 0:
            scalars["Train/Loss"] = 50.0  # a spike for the rules
        samples = {"Train/Reward": [rng.random() for _ in range(8)]} if step > 1000 and step % 50 == 0 else {}
        body = {
            "step": step,
            "epoch": step // 90,
            "rank": 0,
            "scalars": scalars,
            "samples": samples,
            "labels": {},
        }
        events.append((step, 1000 + step, METRICS, body))
    events.append((1500, 2500, RUN_FINISHED, {"status": "finished", "exit_code": 0, "summary": {}}))
    records = [
        encode_events(codec, "run", "p" * 32, part, "0.1.0") for part in chunks(events, rng, largest=120)
    ]
    records.insert(5, records[3])  # redelivered
    rules = load_rules(DEFAULT_RULES)
    by_event, by_column = StreamProcessor(rules=rules), StreamProcessor(rules=rules)
    took_columns, fired = [], 0
    feed_columns = RunDeriver.feed_columns

    def counted(self, cols):
        took_columns.append(len(cols.seqs))
        return feed_columns(self, cols)

    monkeypatch.setattr(RunDeriver, "feed_columns", counted)
    for record in records:
        expected = by_event.process(decode_events(codec, record))
        evs, cols = decode_record(codec, record)
        got = by_column.process_record(evs, cols)
        assert keyed(p for ps in got.points.values() for p in ps) == pytest.approx(
            keyed(p for ps in expected.points.values() for p in ps), rel=1e-12, nan_ok=True
        )
        assert [(a["rule"], a["state"], a["step"], a["seq"]) for a in got.alerts] == [
            (a["rule"], a["state"], a["step"], a["seq"]) for a in expected.alerts
        ]
        fired += len(expected.alerts)
        assert (got.first_seq, got.closing, got.histograms) == (
            expected.first_seq,
            expected.closing,
            expected.histograms,
        )
    assert by_column.events == by_event.events == len(events)
    assert len(took_columns) > 5  # the column path ran, not only the fallback
    assert fired > 0  # the rules fired (and resolved) on both paths alike
