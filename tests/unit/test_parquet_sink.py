import duckdb
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from metricbus.schemas import (
    HISTOGRAM,
    METRICS,
    RUN_STARTED,
    TABLE,
    Event,
    SeqSet,
    default_codec,
    run_started,
)
from metricbus.sinks import ParquetArchive, iter_events, read_events, read_table, summary, tidy

FP = default_codec().newest("EventBatch").fingerprint


def ev(seq, kind, body, run="run-1", producer="p1"):
    return Event(run, producer, seq, 1_700_000_000_000 + seq, kind, body, FP)


def started(project="grpo/gemma"):
    return ev(0, RUN_STARTED, run_started(project, "n"))


def metric(seq, step, scalars, samples=None):
    return ev(
        seq,
        METRICS,
        {"step": step, "epoch": step // 10, "rank": 0, "scalars": scalars, "samples": samples or {}},
    )


@pytest.fixture
def archive(tmp_path):
    sink = ParquetArchive(tmp_path / "archive")
    sink.open()
    return sink


def test_rows_read_back_with_pyarrow_and_duckdb(archive):
    events = [started()] + [
        metric(i + 1, i, {"Train/Loss": 1.0 / (i + 1), "Train/AvgReward": i * 0.5}) for i in range(100)
    ]
    archive.write(events)
    archive.flush()
    files = list(archive.archive_dir.glob("project=*/run=run-1/*.parquet"))
    assert len(files) == 1 and files[0].parent.parent.name == "project=grpo%2Fgemma"
    table = tidy(archive.archive_dir, "run-1")
    assert table.num_rows == 200
    rows = duckdb.sql(
        f"SELECT step, value FROM read_parquet('{archive.archive_dir}/**/*.parquet', hive_partitioning=true) "
        "WHERE run='run-1' AND name='Train/Loss' ORDER BY step"
    ).fetchall()
    assert rows == [(i, 1.0 / (i + 1)) for i in range(100)]


def test_non_scalar_events_keep_their_payload_losslessly(archive):
    hist = ev(1, HISTOGRAM, {"step": 3, "name": "h", "edges": [0.0, 1.0], "counts": [5], "rank": 0})
    table = ev(2, TABLE, {"step": 3, "name": "t", "columns": ["c"], "rows": [["x"]]})
    samples = metric(3, 3, {}, {"rewards/format_exact": [0.0, 1.0]})
    archive.write([started(), hist, table, samples])
    archive.flush()
    t = read_table(archive.archive_dir, "run-1")
    by_seq = {row["seq"]: row for row in t.to_pylist()}
    for original in (hist, table):
        _, batch = default_codec().decode(by_seq[original.seq]["payload"])
        assert batch["events"][0]["body"] == (original.kind, original.body)
    assert by_seq[3]["samples"] == [0.0, 1.0] and by_seq[3]["name"] == "rewards/format_exact"


def test_footer_records_held_seqs_and_recover_reads_them(archive, tmp_path):
    archive.write([started()] + [metric(i, i, {"x": 1.0}) for i in range(1, 50)])
    archive.flush()
    archive.write(
        [
            metric(
                i,
                i,
                {"x": 1.0},
            )
            for i in range(60, 70)
        ]
    )
    archive.flush()
    fresh = ParquetArchive(archive.archive_dir)
    fresh.open()
    assert sorted(fresh.recover("run-1")["p1"]) == [(0, 49), (60, 69)]
    assert fresh.recover("no-such-run") == {}


def test_interrupted_flush_leftovers_are_removed_and_never_read(archive):
    archive.write([started(), metric(1, 0, {"x": 1.0})])
    archive.flush()
    run_dir = next(archive.archive_dir.glob("project=*/run=run-1"))
    leftover = run_dir / ".part-crashed.parquet.tmp"
    leftover.write_bytes(b"PAR1 half a file")
    assert tidy(archive.archive_dir, "run-1").num_rows == 1  # readers never see it
    ParquetArchive(archive.archive_dir).open()
    assert not leftover.exists()


def test_events_of_an_unknown_run_go_under_the_unknown_project(archive):
    archive.write([metric(5, 5, {"x": 2.0})])
    archive.flush()
    assert list(archive.archive_dir.glob("project=_unknown/run=run-1/*.parquet"))


def test_summary_and_compression_metadata(archive):
    archive.write([started()] + [metric(i + 1, i, {"Epoch/AvgReward": float(i)}) for i in range(10)])
    archive.flush()
    (row,) = summary(archive.archive_dir, "run-1")
    assert row == {
        "name": "Epoch/AvgReward",
        "count": 10,
        "first_step": 0,
        "last_step": 9,
        "first": 0.0,
        "last": 9.0,
        "min": 0.0,
        "max": 9.0,
        "mean": 4.5,
    }
    path = next(archive.archive_dir.glob("project=*/run=*/*.parquet"))
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "ZSTD"


def test_small_flush_files_are_compacted_and_a_finished_run_ends_in_one_file(tmp_path):
    sink = ParquetArchive(tmp_path / "archive", compact_after=4)
    sink.open()
    sink.write([started()])
    sink.flush()
    for i in range(1, 10):
        sink.write([metric(i, i, {"x": float(i)})])
        sink.flush()
    run_dir = next(sink.archive_dir.glob("project=*/run=run-1"))
    assert sink.compactions == 2  # after the 4th and the 8th flush file
    assert len(list(run_dir.glob("compacted-*.parquet"))) == 2
    sink.write([ev(10, "metricbus.RunFinished", {"status": "finished", "summary": {}})])
    sink.flush()
    (only,) = run_dir.glob("*.parquet")
    assert only.name.startswith("compacted-")
    table = read_table(sink.archive_dir, "run-1")
    assert table["seq"].to_pylist() == list(range(11))
    assert ParquetArchive(sink.archive_dir).recover("run-1") == {"p1": [(0, 10)]}


def test_a_compaction_holds_a_bounded_number_of_rows_and_files_stay_under_the_cap(tmp_path, monkeypatch):
    """A live run's flush files are merged into files of at most max_rows_per_file rows, each
    written a few sorted row groups at a time (COMPACT_ROWS): memory stays bounded whatever
    the run's size (one sorted table of a soak's 9.3M rows took 4.1 GB)."""
    import metricbus.sinks.parquet as parquet

    monkeypatch.setattr(parquet, "COMPACT_ROWS", 5)
    sink = ParquetArchive(tmp_path / "archive", compact_after=8, max_rows_per_file=25)
    sink.open()
    sink.write([started()])
    for i in range(1, 9):  # 8 flush files of 10 rows (the first with RunStarted's row too)
        sink.write([metric(i, i, {f"m{9 - j}": float(i * 10 + j) for j in range(10)})])
        sink.flush()
    run_dir = next(sink.archive_dir.glob("project=*/run=run-1"))
    merged = sorted(run_dir.glob("compacted-*.parquet"))
    assert not list(run_dir.glob("part-*.parquet")) and sink.compactions == len(merged) == 4
    for path in merged:  # two files each, each file a row group
        meta = pq.read_metadata(path)
        assert meta.num_rows <= 25 and meta.num_row_groups == 2
        for g in range(meta.num_row_groups):  # each row group sorted: series together
            names = pq.ParquetFile(path).read_row_group(g)["name"].to_pylist()
            assert names == sorted(names, key=lambda n: (n is None, n))
    table = read_table(sink.archive_dir, "run-1")
    assert table["seq"].to_pylist() == [0] + [i for i in range(1, 9) for _ in range(10)]
    assert sorted(table.filter(pc.field("seq") == 3)["value"].to_pylist()) == [30.0 + j for j in range(10)]
    held = SeqSet()
    held.merge(ParquetArchive(sink.archive_dir).recover("run-1")["p1"])  # the footers, file by file
    assert held.intervals() == [(0, 8)]


def test_an_interrupted_compaction_is_finished_at_open(tmp_path):
    sink = ParquetArchive(tmp_path / "archive", compact_after=1000)
    sink.open()
    sink.write([started()])
    sink.flush()
    sink.write([metric(1, 1, {"x": 1.0})])
    sink.flush()
    run_dir = next(sink.archive_dir.glob("project=*/run=run-1"))
    parts = sorted(run_dir.glob("part-*.parquet"))
    copies = {p: p.read_bytes() for p in parts}
    sink._compact(run_dir, parts)  # merged file renamed in ...
    for path, data in copies.items():  # ... and a crash before the old files were deleted
        path.write_bytes(data)
    # in the window in which both are on disk, readers skip the files the merged one replaces
    assert tidy(sink.archive_dir, "run-1").num_rows == 1
    ParquetArchive(sink.archive_dir).open()
    assert [p.name.split("-")[0] for p in run_dir.glob("*.parquet")] == ["compacted"]
    assert tidy(sink.archive_dir, "run-1").num_rows == 1


def test_a_reader_lists_again_when_a_compaction_deleted_a_file_under_it(archive, monkeypatch):
    import pyarrow.dataset as ds

    archive.write([started(), metric(1, 1, {"x": 1.0})])
    archive.flush()
    real, calls = ds.dataset, []

    def racing(paths, **kw):
        calls.append(paths)
        if len(calls) == 1:
            raise FileNotFoundError(paths[0])  # as pyarrow does when a listed file is gone
        return real(paths, **kw)

    monkeypatch.setattr(ds, "dataset", racing)
    assert tidy(archive.archive_dir, "run-1").num_rows == 1 and len(calls) == 2


def test_export_writes_json_lines_and_parquet(archive, tmp_path, capsys):
    import json

    from metricbus.cli import main

    losses = [0.0, 0.25, float("nan"), float("inf")]
    archive.write([started()] + [metric(i + 1, i, {"Train/Loss": loss}) for i, loss in enumerate(losses)])
    archive.flush()
    data_dir = str(archive.archive_dir.parent)
    assert main(["--data-dir", data_dir, "export", "--run", "run-1", "--format", "json"]) == 0
    out = capsys.readouterr().out
    lines = [json.loads(line, parse_constant=pytest.fail) for line in out.splitlines()]  # strict JSON
    assert [(r["step"], r["name"], r["value"]) for r in lines] == [
        (0, "Train/Loss", 0.0),
        (1, "Train/Loss", 0.25),
        (2, "Train/Loss", None),  # NaN and inf: null, as pandas writes them
        (3, "Train/Loss", None),
    ]
    (tmp_path / "loss.jsonl").write_text(out)
    assert duckdb.sql(
        f"SELECT step, value FROM read_json('{tmp_path / 'loss.jsonl'}') ORDER BY step"
    ).fetchall() == [
        (0, 0.0),
        (1, 0.25),
        (2, None),
        (3, None),
    ]
    assert lines[0]["run"] == "run-1" and lines[0]["wall_time"].startswith("2023-11-14T22:13:20")
    out = tmp_path / "loss.parquet"
    assert (
        main(["--data-dir", data_dir, "export", "--run", "run-1", "--format", "parquet", "--out", str(out)])
        == 0
    )
    assert pq.read_table(out).column_names == ["run", "step", "name", "value", "wall_time"]
    assert main(["--data-dir", data_dir, "export", "--run", "run-1", "--format", "parquet"]) == 2


def test_export_carries_labels_when_the_run_has_them(archive, tmp_path, capsys):
    import json

    from metricbus.cli import main

    labelled = metric(2, 1, {"episode/reward": 9.5})
    labelled.body["labels"] = {"task": "logo_a", "termination": "time_limit"}
    archive.write([started(), metric(1, 0, {"Train/Loss": 0.5}), labelled])
    archive.flush()
    data_dir = str(archive.archive_dir.parent)
    assert main(["--data-dir", data_dir, "export", "--run", "run-1", "--format", "json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["name"], r["labels"]) for r in rows] == [
        ("Train/Loss", {}),
        ("episode/reward", {"task": "logo_a", "termination": "time_limit"}),
    ]
    out = tmp_path / "rows.csv"
    assert main(["--data-dir", data_dir, "export", "--run", "run-1", "--out", str(out)]) == 0
    import pyarrow.csv as pacsv

    csv = pacsv.read_csv(out).to_pylist()
    assert not csv[0]["labels"] and json.loads(csv[1]["labels"]) == {
        "task": "logo_a",
        "termination": "time_limit",
    }
    out = tmp_path / "rows.parquet"
    assert (
        main(["--data-dir", data_dir, "export", "--run", "run-1", "--format", "parquet", "--out", str(out)])
        == 0
    )
    assert pq.read_table(out).to_pylist()[1]["labels"] == [("task", "logo_a"), ("termination", "time_limit")]


def test_columns_are_archived_exactly_as_their_events(tmp_path):
    """A record's columns (``write_columns``, no object per event) give the same table as the
    same events written one by one: uniform rows, rows with other names, no epoch, NaN."""
    from metricbus.schemas import SCALARS, decode_record, encode_events

    codec = default_codec()
    rows = [(i, None if i % 3 else i // 3, 0, {"loss": 1.0 / (i + 1), "lr": 1e-3}, None) for i in range(40)]
    rows += [(40, 4, 1, {"loss": float("nan")}, None), (41, 4, 1, {"kl": 0.5, "loss": -0.0}, None)]
    rows += [(42, 4, 1, {}, None)]  # every name dropped by the producer (not a str): still one row
    events = [(i + 1, 1_700_000_000_000 + i, SCALARS, row) for i, row in enumerate(rows)]
    tables = []
    for how in ("columns", "events"):
        sink = ParquetArchive(tmp_path / how)
        sink.open()
        sink.write([started()])
        for part in (events[:40], events[40:]):  # one uniform record, one that is not
            logged, columns = decode_record(codec, encode_events(codec, "run-1", "p1", part))
            assert not logged and columns is not None
            sink.write_columns(columns) if how == "columns" else sink.write(columns.events())
        assert sink.pending() == 85  # rows: RunStarted, 40 x 2 scalars, then 1, 2 and 1 (no scalar: one row)
        sink.flush()
        tables.append(read_table(sink.archive_dir, "run-1"))
    assert tables[0].num_rows == 1 + 80 + 3 + 1
    assert repr(tables[0].to_pylist()) == repr(tables[1].to_pylist())  # by text: NaN != NaN
    assert (
        pq.read_metadata(next((tmp_path / "columns").rglob("*.parquet"))).metadata
        == pq.read_metadata(next((tmp_path / "events").rglob("*.parquet"))).metadata
    )  # the seqs held, in the footer, too


def test_the_runtime_takes_columns_whole_only_when_none_was_seen(archive):
    """One check per record; a record seen in part (re-delivered across a crash) goes event by
    event, so each event is archived once."""
    from metricbus.schemas import SCALARS, decode_record, encode_events
    from metricbus.sinks import Feeder

    codec = default_codec()

    def record(seqs):
        events = [(s, 1_700_000_000_000 + s, SCALARS, (s, None, 0, {"loss": float(s)}, None)) for s in seqs]
        return decode_record(codec, encode_events(codec, "run-1", "p1", events))[1]

    feeder = Feeder(archive, codec)
    assert feeder.fresh_columns(record(range(1, 11)))
    assert not feeder.fresh_columns(record(range(1, 11)))  # again: nothing changes
    assert not feeder.fresh_columns(record(range(6, 16)))  # in part
    assert [e.seq for e in feeder.fresh(record(range(6, 16)).events())] == list(range(11, 16))
    assert not feeder.fresh_columns(record([20, 22, 21]))  # not one run of seqs
    assert [e.seq for e in feeder.fresh(record([20, 22, 21]).events())] == [20, 22, 21]


def test_a_run_read_in_chunks_is_the_run_read_whole_with_every_event_whole(archive):
    """A replay reads a long run a chunk at a time (its rows as Python objects took ~14 KB per
    ten-scalar event when read whole). Chunks of a few rows cut Metrics events of several rows:
    each must still come back whole, once, in order."""
    hist = ev(2, HISTOGRAM, {"step": 3, "name": "h", "edges": [0.0, 1.0], "counts": [5], "rank": 0})
    events = [started(), metric(1, 0, {"a": 1.0, "b": float("nan"), "c": -0.0})]
    events += [hist, metric(3, 1, {"a": 2.0}, {"s": [1.0, 2.0]})]
    events += [metric(seq, seq, {f"m{j}": seq + j / 10 for j in range(seq % 4 + 1)}) for seq in range(4, 40)]
    archive.write(events)
    archive.flush()
    whole = read_events(archive.archive_dir, "run-1")
    assert [(e.seq, e.kind) for e in whole] == [(e.seq, e.kind) for e in events]
    # names and fingerprints are read dictionary-encoded: each comes back as written
    assert [(e.fingerprint, repr(e.body.get("scalars"))) for e in whole] == [
        (e.fingerprint, repr(e.body.get("scalars"))) for e in events
    ]
    expected = [(e.seq, e.ts_ms, e.fingerprint, repr(e.body)) for e in whole]  # repr: NaN, -0.0
    for rows in (1, 2, 3, 7, 1000):
        seen, chunks = [], 0
        for chunk in iter_events(archive.archive_dir, "run-1", rows=rows):
            assert chunk
            chunks += 1
            seen += [(e.seq, e.ts_ms, e.fingerprint, repr(e.body)) for e in chunk]  # as handed out
        assert seen == expected and (rows > 7 or chunks > 10)
    only = [
        e
        for chunk in iter_events(archive.archive_dir, "run-1", kinds={HISTOGRAM, RUN_STARTED})
        for e in chunk
    ]
    assert [(e.seq, e.kind, e.body) for e in only] == [(e.seq, e.kind, e.body) for e in (events[0], hist)]


def test_export_into_a_reader_that_stops_early_ends_quietly(archive):
    """`metricbus export ... | head`: no traceback when the reader closes the pipe."""
    import subprocess
    import sys

    archive.write(
        [started()] + [metric(i + 1, i, {f"m{j}": float(j) for j in range(20)}) for i in range(2000)]
    )
    archive.flush()
    data_dir = str(archive.archive_dir.parent)
    command = [sys.executable, "-m", "metricbus", "--data-dir", data_dir, "export", "--run", "run-1"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = proc.stdout.readline()  # type: ignore[union-attr]
    proc.stdout.close()  # type: ignore[union-attr]  # as `head -1` does: 40,000 rows are far more than a pipe holds
    _, err = proc.communicate(timeout=60)
    assert head.startswith(b'"run","step","name","value"')
    assert proc.returncode == 1 and b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()


def _files_out_of_order(archive):
    """A run of two producers over five files, listed in no seq order, one event archived twice
    (two files whose seqs interleave), and the stream's derived series beside them."""
    from metricbus.schemas import DERIVED_PRODUCER

    def m(seq, producer="p1", scalars=None):
        body = {"step": seq, "epoch": 0, "rank": 0, "scalars": scalars or {"a": seq * 1.0, "b": -seq * 1.0}}
        return ev(seq, METRICS, {**body, "samples": {}, "labels": {}}, producer=producer)

    batches = [
        [m(s) for s in range(40, 60)] + [m(s, "p0") for s in range(0, 5)],
        [started()] + [m(s) for s in range(1, 20)],
        [m(s) for s in range(20, 41)],  # seq 40 again: archived twice
        [m(s, DERIVED_PRODUCER, {"a_recent_mean": s * 1.0}) for s in range(0, 6)],
        [m(s, "p0") for s in range(5, 9)],
    ]
    for batch in batches:
        archive.write(batch)
        archive.flush()
    return [e for b in batches for e in b]


def test_a_run_read_a_file_at_a_time_comes_in_producer_and_seq_order_whatever_the_files_order(
    archive, monkeypatch
):
    """iter_events reads one file's rows of one producer at a time (a whole run's Arrow table
    was 150 MB for 200,000 steps); files whose seqs interleave are read together. The order and
    every event's body are the whole-table read's, which a run of too many files still gets."""
    import metricbus.sinks._archive as read
    from metricbus.schemas import DERIVED_PRODUCER

    events = _files_out_of_order(archive)
    assert len(list(archive.archive_dir.glob("project=*/run=run-1/*.parquet"))) == 5
    # each event once (seq 40's two copies' rows read as one event, as a whole-table read did)
    want = sorted({(e.producer_id, e.seq): e for e in events}.values(), key=lambda e: (e.producer_id, e.seq))
    for derived in (False, True):
        expected = [
            (e.producer_id, e.seq, e.body) for e in want if derived or e.producer_id != DERIVED_PRODUCER
        ]
        for rows in (3, 1 << 15):
            got = [
                (e.producer_id, e.seq, e.body)
                for c in iter_events(archive.archive_dir, "run-1", derived=derived, rows=rows)
                for e in c
            ]
            assert got == expected
        monkeypatch.setattr(read, "MAX_OPEN_FILES", 2)  # read whole: the same
        got = [
            (e.producer_id, e.seq, e.body)
            for c in iter_events(archive.archive_dir, "run-1", derived=derived)
            for e in c
        ]
        assert got == expected
        monkeypatch.undo()
    since = [e.seq for c in iter_events(archive.archive_dir, "run-1", since={"p1": 45}) for e in c]
    assert since == list(range(9)) + list(range(45, 60))


def test_a_run_read_while_a_compaction_deletes_its_files_still_reads_every_event(archive):
    """A live sink compacts a run's small files while a report or a replay reads it: the reader
    opened every file first, so a file deleted under it still reads."""
    events = _files_out_of_order(archive)
    chunks = iter_events(archive.archive_dir, "run-1", derived=True, rows=4)
    got = [e.seq for e in next(chunks)]
    for path in archive.archive_dir.glob("project=*/run=run-1/*.parquet"):
        path.unlink()
    got += [e.seq for c in chunks for e in c]
    assert sorted(got) == sorted({(e.producer_id, e.seq): e.seq for e in events}.values())


def test_a_run_whose_directory_refuses_its_flush_goes_to_the_fallback_and_the_others_go_on(archive):
    """A file where one run's directory goes (a stray copy; a directory of another user fails the
    same way) made every flush fail: the sink retried for ever and no run was archived again."""
    other = [
        ev(0, RUN_STARTED, run_started("grpo/gemma", "n"), run="run-2"),
        ev(1, METRICS, {**metric(1, 1, {"x": 9.0}).body}, run="run-2"),
    ]
    archive.write([started(), metric(1, 1, {"x": 1.0}), *other])
    own = archive.archive_dir / "project=grpo%2Fgemma" / "run=run-1"
    own.parent.mkdir(parents=True)
    own.write_bytes(b"")  # in the way
    archive.flush()  # does not raise
    assert [e.seq for e in read_events(archive.archive_dir, "run-2")] == [0, 1]  # the others go on
    assert list(archive.archive_dir.glob("project=_fallback/run=run-1/part-*.parquet"))
    assert [e.seq for e in read_events(archive.archive_dir, "run-1")] == [0, 1]
    assert archive.fallbacks == 1

    own.unlink()  # mended: the next flush goes to the run's own directory again
    archive.write([metric(2, 2, {"x": 2.0})])
    archive.flush()
    assert archive.fallbacks == 1 and list(own.glob("part-*.parquet"))
    events = read_events(archive.archive_dir, "run-1")  # both directories, one run
    assert [(e.seq, e.body.get("scalars")) for e in events][1:] == [(1, {"x": 1.0}), (2, {"x": 2.0})]
    restarted = ParquetArchive(archive.archive_dir)
    assert dict(restarted.recover("run-1")) == {"p1": [(0, 1), (2, 2)]}  # a restart drops them all
    restarted.write([metric(3, 3, {"x": 3.0})])
    restarted.flush()
    assert len(list(own.glob("part-*.parquet"))) == 2  # its own directory, not the fallback


def test_a_failing_archive_is_retried_with_nothing_lost_not_sent_to_the_fallback(archive, monkeypatch):
    archive.write([started(), metric(1, 1, {"x": 1.0})])

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(archive, "_write_parquet", full)
    with pytest.raises(OSError, match="No space"):
        archive.flush()
    assert archive.pending() == 2 and not list(archive.archive_dir.glob("project=_fallback/*"))
    monkeypatch.undo()
    archive.flush()
    assert [e.seq for e in read_events(archive.archive_dir, "run-1")] == [0, 1]


def test_derived_points_that_overtake_their_runs_start_wait_for_it_and_hold_back_the_commit(tmp_path):
    """They come from another topic: written before the RunStarted, they went under _unknown."""
    import asyncio
    import types

    from aiokafka import TopicPartition

    from metricbus.schemas import Settings, encode_aggregates, encode_events
    from metricbus.sinks import SinkRunner

    codec = default_codec()
    settings = Settings(data_dir=tmp_path)
    runner = SinkRunner(
        ParquetArchive(settings.archive_dir),
        settings,
        topics=[settings.topics.events, settings.topics.aggregates],
    )
    runner.open()
    point = {
        "name": "x_ema",
        "source": "x",
        "kind": "ema",
        "step": 1,
        "epoch": None,
        "value": 0.5,
        "ts_ms": 1,
    }
    derived = encode_aggregates(codec, "run-1", [point], [], [], first_seq=0, closes_run=False)
    start = encode_events(
        codec, "run-1", "p1", [(0, 1_700_000_000_000, RUN_STARTED, run_started("grpo", "n"))]
    )

    def process(topic, offset, value):
        record = types.SimpleNamespace(topic=topic, partition=0, offset=offset, value=value, key=None)
        asyncio.run(runner._process([record]))
        runner._uncommitted[TopicPartition(topic, 0)] = offset + 1
        runner._after_slice([record])

    process(settings.topics.aggregates, 7, derived)
    assert runner.pending() == 0 and list(runner.held.derived) == ["run-1"]
    assert runner._uncommitted[TopicPartition(settings.topics.aggregates, 0)] == 7  # not past it
    process(settings.topics.events, 3, start)
    assert runner.held.derived == {} and runner.pending() == 2
    runner.flush()
    assert [p.parent.parent.name for p in settings.archive_dir.rglob("*.parquet")] == ["project=grpo"]


def test_a_feeder_forgets_runs_long_unseen_and_asks_the_sink_again_on_their_next_event(tmp_path, monkeypatch):
    """It kept which seqs every run it ever saw holds (~1 kB a run in a long-lived sink)."""
    from metricbus.sinks import _runtime

    monkeypatch.setattr(_runtime, "RUNS_KNOWN", 2)
    monkeypatch.setattr(_runtime, "KNOWN_IDLE_COMMITS", 1)
    archive = ParquetArchive(tmp_path / "archive")
    archive.open()
    feeder = _runtime.Feeder(archive)

    def events(run):
        body = {"step": 0, "epoch": None, "rank": 0, "scalars": {"x": 1.0}, "samples": {}}
        return [
            ev(0, RUN_STARTED, run_started("grpo", "n"), run, f"p-{run}"),
            ev(1, METRICS, body, run, f"p-{run}"),
        ]

    for run in ("r0", "r1", "r2", "r3"):
        feeder.write(feeder.fresh(events(run)))
    archive.flush()
    feeder.committed()
    assert len(feeder._known_runs) == 4  # seen since the last commit: kept
    feeder.write(feeder.fresh(events("r4")))
    archive.flush()
    feeder.committed()
    assert set(feeder._known_runs) == {"r4"} and set(feeder.logged.sets) == {"p-r4"}
    assert feeder.fresh(events("r0")) == [] and feeder.duplicates == 2  # r0 asked of the archive again
    assert set(feeder._known_runs) == {"r0", "r4"} and "r0" in feeder.logged_runs
    assert [e.seq for e in read_events(archive.archive_dir, "r0")] == [0, 1]
