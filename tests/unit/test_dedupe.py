import random

import pytest

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


def test_a_repeated_record_passes_and_one_with_the_same_events_but_other_bytes_is_forged():
    from metricbus.schemas import ForgedRepeatError, RecordDigests

    digests = RecordDigests(kept=2)
    digests.check(b"genuine", ("p", 0, 9, 10))
    digests.check(b"genuine", ("p", 0, 9, 10))  # a resend: the same bytes
    digests.check(b"other producer", ("q", 0, 9, 10))
    with pytest.raises(ForgedRepeatError, match="producer 'p' seqs 0-9: a record with these events"):
        digests.check(b"forged", ("p", 0, 9, 10))
    with pytest.raises(ForgedRepeatError):
        digests.check(b"genuine", ("p", 0, 8, 9))  # the same start, other boundaries
    assert digests.forged == 2
    digests.check(b"newer", ("p", 10, 19, 10))
    digests.check(b"newest", ("p", 20, 29, 10))  # past kept=2: the first record's digest is gone
    digests.check(b"forged", ("p", 0, 9, 10))  # so this is left to the seqs (a duplicate)
    digests.check(b"anything", None)  # a record of several producers: not checked
    assert digests.forged == 2


def test_a_records_span_is_its_one_producers_first_and_last_seq():
    from metricbus.schemas import (
        METRICS,
        RUN_STARTED,
        decode_record,
        default_codec,
        encode_events,
        record_span,
        run_started,
    )

    codec = default_codec()
    body = {"step": 0, "epoch": None, "rank": 0, "scalars": {"x": 1.0}, "samples": {}}
    rows = [(5, 1, RUN_STARTED, run_started("p", "n"))] + [
        (6 + i, 2, METRICS, {**body, "step": i}) for i in range(3)
    ]
    assert record_span(*decode_record(codec, encode_events(codec, "r", "prod", rows))) == ("prod", 5, 8, 4)


def test_instances_of_one_group_saving_one_ledger_keep_what_each_other_saved(tmp_path):
    """Two alert consumers of one group in one data dir save one ledger: neither drops what the
    other delivered."""
    from metricbus.schemas import Ledger

    path = tmp_path / "alerts" / "metricbus.alerts.console.json"
    first, second = Ledger(path).load(), Ledger(path).load()
    first.add("run-a", 0)
    second.add("run-b", 0)
    first.save_shared()
    second.save_shared()
    saved = Ledger(path).load()
    assert saved.has("run-a", 0) and saved.has("run-b", 0)
    handed = Ledger(path).load()  # run-a's partition moved to an instance started before
    assert handed.has("run-a", 0)
