"""Burrow-style consumer status from a window of lag samples (metricbus/_lag.py)."""

from metricbus.ops._lag import GroupSample, PartitionLag, evaluate


def sample(at, committed, end, lag_s=None, group="g"):
    part = PartitionLag("t", 0, committed, end, max(0, end - (committed or 0)), lag_s)
    return GroupSample(group, at, {("t", 0): part})


def test_caught_up_is_ok():
    s = evaluate([sample(0, 10, 10), sample(5, 10, 10)])
    assert (s.status, s.lag, s.reason) == ("OK", 0, "caught up")


def test_consuming_with_steady_lag_is_ok_and_reports_the_commit_rate():
    s = evaluate([sample(0, 10, 20, 1.0), sample(5, 20, 30, 1.0)])
    assert s.status == "OK" and s.lag == 10 and s.commit_rate == 2.0


def test_one_sample_measures_no_commit_rate_and_status_says_so():
    """From one sample a rate is unknown: `status` (one sample unless --window) shows '-', not a
    0.0 rec/s that reads as a stuck consumer beside 'consuming, 10 records behind'."""
    from metricbus.ops._status import _rate

    s = evaluate([sample(0, 10, 20, 1.0)])
    assert s.status == "OK" and s.commit_rate is None and _rate(s.commit_rate) == "-"
    assert _rate(evaluate([sample(0, 10, 20, 1.0), sample(5, 20, 30, 1.0)]).commit_rate) == "2.0"


def test_lag_growing_in_every_interval_is_warn():
    s = evaluate([sample(0, 10, 15, 1), sample(1, 12, 20, 1), sample(2, 14, 30, 1)])
    assert s.status == "WARN" and "grew" in s.reason


def test_lag_growing_then_shrinking_is_ok():
    s = evaluate([sample(0, 10, 15, 1), sample(1, 12, 20, 1), sample(2, 19, 21, 1)])
    assert s.status == "OK"


def test_offset_not_moving_with_recent_records_is_stall():
    s = evaluate([sample(0, 10, 12, 2.0), sample(3, 10, 14, 5.0)], stop_after_s=30)
    assert s.status == "STALL" and s.lag == 4


def test_records_waiting_longer_than_stop_after_is_stop():
    s = evaluate([sample(0, 10, 14, 40.0), sample(3, 10, 14, 43.0)], stop_after_s=30)
    assert s.status == "STOP" and "nothing consumes" in s.reason
    # one sample is enough to see a group that has not moved for that long
    assert evaluate([sample(0, 10, 14, 43.0)], stop_after_s=30).status == "STOP"


def test_committed_past_the_end_of_the_log_is_err():
    s = evaluate([sample(0, 50, 3), sample(3, 50, 3)])
    assert s.status == "ERR" and "re-created" in s.reason


def test_an_unreadable_group_is_err():
    s = evaluate([GroupSample("g", 0.0, {}, error="cannot read offsets: timeout")])
    assert s.status == "ERR" and "timeout" in s.reason


def test_group_status_is_its_worst_partition():
    ok = PartitionLag("t", 0, 5, 5, 0, None)
    stopped = PartitionLag("t", 1, 0, 9, 9, 100.0)
    s = evaluate([GroupSample("g", 0.0, {("t", 0): ok, ("t", 1): stopped})], stop_after_s=30)
    assert s.status == "STOP" and s.lag == 9
    assert [p["status"] for p in s.partitions] == ["OK", "STOP"]


def test_records_that_just_arrived_after_a_caught_up_sample_are_ok_not_stall():
    s = evaluate([sample(0, 10, 10), sample(5, 10, 11, 0.2)])
    assert s.status == "OK" and s.lag == 1


def test_a_consumer_that_stopped_after_catching_up_is_stop_once_records_wait_too_long():
    s = evaluate([sample(0, 10, 10), sample(5, 10, 11, 40.0)], stop_after_s=30)
    assert s.status == "STOP"


def _with(members, alive_s, *samples):
    for s in samples:
        s.members, s.alive_s = members, alive_s
    return list(samples)


def test_a_group_whose_consumer_is_alive_is_slow_with_its_lag_never_stop():
    """Alive and slow (W&B opening a run for a minute, its alive stamps still coming) is not
    "nothing consumes"."""
    one = evaluate(_with(2, 3.0, sample(0, 10, 14, 95.0)), stop_after_s=30)
    assert (
        one.status == "SLOW"
        and "consuming (alive 3s ago); 4 records behind, the oldest for 95s" in one.reason
    )
    moving = evaluate(_with(2, 3.0, sample(0, 10, 20, 95.0), sample(5, 20, 30, 90.0)), stop_after_s=30)
    assert moving.status == "OK" and moving.commit_rate == 2.0
    still = evaluate(_with(1, 4.0, sample(0, 10, 14, 95.0), sample(5, 10, 15, 100.0)), stop_after_s=30)
    assert still.status == "SLOW"  # no commit moved over the window, but it says it runs


def test_a_group_with_no_recent_alive_stamp_or_no_member_is_stop_once_its_records_waited_too_long():
    # a member the broker still lists (the embedded broker keeps one that died), no recent stamp
    assert evaluate(_with(1, 95.0, sample(0, 10, 14, 95.0)), stop_after_s=30).status == "STOP"
    gone = evaluate(_with(0, 2.0, sample(0, 10, 14, 95.0)), stop_after_s=30)
    assert gone.status == "STOP" and "the group has no member" in gone.reason
    assert evaluate(_with(0, None, sample(0, 10, 14, 5.0)), stop_after_s=30).status == "OK"  # young
    assert evaluate(_with(0, None, sample(0, 10, 10)), stop_after_s=30).status == "OK"  # nothing waits
