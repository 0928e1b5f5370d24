import random

from metricbus.schemas import Deduper, SeqSet


def expand(intervals):
    return {x for a, b in intervals for x in range(a, b + 1)}


def test_seqset_matches_a_python_set_under_random_reordering_and_redelivery():
    rng = random.Random(7)
    for _ in range(300):
        seqs = [rng.randrange(80) for _ in range(120)]
        s, seen = SeqSet(), set()
        for q in seqs:
            assert s.add(q) == (q not in seen)
            seen.add(q)
        assert expand(s.intervals()) == seen
        intervals = s.intervals()
        assert all(b + 1 < c for (_, b), (c, _) in zip(intervals, intervals[1:]))  # disjoint, not adjacent


def test_loading_durable_intervals_merges_them():
    s = SeqSet([(10, 20), (0, 4), (5, 9), (30, 31)])
    assert s.intervals() == [(0, 20), (30, 31)]
    assert s.missing() == 9  # 21..29
    assert not s.add(15) and s.add(21)


def test_deduper_counts_duplicates_and_reports_gaps():
    d = Deduper()
    d.load("p1", [(0, 99)])
    assert not d.is_new("p1", 50)
    assert d.is_new("p1", 100)
    assert d.is_new("p2", 0) and d.is_new("p2", 3)
    assert d.duplicates == 1
    assert d.gaps() == {"p2": 2}


def test_a_run_of_seqs_is_taken_whole_or_not_at_all():
    d = Deduper()
    assert d.add_run("p", [5, 6, 7])
    assert not d.add_run("p", [5, 6, 7]) and not d.add_run("p", [7, 8])  # seen, in whole or part
    assert not d.add_run("p", [9, 11]) and not d.add_run("p", []) and not d.add_run("p", [10, 9])
    assert [s for s in range(4, 12) if d.is_new("p", s)] == [4, 8, 9, 10, 11]  # nothing else recorded
