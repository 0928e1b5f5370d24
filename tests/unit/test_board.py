"""The dashboard's run board folds what the topics hold; no record can stop it."""

from metricbus.ops._board import MAX_RANKS, RunBoard
from metricbus.schemas import METRICS, RUN_STARTED, Settings, default_codec, encode_events, run_started

CODEC = default_codec()


def record(*events, run="r1"):
    return encode_events(
        CODEC, run, "p1", [(seq, 1_700_000_000_000 + seq, kind, body) for seq, kind, body in events]
    )


def metrics(step, rank=0):
    return {
        "step": step,
        "epoch": None,
        "rank": rank,
        "scalars": {"Train/Loss": 0.5},
        "samples": {},
        "labels": {},
    }


def test_a_config_nested_past_the_recursion_limit_is_left_out_and_the_run_still_folds(tmp_path):
    """json.loads raised RecursionError, which the board let out: its reader would reconnect and
    read the same record again, for ever."""
    board = RunBoard(Settings(data_dir=tmp_path))
    deep = {**run_started("proj", "n", {}), "config_json": '{"a": ' + "[" * 30_000 + "]" * 30_000 + "}"}
    board.take(board.settings.topics.events, record((0, RUN_STARTED, deep), (1, METRICS, metrics(3))))
    run = board.run("r1")
    assert run is not None and run["project"] == "proj" and run["config"] == {}
    assert run["series"]["Train/Loss"] == [[3, 0.5, 1_700_000_000_001]] and board.skipped == 0


def test_events_per_second_are_over_the_time_seen_not_a_whole_minute(tmp_path):
    """`status` reads the topics' last records: a run logging 100 events a second, seen for its
    last 10 s, read 16.7 events/s (divided by a minute); and so did any run younger than a minute."""
    board = RunBoard(Settings(data_dir=tmp_path))
    now_ms = 1_700_000_100_000
    events = [(i, METRICS, metrics(i)) for i in range(1000)]  # 100 a second over the last 10 s
    board.take(
        board.settings.topics.events,
        encode_events(CODEC, "r1", "p1", [(seq, now_ms - 10_000 + seq * 10, k, b) for seq, k, b in events]),
    )
    view = board.runs["r1"]
    assert view.events_per_s(now_ms) == 100.0  # from the first event, 10 s before now
    assert view.events_per_s(now_ms + 120_000) == 0.0  # nothing in the last minute
    later = now_ms + 49_000  # the first of them 59 s before: over those 59 s
    assert view.events_per_s(later) == round(1000 / 59, 3)


def test_a_stream_naming_endless_ranks_keeps_a_bounded_list(tmp_path):
    board = RunBoard(Settings(data_dir=tmp_path))
    events = [(i, METRICS, metrics(i, rank=i)) for i in range(MAX_RANKS + 100)]
    board.take(board.settings.topics.events, record(*events))
    run = board.run("r1")
    assert len(run["ranks"]) == MAX_RANKS and run["last_step"] == MAX_RANKS + 99  # steps still followed


def test_a_start_found_before_what_was_read_names_the_run_and_leaves_its_events_per_second(tmp_path):
    """`status` looks back for a long run's RunStarted: its project and name come from it, and its
    events/s stays over the records read (counted from the start, it read 3.1 for 19 a second)."""
    import time

    from metricbus.schemas import decode_events

    board = RunBoard(Settings(data_dir=tmp_path), light=True, tail=50)
    now_ms = int(time.time() * 1000)  # the runs table counts only the last minute's events
    tail = [(100 + i, now_ms - 10_000 + i * 10, METRICS, metrics(100 + i)) for i in range(1000)]
    board.take(board.settings.topics.events, encode_events(CODEC, "r1", "p1", tail))
    assert board.runs["r1"].events_per_s(now_ms) == 100.0 and board.runs["r1"].project == ""
    start = encode_events(CODEC, "r1", "p1", [(0, now_ms - 50_000, RUN_STARTED, run_started("proj", "long"))])
    board.fold_starts(decode_events(CODEC, start))
    view = board.runs["r1"]
    assert (view.project, view.name, view.started_ms) == ("proj", "long", now_ms - 50_000)
    assert view.events_per_s(now_ms) == 100.0 and view.events == 1000


def test_a_start_found_later_says_how_many_ranks_must_finish(tmp_path):
    """Read without its RunStarted, a run of two ranks looked finished when rank 0 was."""
    from metricbus.schemas import RUN_FINISHED, decode_events

    board = RunBoard(Settings(data_dir=tmp_path), light=True, tail=50)
    board.take(
        board.settings.topics.events,
        record((7, METRICS, metrics(3)), (8, RUN_FINISHED, {"status": "finished", "summary": {}})),
    )
    assert board.runs["r1"].finished == "finished"
    start = run_started("proj", "two-ranks", world_size=2)
    board.fold_starts(decode_events(CODEC, record((0, RUN_STARTED, start))))
    view = board.runs["r1"]
    assert (view.world_size, view.finished, view.project) == (2, None, "proj")
