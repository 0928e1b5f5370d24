"""A run's series as health, compare and the report read them: each series' points in typed
arrays (24 bytes a point, not a ~100-byte tuple), read back as the (step, value, ts_ms) tuples
they were given, labelled series beside the plain ones."""

import math

from metricbus.diagnostics._series import Points, labelled, on_axis, scalars
from metricbus.schemas import METRICS, RUN_STARTED, Event, run_started


def test_points_read_back_as_the_tuples_they_were_given():
    given = [(0, 1.5, 1_700_000_000_000), (1, math.nan, 1_700_000_000_100), (2**40, -0.0, 2**50)]
    points = Points(given)
    assert len(points) == 3 and repr(list(points)) == repr(given)  # repr: NaN == NaN
    assert math.isnan(points[1][1]) and math.copysign(1, points[-1][1]) == -1  # NaN and -0.0 kept
    assert points[-1] == given[-1] and repr(points[1:]) == repr(given[1:]) and points[:0] == []
    assert all(type(s) is int and type(v) is float and type(t) is int for s, v, t in points)
    assert not Points() and repr(Points(given[:1])) == "Points([(0, 1.5, 1700000000000)])"


def test_scalars_keeps_each_series_in_event_order_with_its_labelled_series():
    def event(seq, step, values, labels=None):
        body = {
            "step": step,
            "epoch": None,
            "rank": 0,
            "scalars": values,
            "samples": {},
            "labels": labels or {},
        }
        return Event("r", "p", seq, 1000 + seq, METRICS, body, b"")

    events = [
        Event("r", "p", 0, 1000, RUN_STARTED, run_started("proj", "r"), b""),
        event(1, 0, {"loss": 2.0, "acc": 0.5}),
        event(2, 1, {"loss": 1.0}, {"task": "a"}),
        event(3, 2, {"loss": 0.5}, {"task": "b"}),
    ]
    series = scalars(events)
    assert {n: list(p) for n, p in series.items()} == {
        "loss": [(0, 2.0, 1001), (1, 1.0, 1002), (2, 0.5, 1003)],
        "acc": [(0, 0.5, 1001)],
        labelled("loss", "task", "a"): [(1, 1.0, 1002)],
        labelled("loss", "task", "b"): [(2, 0.5, 1003)],
    }
    assert on_axis(series)["loss"] == [(0.0, 2.0), (1.0, 1.0), (2.0, 0.5)]
    assert on_axis(series, "time")["loss"] == [(0.0, 2.0), (0.001, 1.0), (0.002, 0.5)]
