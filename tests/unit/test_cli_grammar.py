"""One CLI grammar: a run by id, id prefix or name everywhere; global options anywhere; hints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from metricbus.cli import main
from metricbus.diagnostics._runs import AmbiguousRun, find_run
from metricbus.schemas import (
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    Event,
    MetricbusError,
    Settings,
    StackInfo,
    announce,
    default_codec,
    run_started,
)
from metricbus.sinks import ParquetArchive

FP = default_codec().newest("EventBatch").fingerprint


def archive_run(archive, run_id, name, steps=30, finished=True):
    sink = ParquetArchive(archive)
    sink.open()
    producer = f"p-{run_id}"
    events = [Event(run_id, producer, 0, 1_000, RUN_STARTED, run_started("proj", name, {"lr": 0.1}), FP)]
    events += [
        Event(run_id, producer, i + 1, 2_000 + i, METRICS,
              {"step": i, "epoch": None, "rank": 0, "scalars": {"Train/Loss": 1.0 / (i + 1)}, "samples": {}}, FP)
        for i in range(steps)
    ]  # fmt: skip
    if finished:
        events.append(
            Event(run_id, producer, steps + 1, 9_000, RUN_FINISHED, {"status": "finished", "summary": {}}, FP)
        )
    sink.write(events)
    sink.flush()
    sink.close()


@pytest.fixture
def archive(tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("METRICBUS_") and k != "METRICBUS_RUNTIME_DIR"]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("METRICBUS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("METRICBUS_RUNTIME_DIR", str(tmp_path / "runtime"))
    archive = tmp_path / "archive"
    archive_run(archive, "20261126-010101-aaaa1111", "ppo-lr3e-4")
    archive_run(archive, "20261126-020202-bbbb2222", "ppo-lr1e-3")
    archive_run(archive, "20261126-020202-bbbb3333", "ppo-lr1e-3", finished=False)
    return archive


def test_a_run_is_found_by_its_id_a_unique_prefix_or_a_unique_name(archive):
    assert find_run(archive, "20261126-010101-aaaa1111") == "20261126-010101-aaaa1111"
    assert find_run(archive, "20261126-01") == "20261126-010101-aaaa1111"
    assert find_run(archive, "ppo-lr3e-4") == "20261126-010101-aaaa1111"
    assert find_run(archive, "ppo-lr3") == "20261126-010101-aaaa1111"  # a unique start of a name
    with pytest.raises(
        AmbiguousRun, match="names 2 runs: 20261126-020202-bbbb2222, 20261126-020202-bbbb3333"
    ):
        find_run(archive, "ppo-lr1e-3")
    with pytest.raises(AmbiguousRun):
        find_run(archive, "20261126-02")
    with pytest.raises(MetricbusError, match="no run 'nope'.*`metricbus runs` lists them"):
        find_run(archive, "nope")


RUN = "20261126-010101-aaaa1111"


@pytest.mark.parametrize(
    ("argv", "shows"),
    [
        (["health", "ppo-lr3e-4"], f"run {RUN}: health"),
        (["health", "--run", "20261126-01"], f"run {RUN}: health"),
        (["export", "ppo-lr3e-4", "--format", "json"], f'"run": "{RUN}"'),
        (["export", "--run", "20261126-010101"], f'"{RUN}",29,"Train/Loss"'),
        (["backtest", "20261126-01"], f"would have fired on run {RUN}"),
        (["report", "ppo-lr3e-4", "--out", "{tmp}/r.html"], "wrote {tmp}/r.html"),
        (["compare", "ppo-lr3e-4", "20261126-020202-bbbb2222", "--metric", "Train/Loss"], RUN),
        (["replay", "ppo-lr3e-4", "--to", "parquet", "--out", "{tmp}/replayed"], "replayed 32 events"),
    ],
)
def test_every_command_that_takes_a_run_takes_a_name_or_a_prefix(archive, tmp_path, capsys, argv, shows):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) in (0, 1), capsys.readouterr().err  # compare's 1 is a finding, not a failure
    out = capsys.readouterr()
    assert shows.replace("{tmp}", str(tmp_path)) in out.out + out.err
    if argv[0] == "report":
        assert RUN in (tmp_path / "r.html").read_text()
    if argv[0] == "replay":
        assert find_run(tmp_path / "replayed", RUN) == RUN


def test_an_ambiguous_run_lists_the_candidates_and_exits_2(archive, capsys):
    assert main(["health", "ppo-lr1e-3"]) == 2
    err = capsys.readouterr().err
    assert "bbbb2222" in err and "bbbb3333" in err and "`metricbus runs`" in err


def test_metricbus_runs_lists_every_run_with_its_state(archive, capsys):
    assert main(["runs"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["NAME", "PROJECT", "STATE"]
    assert [line.split()[0] for line in table[1:]] == ["ppo-lr3e-4", "ppo-lr1e-3", "ppo-lr1e-3"]
    assert "stopped, unfinished" in table[3] and "finished" in table[1]
    assert main(["runs", "--json", "--project", "proj"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["run_id"] for r in rows} == {
        "20261126-010101-aaaa1111",
        "20261126-020202-bbbb2222",
        "20261126-020202-bbbb3333",
    }
    assert rows[0]["config"] == {"lr": 0.1} and rows[0]["last_step"] == 29
    assert main(["runs", "--project", "other"]) == 0
    assert "no run of project 'other'" in capsys.readouterr().out


def test_an_unknown_flag_gets_a_did_you_mean(archive, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["report", "ppo-lr3e-4", "--output", "x.html"])
    assert exit.value.code == 2
    assert "unrecognized arguments: --output x.html (did you mean --out?)" in capsys.readouterr().err


def test_global_options_are_accepted_after_the_command(archive, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    archive_run(elsewhere / "archive", "run-elsewhere", "far")
    assert main(["runs", "--data-dir", str(elsewhere)]) == 0
    assert "far" in capsys.readouterr().out


def test_a_client_joins_the_running_stack_unless_told_otherwise_and_ignores_a_dead_one(
    tmp_path, monkeypatch, caplog
):
    for key in [k for k in os.environ if k.startswith("METRICBUS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("METRICBUS_RUNTIME_DIR", str(tmp_path / "runtime"))
    me = psutil.Process()
    announce(
        StackInfo(
            pid=me.pid,
            created=me.create_time(),
            data_dir=str(tmp_path / "d"),
            topic_prefix="x.",
            local_port=19092,
            dashboard_url="http://127.0.0.1:1/",
        )
    )
    settings, stack = Settings.resolve()
    assert (
        stack is not None and settings.local_port == 19092 and str(settings.data_dir) == str(tmp_path / "d")
    )
    assert settings.topic_prefix == "x."
    # explicit beats the stack: the broker given, nothing is taken from the stack
    assert Settings.resolve(bootstrap="kafka:9092")[1] is None
    monkeypatch.setenv("METRICBUS_LOCAL_PORT", "9999")
    assert Settings.from_env().local_port == 9999 and Settings.resolve()[1] is None
    monkeypatch.delenv("METRICBUS_LOCAL_PORT")
    # a data dir given picks the stack of that data dir, or none
    assert Settings.resolve(data_dir=tmp_path / "other")[1] is None
    # a stack whose process is gone (a dead pid, or a pid reused since) is ignored, said, removed
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    announce(
        StackInfo(pid=dead.pid, created=time.time(), data_dir="/nowhere", topic_prefix="y.", local_port=1)
    )
    announce(
        StackInfo(
            pid=me.pid, created=me.create_time() - 100, data_dir="/reused", topic_prefix="z.", local_port=2
        )
    )
    with caplog.at_level("WARNING", logger="metricbus"):
        settings, stack = Settings.resolve()
    assert stack is None and settings.local_port == 9092  # both gone: the defaults
    assert caplog.text.count("is not running any more") == 2
    assert not list((tmp_path / "runtime").glob("*.json"))


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "--json"],
        ["health", "ppo-lr3e-4", "--json"],
        ["compare", "ppo-lr3e-4", "20261126-020202-bbbb2222", "--json"],
    ],
)
def test_the_archive_reading_commands_answer_the_same_without_pandas_in_their_process(archive, argv, capsys):
    """`metricbus runs/health/compare` keep pandas out of their own process (pyarrow's dataset
    module imports it at its import: 0.2 s of a 1 s command); the answer is the one a process
    with pandas gives, and a caller of main() keeps its pandas."""
    # looked at by an exit handler: the command's own process ends without returning from main()
    script = (
        "import atexit, sys; from metricbus.cli import main; sys.argv[0] = 'metricbus'; "
        "atexit.register(lambda: print('pandas' in sys.modules, 'pyarrow.dataset' in sys.modules, "
        "file=sys.stderr)); sys.exit(main())"
    )
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.split()[-2:] == ["False", "True"]  # the archive was read, pandas never imported
    assert main(argv) == 0
    assert json.loads(done.stdout) == json.loads(capsys.readouterr().out)
    assert not any(type(f).__name__ == "_NoPandas" for f in sys.meta_path)  # a caller's imports: its own
