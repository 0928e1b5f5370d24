"""Health and compare read a run's columns (diagnostics/_columnar.py): the same as reading its events."""

import math
import random

import pytest

from metricbus.diagnostics._columnar import read_logged
from metricbus.diagnostics._health import Seen, judge
from metricbus.schemas import (
    CONFIG_UPDATE,
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    Event,
    MetricbusError,
    run_started,
)
from metricbus.sinks import ParquetArchive, iter_events

T0 = 1_700_000_000_000


def every_feature(rng: random.Random) -> list[Event]:
    """Two ranks; scalars with NaN and inf; samples with NaN, all-NaN and empty; labelled
    episodes; a seq gap; a config update; RunFinished of one rank only."""
    out = []
    for rank in range(2):
        producer, seq = f"rank{rank}", 0

        def add(kind, body, ts, producer=producer):
            nonlocal seq
            out.append(Event("r", producer, seq, ts, kind, body, b""))
            seq += 1

        add(RUN_STARTED, run_started("proj", "n", {"lr": 0.1}, rank=rank, world_size=3), T0)
        for step in range(300):
            if rank == 1 and 100 <= step < 110:
                seq += 1  # lost on the way: a gap in rank 1's seqs
                continue
            loss = rng.choice([math.nan, math.inf]) if step % 97 == 5 else rng.random()
            body = {"step": step, "epoch": step // 50, "rank": rank, "labels": {}}
            body["scalars"] = {"Train/Loss": loss, f"only/rank{rank}": float(step)}
            body["samples"] = {}
            if step % 3 == 0:
                body["samples"]["Train/Reward"] = [rng.random(), math.nan, rng.random()][: rng.randint(0, 3)]
            if step % 11 == 0:
                body["samples"]["Train/Reward"] = [math.nan]
            if step % 7 == 0:
                body["labels"] = {"task": rng.choice(["a", "b"])}
                body["scalars"]["episode/reward"] = rng.random()
            add(METRICS, body, T0 + 10 * step + rank)
            if step == 150:
                add(CONFIG_UPDATE, {"config_json": '{"lr": 0.05}'}, T0 + 10 * step)
        if rank == 0:
            add(RUN_FINISHED, {"status": "finished", "summary": {"x": 1.0}}, T0 + 4000)
    return out


def comparable(seen: Seen) -> dict:
    def points(pts):
        return [(s, "nan" if math.isnan(v) else v, t) for s, v, t in pts]

    return {
        "series": {n: points(p) for n, p in seen.series.items()},
        "seqs": {p: list(s) for p, s in seen.seqs.items()},
        "stamps": list(seen.stamps),
        "finished": seen.finished,
        "world": seen.world,
        "last_step": seen.last_step,
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_columns_give_what_the_events_give(tmp_path, seed):
    events = every_feature(random.Random(seed))
    archive = ParquetArchive(tmp_path)
    archive.open()
    archive.write(events)
    archive.write([e for e in events if e.producer_id == "rank0" and 40 <= e.seq < 45])  # archived twice
    archive.flush()
    by_events = Seen.read(e for chunk in iter_events(tmp_path, "r") for e in chunk)
    by_columns, carried = read_logged(tmp_path, "r")
    got, want = comparable(by_columns), comparable(by_events)
    # the events' reading merges an event's second copy into the first (one event, one point a
    # name); the columns count it again, so health says so
    assert got["seqs"]["rank0"] == want["seqs"]["rank0"] + [40, 41, 42, 43, 44]
    got["seqs"]["rank0"] = want["seqs"]["rank0"]
    for key in want:
        if key == "series":
            assert list(got[key]) == list(want[key])
            for name in want[key]:
                assert got[key][name] == want[key][name], name
        assert got[key] == want[key], key
    assert [e.kind for e in carried] == [RUN_STARTED, CONFIG_UPDATE, RUN_FINISHED, RUN_STARTED, CONFIG_UPDATE]
    twice = "5 event(s) archived twice"
    assert twice in " ".join(judge("r", by_columns).part("completeness").evidence)
    assert twice not in " ".join(judge("r", by_events).part("completeness").evidence)
    by_columns.seqs["rank0"] = by_events.seqs["rank0"]
    assert judge("r", by_columns).as_dict() == judge("r", by_events).as_dict()


def test_a_run_the_archive_does_not_hold_is_a_clear_error(tmp_path):
    with pytest.raises(MetricbusError, match="not in the archive"):
        read_logged(tmp_path, "nope")
