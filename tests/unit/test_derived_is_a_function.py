"""A derived series is a function of the events alone: the same events in any batching, in any
record sizes, through the record-of-columns path or event by event, give the same derived
points, bit for bit; and its resolution follows the steps, not the speed of the loop."""

from __future__ import annotations

import math
import random

import pytest

from metricbus.schemas import (
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    Event,
    decode_record,
    default_codec,
    encode_events,
    run_started,
)
from metricbus.stream_jobs import StreamConfig, StreamProcessor
from metricbus.stream_jobs._rules import DEFAULT_RULES, load_rules

CODEC = default_codec()


def run(rng: random.Random, steps: int = 600, epoch_steps: int = 90) -> list[Event]:
    """One run using every feature the deriver has: scalars (some steps missing a name, a NaN),
    per-sample rewards, labels (several episodes at one step), throughput, epochs, a summary."""
    events = [Event("r", "p", 0, 1_000, RUN_STARTED, run_started("prop", "r", {}), b"")]
    for step in range(steps):
        scalars = {"Train/Loss": 1 / (step + 1) + rng.gauss(0, 0.01), "Train/AvgReward": rng.random()}
        if step % 3:
            scalars["Performance/Generation_TokensPerSec"] = rng.gauss(200, 20)
        if step % 5 == 0:
            scalars["Epoch/APITokens"] = rng.random() * 100
        if step == 250:
            scalars["Train/Loss"] = math.nan
        body = {"step": step, "epoch": step // epoch_steps, "rank": 0, "scalars": scalars, "samples": {}}
        events.append(Event("r", "p", len(events), 2_000 + step, METRICS, body, b""))
        if step % 50 == 0:  # per-sample rewards beside, in an event of their own
            samples = {"rewards/format": [rng.random() for _ in range(4)], "criteria/clarity": [rng.random()]}
            body = {"step": step, "epoch": step // epoch_steps, "rank": 0, "scalars": {}, "samples": samples}
            events.append(Event("r", "p", len(events), 2_000 + step, METRICS, body, b""))
        # episodes ending at some steps, labelled (long stretches of plain steps elsewhere: the
        # column path takes those a column at a time)
        for _ in range(rng.choice((0, 0, 1, 2)) if 300 <= step < 400 else 0):
            body = {
                "step": step,
                "epoch": step // epoch_steps,
                "rank": 0,
                "scalars": {"episode/reward": rng.random(), "episode/success": float(rng.random() < 0.5)},
                "samples": {},
                "labels": {"task": rng.choice(("a", "b", "c"))},
            }
            events.append(Event("r", "p", len(events), 2_000 + step, METRICS, body, b""))
    finished = {"status": "finished", "summary": {}}
    events.append(Event("r", "p", len(events), 9_000, RUN_FINISHED, finished, b""))
    return events


def cut(events: list[Event], rng: random.Random) -> list[list[Event]]:
    """The events in records of random sizes (1 to 400), in order."""
    records, i = [], 0
    while i < len(events):
        n = rng.choice((1, 2, 7, 33, 100, 400))
        records.append(events[i : i + n])
        i += n
    return records


def derived(records: list[list[Event]], columnar: bool, cfg: StreamConfig | None = None) -> list[tuple]:
    """Every derived point and alert of the records, through the worker's processor."""
    proc = StreamProcessor(cfg, rules=load_rules(DEFAULT_RULES))
    points, alerts = [], []
    for record in records:
        if columnar:  # as the worker takes a record off the topic: encoded, decoded, columns when it can
            rows = [(e.seq, e.ts_ms, e.kind, e.body) for e in record]
            out = proc.process_record(*decode_record(CODEC, encode_events(CODEC, "r", "p", rows)))
        else:
            out = proc.process(record)
        points += [tuple(p) for pts in out.points.values() for p in pts]
        alerts += [(a["rule"], a["state"], a["metric"], a["step"], repr(a["value"])) for a in out.alerts]
    # repr: bit for bit, NaN equal to NaN
    return sorted((*p[:5], repr(p[5]), p[6]) for p in points) + sorted(alerts)


@pytest.mark.parametrize("seed", range(6))
def test_any_batching_of_a_runs_events_gives_the_same_derived_points_bit_for_bit(seed):
    rng = random.Random(seed)
    events = run(random.Random(100 + seed))
    expected = derived([[e] for e in events], columnar=False)  # one event a record
    assert len(expected) > 1000
    for columnar in (False, True):
        got = derived(cut(events, rng), columnar)
        assert got == expected


def test_an_epoch_longer_than_a_block_of_its_accumulators_gives_the_same_bits_in_any_batching():
    """The epoch's reward and loss fold in fixed blocks (``_stats.Blocks``): an epoch of 2,500
    steps fills two of them, whatever the records."""
    events = run(random.Random(7), steps=2500, epoch_steps=2500)
    expected = derived([[e] for e in events], columnar=False)
    assert [p for p in expected if p[0] == "Epoch/AvgLoss"]
    for seed in range(3):
        assert derived(cut(events, random.Random(seed)), columnar=True) == expected


def test_a_fast_loop_and_a_slow_one_get_the_same_smoothed_points():
    """1,000 steps in one record (a loop logging in under a second) or one a record."""
    events = run(random.Random(1), steps=1000)
    fast, slow = derived([events], columnar=True), derived([[e] for e in events], columnar=False)
    assert fast == slow
    ema = [p for p in fast if p[0] == "Train/Loss_ema"]
    assert len(ema) == 100 and {p[3] for p in ema} == set(range(9, 1000, 10))  # the 10th, 20th, ...
    every = derived([events], columnar=True, cfg=StreamConfig(smooth_every=1))
    assert len([p for p in every if p[0] == "Train/Loss_ema"]) == 1000


def test_a_run_ending_between_points_gets_its_last_smoothed_point_at_its_last_step():
    events = run(random.Random(2), steps=25)
    ema = [p for p in derived([events], columnar=True) if p[0] == "Train/Loss_ema"]
    assert [p[3] for p in ema] == [9, 19, 24]
