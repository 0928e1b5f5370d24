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


def test_a_stream_naming_endless_ranks_keeps_a_bounded_list(tmp_path):
    board = RunBoard(Settings(data_dir=tmp_path))
    events = [(i, METRICS, metrics(i, rank=i)) for i in range(MAX_RANKS + 100)]
    board.take(board.settings.topics.events, record(*events))
    run = board.run("r1")
    assert len(run["ranks"]) == MAX_RANKS and run["last_step"] == MAX_RANKS + 99  # steps still followed
