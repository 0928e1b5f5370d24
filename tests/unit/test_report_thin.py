"""The report's charts keep at most about MAX_LINE_POINTS points a line (a 200,000-step run made a
93 MB page), and what a long run's chart must still show survives: a spike, a NaN, both ends."""

import math

from metricbus.diagnostics._report import MAX_LINE_POINTS, thin


def line(n, value=lambda s: 1.0 / (s + 1)):
    return [(s, value(s), 1_700_000_000_000 + s) for s in range(n)]


def test_a_short_line_is_kept_whole():
    points = line(MAX_LINE_POINTS)
    assert thin(points) is points


def test_a_long_line_keeps_its_ends_its_spike_and_its_nan_in_order():
    def value(s):
        if s == 123_457:
            return 50.0  # one spike
        if 150_000 <= s < 150_003:
            return None  # a NaN burst (the report's None)
        return 1.0 / (s + 1)

    points = line(200_000, value)
    kept = thin(points)
    assert len(kept) <= MAX_LINE_POINTS
    assert kept[0] == points[0] and kept[-1] == points[-1]
    assert points[123_457] in kept and points[150_000] in kept
    assert [p[0] for p in kept] == sorted({p[0] for p in kept})  # in order, none twice
    assert max(v for _, v, _ in kept if v is not None) == 50.0


def test_each_stretch_keeps_its_lowest_and_highest():
    points = line(10_000, lambda s: math.sin(s / 7.0))
    kept = thin(points, limit=300)
    assert len(kept) <= 300
    values = [v for _, v, _ in kept]
    assert max(values) > 0.999 and min(values) < -0.999  # the envelope, not a sample of it
