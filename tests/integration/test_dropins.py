"""Scripts written for SummaryWriter and for wandb run unchanged but for the import (issue 10, point 4).

Each script runs twice as a real process: once with the library it was written for (torch's
SummaryWriter writing TensorBoard files; wandb in offline mode), once with metricbus's drop-in
against the real broker and the Parquet sink. What the library's own reader shows must equal
what the archive holds: same keys, steps and values.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from metricbus.schemas import run_config
from metricbus.sinks import read_events, read_table

pytestmark = pytest.mark.integration

TB_SCRIPT = textwrap.dedent(
    """
    import sys
    IMPORT
    import numpy as np
    writer = SummaryWriter(log_dir=sys.argv[1])
    writer.add_hparams({"lr": 0.001, "layers": 2}, {"hparam/best": 0.5})
    rng = np.random.default_rng(0)
    for step in range(50):
        writer.add_scalar("Train/Loss", 1.0 / (step + 1), step)
        writer.add_scalars("Eval", {"acc": step / 50, "f1": step / 60}, global_step=step)
        if step % 10 == 0:
            writer.add_histogram("weights", rng.normal(size=1000), step)
            writer.add_text("notes", f"step {step}", step)
    writer.add_embedding(np.zeros((3, 4)), global_step=0)
    writer.flush()
    writer.close()
    """
)

WANDB_SCRIPT = textwrap.dedent(
    """
    import sys
    IMPORT
    run = wandb.init(project="dropin", name="wb", config={"lr": 0.01, "batch": 32})
    for i in range(30):
        wandb.log({"loss": 1.0 / (i + 1)})                      # one step each
        if i % 5 == 0:
            wandb.log({"extra": float(i)}, commit=False)       # joins the next committed step
    wandb.log({"jump": 1.0}, step=40)                          # a step of its own choosing
    wandb.log({"jump": 2.0, "loss": 0.001}, step=41)
    wandb.log({"late": 1.0}, step=10)                          # lower than the current: dropped
    wandb.config.update({"epochs": 3})
    wandb.log({"hist": wandb.Histogram([1, 2, 2, 3])}, step=42)
    wandb.summary["best"] = 0.99
    wandb.finish()
    print(run.id)
    """
)


def archive_scalars(settings, run_id: str, want: int, timeout: float = 60.0) -> dict:
    """name -> {step: value} of a run's logged scalars in the archive (waits for ``want`` rows)."""
    deadline = time.monotonic() + timeout
    rows: list = []
    while time.monotonic() < deadline:
        try:
            table = read_table(settings.archive_dir, run_id, columns=["name", "step", "value", "producer_id"])
            rows = [
                (n, s, v)
                for n, s, v, p in zip(
                    *(table[c].to_pylist() for c in ("name", "step", "value", "producer_id"))
                )
                if p != "metricbus.stream" and v is not None
            ]
        except (FileNotFoundError, ValueError, KeyError):
            rows = []
        if len(rows) >= want:
            break
        time.sleep(0.5)
    out: dict = {}
    for n, s, v in rows:
        assert s not in out.setdefault(n, {}), f"{n} step {s} twice"
        out[n][s] = v
    return out


def run_script(script: str, import_line: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script.replace("IMPORT", import_line), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_summary_writer_script_gives_the_same_scalars_as_torchs_own(settings, sink, tmp_path):
    pytest.importorskip("torch", reason="torch is an optional extra; `make test` installs it")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink(flush_interval=0.3)
    env = {**os.environ, **settings.to_env(), "METRICBUS_PROJECT": "tb-dropin"}
    theirs = run_script(
        TB_SCRIPT, "from torch.utils.tensorboard import SummaryWriter", str(tmp_path / "tb" / "r1"), env=env
    )
    assert theirs.returncode == 0, theirs.stderr
    ours = run_script(
        TB_SCRIPT, "from metricbus.tensorboard import SummaryWriter", str(tmp_path / "mb" / "r1"), env=env
    )
    assert ours.returncode == 0, ours.stderr
    assert ours.stderr.count("add_embedding") == 1  # said once, not silently dropped

    acc = EventAccumulator(str(tmp_path / "tb" / "r1"), size_guidance={"scalars": 0})
    acc.Reload()
    expected = {t: {e.step: e.value for e in acc.Scalars(t)} for t in acc.Tags()["scalars"]}
    # torch writes add_scalars' series into sub-directories (Eval_acc/, Eval_f1/) and
    # add_hparams' metrics into a timestamped run of their own
    subs = [d for d in (tmp_path / "tb" / "r1").iterdir() if d.is_dir()]
    for sub in subs:
        a = EventAccumulator(str(sub), size_guidance={"scalars": 0})
        a.Reload()
        for t in a.Tags()["scalars"]:
            key = f"{t}/{sub.name.split('_', 1)[1]}" if sub.name.startswith("Eval_") else t
            expected[key] = {e.step: e.value for e in a.Scalars(t)}
    assert {"Eval/acc", "Eval/f1", "hparam/best"} <= set(expected)

    deadline = time.monotonic() + 30
    while not (found := list(settings.archive_dir.glob("project=tb-dropin/run=*"))):
        assert time.monotonic() < deadline, "the run never reached the archive"
        time.sleep(0.3)
    (run_id,) = {p.name.split("=", 1)[1] for p in found}
    got = archive_scalars(settings, run_id, want=50 * 3 + 1)
    assert set(expected) <= set(got)
    for tag, steps in expected.items():
        # TensorBoard keeps float32; the archive the float64 that was logged
        assert {s: np.float32(v) for s, v in got[tag].items()} == {
            s: np.float32(v) for s, v in steps.items()
        }, tag
    table = read_table(settings.archive_dir, run_id, columns=["kind", "name", "step"])
    kinds = [(k, n, s) for k, n, s in zip(*(table[c].to_pylist() for c in ("kind", "name", "step")))]
    assert sorted(s for k, n, s in kinds if n == "weights" and "Histogram" in k) == [0, 10, 20, 30, 40]
    assert sorted(s for k, n, s in kinds if n == "notes" and "Table" in k) == [0, 10, 20, 30, 40]
    assert run_config(read_events(settings.archive_dir, run_id)) == {"lr": 0.001, "layers": 2}


def test_a_wandb_script_gives_the_same_history_as_wandbs_own(settings, sink, tmp_path):
    pytest.importorskip("wandb", reason="wandb is an optional extra; `make test` installs it")
    from tests.wandb_reader import read_run, run_files

    sink(flush_interval=0.3)
    env = {
        **os.environ,
        **settings.to_env(),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(tmp_path),
    }
    theirs = run_script(WANDB_SCRIPT, "import wandb", env=env)
    assert theirs.returncode == 0, theirs.stderr
    ours = run_script(WANDB_SCRIPT, "import metricbus.wandb as wandb", env=env)
    assert ours.returncode == 0, ours.stderr
    their_id, our_id = theirs.stdout.split()[-1], ours.stdout.split()[-1]

    assert len(run_files(tmp_path, their_id)) == 1
    wb = read_run(tmp_path, their_id)
    expected: dict = {}
    for row in wb["history"]:
        for key, value in row.items():
            if not key.startswith("_") and isinstance(value, int | float):
                expected.setdefault(key, {})[row["_step"]] = value
    assert set(expected) == {"loss", "extra", "jump"} and len(expected["loss"]) == 31  # "late" was dropped
    assert expected["jump"] == {40: 1.0, 41: 2.0}
    got = archive_scalars(settings, our_id, want=sum(len(v) for v in expected.values()))
    assert got == expected
    assert wb["config"]["epochs"] == 3 and wb["summary"]["best"] == 0.99

    # the histogram was logged after the last scalar: it may reach the archive a flush later
    deadline = time.monotonic() + 30
    while True:
        table = read_table(settings.archive_dir, our_id, columns=["kind", "name", "step", "payload"])
        names = [
            (n, s)
            for k, n, s in zip(*(table[c].to_pylist() for c in ("kind", "name", "step")))
            if "Histogram" in k
        ]
        if names or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert names == [("hist", 42)]
    assert not [n for k, n in zip(*(table[c].to_pylist() for c in ("kind", "name"))) if "Table" in k]
    config = run_config(read_events(settings.archive_dir, our_id))  # config changed after init: an update
    assert config == {k: wb["config"][k] for k in ("lr", "batch", "epochs")}
    assert "lower than the current step" in ours.stderr  # said, as wandb says it
