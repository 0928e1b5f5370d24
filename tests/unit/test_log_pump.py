"""A child's log on a disk that fills (a real tmpfs): its errors reach up's terminal meanwhile,
its last lines stay in memory, and its log is written again once there is room."""

from __future__ import annotations

import sys
import textwrap
import time

from metricbus.stack import _proc
from tests.conftest import fill

CHILD = textwrap.dedent(
    """
    import os, sys, time
    one, two = sys.argv[1], sys.argv[2]
    print("hello", flush=True)
    while not os.path.exists(one):
        time.sleep(0.05)
    for i in range(200):  # 20 kB: past the page the log file had begun
        print(f"line {i} " + "x" * 100, flush=True)
        if i == 50:
            print("ERROR boom: the sink cannot flush", flush=True)
    while not os.path.exists(two):
        time.sleep(0.05)
    print("after the disk had room", flush=True)
    """
)


def wait_for(check, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_full_disk_keeps_a_childs_errors_on_the_terminal_and_its_last_lines(small_disk, tmp_path):
    reports: list[str] = []
    log = small_disk / "logs" / "sink-parquet.log"
    one, two = tmp_path / "one", tmp_path / "two"
    proc = _proc.spawn([sys.executable, "-c", CHILD, str(one), str(two)], log_path=log, report=reports.append)
    try:
        wait_for(lambda: log.exists() and b"hello" in log.read_bytes(), "the first line in the log")
        filler = fill(small_disk)
        one.touch()
        wait_for(lambda: len(reports) >= 2, f"the reports: {reports}")
        assert "sink-parquet: cannot write its log" in reports[0] and "No space left on device" in reports[0]
        assert reports[1] == "metricbus up: sink-parquet: ERROR boom: the sink cannot flush"
        wait_for(lambda: "line 199 " in proc.log_pump.tail(), "the last lines kept")
        assert [line.split()[1] for line in proc.log_pump.tail(3).splitlines()] == ["197", "198", "199"]
        filler.unlink()
        two.touch()
        assert proc.wait(20) == 0
        assert _proc.tail(log, proc=proc).splitlines()[-1] == "after the disk had room"
        assert reports[-1] == f"metricbus up: sink-parquet: its log {log} is written again"
        assert log.read_bytes().endswith(b"after the disk had room\n")
        assert len(reports) == 3  # said once each way: not a line per refused write
    finally:
        _proc.stop(proc)


def test_a_refusing_destination_is_told_on_ups_terminal_once_a_minute_and_when_it_writes_again(tmp_path):
    """Its log is written (a tmpfs fills a page at a time: a sink's few error lines still fit), so
    nothing else would tell up's terminal that the Parquet sink's disk is full."""
    import subprocess

    lines = [
        "2026-11-26 INFO sink-parquet consuming t.events",
        "2026-11-26 ERROR sink-parquet: flush failed (No space left on device); retrying in 0.5s, nothing committed",
        "2026-11-26 ERROR sink-parquet: flush failed (No space left on device); retrying in 1.0s, nothing committed",
        "2026-11-26 WARNING sink-parquet: writes again; committing what it took",
        "2026-11-26 ERROR sink-parquet: flush failed (No space left on device); retrying in 0.5s, nothing committed",
    ]
    told: list[str] = []
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print(sys.argv[1], flush=True)", "\n".join(lines)],
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    pump = _proc.LogPump("sink-parquet", tmp_path / "sink-parquet.log", child.stdout, told.append)
    child.wait(10)
    pump._thread.join(10)
    assert [t.split(" ", 4)[-1] for t in told] == [
        "ERROR sink-parquet: flush failed (No space left on device); retrying in 0.5s, nothing committed",
        "WARNING sink-parquet: writes again; committing what it took",
        "ERROR sink-parquet: flush failed (No space left on device); retrying in 0.5s, nothing committed",
    ]
    assert all(t.startswith("metricbus up: sink-parquet: 2026-11-26 ") for t in told)
    assert (tmp_path / "sink-parquet.log").read_text().count("flush failed") == 3  # all in its log
