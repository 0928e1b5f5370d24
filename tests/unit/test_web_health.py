"""The dashboard's run health is computed again only when stale: a long run's costs seconds."""

from metricbus.ops._web import HEALTH_EVERY_S, health_stale


def test_a_cheap_health_is_fresh_for_the_minimum_interval():
    assert not health_stale(100.0, 0.05, 100.0 + HEALTH_EVERY_S - 0.1)
    assert health_stale(100.0, 0.05, 100.0 + HEALTH_EVERY_S)


def test_a_costly_health_waits_ten_times_what_it_took():
    """An open run page asks every 15 s; a 200,000-event run's health took ~5 s and ~0.9 GB."""
    assert not health_stale(100.0, 5.0, 149.0)
    assert health_stale(100.0, 5.0, 150.0)


def test_a_stale_health_still_answers_while_its_runs_archive_files_are_unchanged():
    """A finished run's files do not change: its health is answered from memory (a warm
    `metricbus health` in a third of a second) until they do, or HEALTH_UNCHANGED_KEEP_S."""
    from metricbus.ops._web import HEALTH_UNCHANGED_KEEP_S, health_fresh

    asked: list[bool] = []

    def unchanged(answer: bool):
        return lambda: asked.append(answer) or answer

    assert health_fresh(100.0, 0.5, 101.0, unchanged(False)) and asked == []  # not stale: not asked
    assert health_fresh(100.0, 0.5, 160.0, unchanged(True)) and asked == [True]
    assert not health_fresh(100.0, 0.5, 160.0, unchanged(False))  # a file changed: judged again
    assert not health_fresh(100.0, 0.5, 100.0 + HEALTH_UNCHANGED_KEEP_S, unchanged(True))
