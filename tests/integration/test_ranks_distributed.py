"""Issue 15's ground truth: a real torch.distributed run (gloo, ranks started as torchrun starts
them) logs a per-rank value every step and all-reduces it; the worker's merge must equal it."""

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from .conftest import aggregates, free_port

torch = pytest.importorskip("torch", reason="torch is an optional extra; `make test` installs it")
pytestmark = pytest.mark.integration

TRAINER = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist
    import metricbus

    steps, pause, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    run = metricbus.init(project="ddp", system_metrics=False)  # RANK, WORLD_SIZE, run id: from torchrun's env
    torch.manual_seed(rank)
    truth = []
    for step in range(steps):
        value = float(torch.randn(()) + step * 0.01 + rank)
        run.log({"Train/Loss": value}, step=step)
        reduced = []
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
            t = torch.tensor([value], dtype=torch.float64)
            dist.all_reduce(t, op=op)
            reduced.append(float(t))
        truth.append([reduced[0] / world, reduced[1], reduced[2]])
        if pause:
            time.sleep(pause)
    ok = run.finish(timeout=30)
    if rank == 0:
        json.dump({"run_id": run.run_id, "truth": truth, "acked": ok}, open(out, "w"))
    dist.destroy_process_group()
    """
)


def torchrun(settings, tmp_path, world, steps, pause, offline_ranks=()):
    """Run ``world`` ranks with the environment torchrun gives them; rank 0's truth file."""
    procs, out = start_torchrun(settings, tmp_path, world, steps, pause, offline_ranks)
    assert [p.wait(180) for p in procs] == [0] * world
    return json.loads(out.read_text())


def start_torchrun(settings, tmp_path, world, steps, pause, offline_ranks=()):
    """Start ``world`` ranks (``offline_ranks`` spool only, as with no broker); (processes, truth file)."""
    script, out = tmp_path / "trainer.py", tmp_path / "truth.json"
    script.write_text(TRAINER)
    port = free_port()
    common = {
        **os.environ,
        **settings.to_env(),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world),
        "TORCHELASTIC_RUN_ID": uuid.uuid4().hex,
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(steps), str(pause), str(out)],
            env={
                **common,
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                **({"METRICBUS_OFFLINE": "1"} if r in offline_ranks else {}),
            },
        )
        for r in range(world)
    ]
    return procs, out


@pytest.mark.parametrize(
    "world, steps, pause",
    [(2, 400, 0.0), (3, 40, 0.05)],  # hundreds of steps a second; and a slow loop
    ids=["fast-2-ranks", "slow-3-ranks"],
)
def test_the_merged_series_equal_torch_all_reduce_at_every_step(
    settings, worker, tmp_path, world, steps, pause
):
    result = torchrun(settings, tmp_path, world, steps, pause)
    assert result["acked"]
    run_id, truth = result["run_id"], result["truth"]
    names = ["ranks/Train/Loss/mean", "ranks/Train/Loss/min", "ranks/Train/Loss/max", "ranks/reported"]
    deadline = time.monotonic() + 90
    while True:  # until every step's merge is in (the worker emits it once every rank reported)
        points = aggregates(settings, count=0, timeout=10)
        got = {n: {p["step"]: p["value"] for p in points.get(n, [])} for n in names}
        if len(got["ranks/reported"]) >= steps or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert run_id.startswith("torchrun-")
    assert got["ranks/reported"] == {s: float(world) for s in range(steps)}
    assert got["ranks/Train/Loss/mean"] == {s: pytest.approx(truth[s][0], rel=1e-12) for s in range(steps)}
    assert got["ranks/Train/Loss/min"] == {s: truth[s][1] for s in range(steps)}
    assert got["ranks/Train/Loss/max"] == {s: truth[s][2] for s in range(steps)}


NAMES = ["ranks/Train/Loss/mean", "ranks/Train/Loss/min", "ranks/Train/Loss/max", "ranks/reported"]


def archived_merge(settings, run_id, steps, timeout=90.0):
    """The merged series as the Parquet sink archived them: name -> [(step, value)] (duplicates kept)."""
    from metricbus.sinks import read_table

    deadline = time.monotonic() + timeout
    got: dict = {}
    while time.monotonic() < deadline:
        try:
            table = read_table(settings.archive_dir, run_id, columns=["name", "step", "value"])
        except (FileNotFoundError, ValueError, KeyError):
            table = None
        got = {n: [] for n in NAMES}
        if table is not None:
            for n, s, v in zip(*(table[c].to_pylist() for c in ("name", "step", "value"))):
                if n in got:
                    got[n].append((s, v))
        if len(got["ranks/reported"]) >= steps:
            break
        time.sleep(1)
    time.sleep(2)  # a duplicate would land now
    return got


def assert_merge_equals_truth(got, truth, world):
    steps = len(truth)
    for name in NAMES:
        assert sorted(s for s, _ in got[name]) == list(range(steps)), name  # every step, once
    by = {n: dict(got[n]) for n in NAMES}
    assert by["ranks/reported"] == {s: float(world) for s in range(steps)}
    assert by["ranks/Train/Loss/mean"] == {s: pytest.approx(truth[s][0], rel=1e-12) for s in range(steps)}
    assert by["ranks/Train/Loss/min"] == {s: truth[s][1] for s in range(steps)}
    assert by["ranks/Train/Loss/max"] == {s: truth[s][2] for s in range(steps)}


def start_worker(settings, log_path):
    from .conftest import cli

    env = {**os.environ, **settings.to_env()}
    with open(log_path, "ab") as log:
        return subprocess.Popen(cli(settings, "worker"), stdout=log, stderr=subprocess.STDOUT, env=env)


def test_the_archived_merge_is_the_same_after_a_worker_kill_9_mid_run(settings, sink, tmp_path):
    sink(flush_interval=0.3)
    worker = start_worker(settings, tmp_path / "worker.log")
    try:
        procs, out = start_torchrun(settings, tmp_path, 2, 600, 0.004)
        time.sleep(2.0)  # mid-run: some steps merged, some waiting for a rank
        worker.kill()
        worker.wait(10)
        worker = start_worker(settings, tmp_path / "worker.log")  # rebuilds from the events topic
        assert [p.wait(180) for p in procs] == [0, 0]
        result = json.loads(out.read_text())
        got = archived_merge(settings, result["run_id"], 600)
    finally:
        worker.terminate()
        worker.wait(20)
    assert_merge_equals_truth(got, result["truth"], 2)


def test_a_rank_whose_spool_is_synced_late_merges_the_same(settings, sink, worker, tmp_path):
    from .conftest import cli

    sink(flush_interval=0.3)
    result = torchrun(settings, tmp_path, 2, 200, 0.0, offline_ranks=(1,))  # rank 1 reaches no broker
    synced = subprocess.run(
        cli(settings, "sync"),
        env={**os.environ, **settings.to_env()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert "published" in synced.stdout
    got = archived_merge(settings, result["run_id"], 200)
    assert_merge_equals_truth(got, result["truth"], 2)
