"""The dashboard's run health is computed again only when stale: a long run's costs seconds."""

from metricbus.ops._web import HEALTH_EVERY_S, health_stale


def test_a_cheap_health_is_fresh_for_the_minimum_interval():
    assert not health_stale(100.0, 0.05, 100.0 + HEALTH_EVERY_S - 0.1)
    assert health_stale(100.0, 0.05, 100.0 + HEALTH_EVERY_S)


def test_a_costly_health_waits_ten_times_what_it_took():
    """An open run page asks every 15 s; a 200,000-event run's health took ~5 s and ~0.9 GB."""
    assert not health_stale(100.0, 5.0, 149.0)
    assert health_stale(100.0, 5.0, 150.0)
