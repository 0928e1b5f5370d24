"""A data disk that fills up under the sinks, mid-run, on the real stack: nothing is dead-lettered
for it, nothing is committed past what is on disk, and once there is room again every sink holds
every event once (issue: every tier honest about what it wrote)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time

import numpy as np
import pytest

from metricbus.producers import Run
from metricbus.sinks import read_table
from metricbus.sinks.wandb import SEQS_DIR

from ..conftest import fill
from .conftest import cli, read_topic

pytestmark = pytest.mark.integration


def start(settings, log_path, *args, env=None):
    log = open(log_path, "wb")  # on the test's own disk: the sink's log is not what fills
    env = {**os.environ, **settings.to_env(), **(env or {})}
    proc = subprocess.Popen(cli(settings, *args), stdout=log, stderr=subprocess.STDOUT, env=env)
    return proc, log


def tensorboard_steps(root, run_id) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    dirs = list(root.glob(f"*/*{run_id}"))
    if not dirs:
        return []
    acc = EventAccumulator(str(dirs[0]), size_guidance={"scalars": 0})
    acc.Reload()
    return [s.step for s in acc.Scalars("Train/Loss")] if "Train/Loss" in acc.Tags()["scalars"] else []


def archived_steps(settings, run_id) -> list[int]:
    try:
        table = read_table(settings.archive_dir, run_id, columns=["name", "step"])
    except (FileNotFoundError, ValueError, OSError):
        return []
    return sorted(
        s
        for n, s in zip(table["name"].to_pylist(), table["step"].to_pylist(), strict=True)
        if n == "Train/Loss"
    )


def test_the_parquet_and_tensorboard_sinks_wait_out_a_full_disk_and_lose_nothing(
    settings, small_disk, tmp_path
):
    on_disk = dataclasses.replace(settings, data_dir=small_disk)  # the archive and ledgers on the small disk
    # the processes' shared metrics, as under `metricbus up` (here off the small disk)
    shared = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus")}
    (tmp_path / "prometheus").mkdir()
    procs = [
        start(on_disk, tmp_path / "parquet.log", "sink", "parquet", "--flush-interval", "0.3", env=shared),
        start(
            on_disk,
            tmp_path / "tb.log",
            "sink",
            "tensorboard",
            "--logdir",
            str(small_disk / "tb"),
            "--flush-interval",
            "0.3",
            env=shared,
        ),
    ]

    def status() -> str:  # what `metricbus status` says of the sink groups
        env = {**os.environ, **on_disk.to_env(), **shared}
        done = subprocess.run(cli(on_disk, "status"), env=env, capture_output=True, text=True, timeout=60)
        return done.stdout + done.stderr

    try:
        run = Run("full-disk", settings=settings, system_metrics=False)

        def scalars(step: int) -> dict:
            return {"Train/Loss": 1 / (step + 1), **{f"Train/m{j}": step * 0.5 + j for j in range(8)}}

        for step in range(300):
            run.log(scalars(step), step=step)
        assert run.flush(timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            len(archived_steps(on_disk, run.run_id)) < 300
            or len(tensorboard_steps(small_disk / "tb", run.run_id)) < 300
        ):
            time.sleep(0.5)
        filler = fill(small_disk)  # the disk is full now
        for step in range(300, 3000):
            run.log(scalars(step), step=step)
        assert run.finish(timeout=30)  # the broker has them: the sinks cannot write them yet
        time.sleep(4)  # several flush intervals against a full disk
        logs = {name: (tmp_path / f"{name}.log").read_text() for name in ("parquet", "tb")}
        for name, text in logs.items():
            assert "flush failed" in text and "No space left on device" in text, (name, text[-2000:])
            assert "Traceback" not in text, (name, text[-3000:])
        assert all(p.poll() is None for p, _ in procs)  # waiting, not dead
        said = status()
        for sink in ("parquet", "tensorboard"):
            line = next((x for x in said.splitlines() if on_disk.groups.sink(sink) in x), "")
            assert "FAILING now" in line and "flush(es) failed" in line, said
        filler.unlink()  # room again
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (
            len(archived_steps(on_disk, run.run_id)) < 3000
            or len(tensorboard_steps(small_disk / "tb", run.run_id)) < 3000
        ):
            time.sleep(0.5)
        assert archived_steps(on_disk, run.run_id) == list(range(3000))  # every event once
        assert tensorboard_steps(small_disk / "tb", run.run_id) == list(range(3000))
        assert read_topic(settings, settings.topics.deadletter, 0, timeout=3) == []  # nothing dead-lettered
        assert "FAILING" not in status()  # their flushes succeed again
    finally:
        for proc, log in procs:
            proc.terminate()
            proc.wait(30)
            log.close()


def wandb_steps(root, run_id) -> list[int]:
    from tests.wandb_reader import read_run, run_files

    if not run_files(root, run_id):
        return []
    rows = read_run(root, run_id, every_opening=True)["history"]
    return sorted(r["metricbus/step"] for r in rows if "Train/Loss" in r or "Loss" in r.get("Train", {}))


def test_the_wandb_sink_commits_only_what_wandbs_file_holds_through_a_full_disk(
    settings, small_disk, tmp_path
):
    """W&B gives up on a run file for good at its first ENOSPC (and keeps taking rows): the sink
    sees the rows missing from the file, opens the run again once there is room and logs them
    again; nothing is dead-lettered, committed past a missing row, or written twice."""
    on_disk = dataclasses.replace(settings, data_dir=small_disk)
    proc, log = start(on_disk, tmp_path / "wandb.log", "sink", "wandb", "--flush-interval", "0.3")
    try:
        run = Run("wandb-full-disk", settings=settings, system_metrics=False)
        for step in range(300):
            run.log({"Train/Loss": 1 / (step + 1)}, step=step)
        assert run.flush(timeout=30)
        root = small_disk / "wandb"
        deadline = time.monotonic() + 60
        ledger = root / SEQS_DIR / f"{run.run_id}.json"  # the sink's own: RunStarted, saved at a flush
        while time.monotonic() < deadline and (
            len(wandb_steps(root, run.run_id)) < 200 or not ledger.exists()
        ):
            time.sleep(0.5)  # W&B writes its file a 32 KiB block at a time: most rows are there
        # the disk fills under W&B, not under the sink's first save of its ledger (which would
        # fail the sink's flush, retried before it takes the rows W&B is to lose: waiting too,
        # but not what this test looks at)
        filler = fill(small_disk)
        for step in range(300, 3000):
            run.log({"Train/Loss": 1 / (step + 1)}, step=step)
        assert run.flush(timeout=30)
        # The sink looks at W&B's file on each flush retry (0.5 s doubling): past STALLED_AFTER_S
        # of no growth, the first retry after it finds W&B stopped writing (15.5 s after the first
        # refused flush, or later on a loaded machine): wait for what it says, not a fixed time.
        deadline = time.monotonic() + 90
        text = ""
        while time.monotonic() < deadline and "W&B did not write" not in text:
            time.sleep(0.5)
            text = (tmp_path / "wandb.log").read_text()
        assert "W&B did not write" in text, text[-3000:]
        assert proc.poll() is None, text[-3000:]  # waiting, not dead
        filler.unlink()
        assert run.finish(timeout=30)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and wandb_steps(root, run.run_id) != list(range(3000)):
            time.sleep(1)
        assert wandb_steps(root, run.run_id) == list(range(3000))  # every row once
        assert read_topic(settings, settings.topics.deadletter, 0, timeout=3) == []
        assert "Traceback" not in (tmp_path / "wandb.log").read_text()
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


def test_a_producer_whose_spool_disk_fills_mid_run_loses_nothing_and_says_so_until_it_has_room(
    settings, sink, small_disk, caplog
):
    """The producer's spool on a real 4 MB tmpfs that fills while the broker is up: what it logs
    meanwhile is held, flush() is False (nothing it cannot spool is called sent), no torn spool;
    once there is room every event is archived once and finish() is True."""
    producing = dataclasses.replace(settings, data_dir=small_disk)  # the spool on the small disk
    sink(flush_interval=0.2)  # the archive on the test's own disk
    run = Run("spool-full", settings=producing, system_metrics=False)
    for step in range(500):
        run.log({"Train/Loss": 1 / (step + 1)}, step=step)
    assert run.flush(timeout=30)
    filler = fill(small_disk)  # the spool's disk is full now
    for step in range(500, 3000):
        run.log({"Train/Loss": 1 / (step + 1)}, step=step)
    assert run.flush(timeout=2) is False  # not spooled, so not sent: not called done
    assert run._publisher.backlog > 0
    filler.unlink()  # room again
    assert run.finish(timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(archived_steps(settings, run.run_id)) < 3000:
        time.sleep(0.5)
    assert archived_steps(settings, run.run_id) == list(range(3000))  # every event, once
    assert run._publisher.lost_events == 0
    assert "held in memory" in caplog.text and "has room again" in caplog.text
    assert "corrupt or torn" not in caplog.text


def test_a_full_media_store_disk_refuses_media_and_scalars_go_on(settings, sink, small_disk, caplog):
    """The data directory (spool and media store) on a 4 MB tmpfs that fills: the image logged
    meanwhile is refused, counted and said (no torn item left in the store), the scalars are held
    and sent once there is room, and an image logged then is kept."""
    producing = dataclasses.replace(settings, data_dir=small_disk)
    sink(flush_interval=0.2)
    run = Run("media-full", settings=producing, system_metrics=False)
    picture = np.random.default_rng(5).integers(0, 256, size=(256, 256, 3), dtype=np.uint8)  # ~200 KB as PNG
    run.log({"Train/Loss": 1.0}, step=0)
    assert run.flush(timeout=30)
    filler = fill(small_disk, leave=64 * 1024)  # room for the spool's next records, not the image
    run.log_image("samples/full", picture, step=1)
    for step in range(1, 200):
        run.log({"Train/Loss": 1 / (step + 1)}, step=step)
    run._media.drain(30)
    assert run.stats()["media_refused"] == 1
    assert not [p for p in (small_disk / "media").rglob("*") if p.is_file()]  # nothing torn left
    filler.unlink()
    run.log_image("samples/full", picture[::-1], step=200)
    assert run.finish(timeout=30)
    assert run.stats()["media_logged"] == 1
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(archived_steps(settings, run.run_id)) < 200:
        time.sleep(0.5)
    assert archived_steps(settings, run.run_id) == list(range(200))  # every scalar, once
    assert "not kept" in caplog.text and "No space left on device" in caplog.text
