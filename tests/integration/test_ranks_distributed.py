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


def torchrun(settings, tmp_path, world, steps, pause):
    """Start ``world`` ranks with the environment torchrun gives them; rank 0's truth file."""
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
            env={**common, "RANK": str(r), "LOCAL_RANK": str(r)},
        )
        for r in range(world)
    ]
    assert [p.wait(180) for p in procs] == [0] * world
    return json.loads(out.read_text())


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
