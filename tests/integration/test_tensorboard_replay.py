import os
import subprocess
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from metricbus.producers import Run
from metricbus.sinks import read_events, read_table

from .conftest import cli

pytestmark = pytest.mark.integration


def scalars(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return {t: [(s.step, s.value, s.wall_time) for s in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def start_sink(settings, kind, logdir=None, env=None):
    """`metricbus sink KIND` as a child process (its log beside the data); (process, log file)."""
    args = ["sink", kind, "--flush-interval", "0.3"] + (["--logdir", str(logdir)] if logdir else [])
    out = open(settings.data_dir / f"{kind}.log", "ab")
    env = env or {**os.environ, **settings.to_env()}
    return subprocess.Popen(cli(settings, *args), stdout=out, stderr=subprocess.STDOUT, env=env), out


def test_live_tensorboard_equals_archive_and_a_replay_gives_identical_scalars(settings, tmp_path):
    live_dir = tmp_path / "tb-live"
    procs = [start_sink(settings, "parquet"), start_sink(settings, "tensorboard", live_dir)]
    try:
        run = Run(
            "grpo", name="gemma", settings=settings, system_metrics=False, config={"beta": 0.04, "lr": 1e-5}
        )
        for step in range(300):
            run.log(
                {
                    "Train/Loss": 1.0 / (step + 1),
                    "rewards/total_mean": step / 300,
                    "weird name!": float(step),
                },
                step=step,
            )
        run.log_histogram("rewards/answer_check_hist", [0.1, 0.4, 0.9], bins=3, step=299)
        assert run.finish(timeout=20)
        events = run.stats()["events"]
        deadline = time.monotonic() + 60
        live = {}
        while time.monotonic() < deadline:
            held = len(
                set(
                    zip(
                        *[
                            read_table(settings.archive_dir, run.run_id)[c].to_pylist()
                            for c in ("producer_id", "seq")
                        ]
                    )
                )
            )
            dirs = list(live_dir.glob(f"grpo/gemma-{run.run_id}"))
            live = scalars(dirs[0]) if dirs else {}
            if held >= events and len(live.get("Train/Loss", [])) == 300:
                break
            time.sleep(0.5)
    finally:
        for proc, out in procs:
            proc.terminate()
            proc.wait(20)
            out.close()
    # live: the same value (float32, as TensorBoard stores it) at the same step as the archive
    archived = {
        (r["name"], r["step"]): r["value"]
        for r in read_table(settings.archive_dir, run.run_id).to_pylist()
        if r["value"] is not None
    }
    assert len(live["Train/Loss"]) == 300
    for name_tag, name in (("Train/Loss", "Train/Loss"), ("rewards/total_mean", "rewards/total_mean")):
        for step, value, _ in live[name_tag]:
            assert value == pytest.approx(archived[(name, step)], rel=1e-6)
    assert any(t.startswith("weird_name_~") for t in live)  # mapped, not dropped

    # replay from the archive into a fresh directory: identical scalars
    out = subprocess.run(
        cli(
            settings,
            "replay",
            "--run",
            run.run_id,
            "--to",
            "tensorboard",
            "--out",
            str(tmp_path / "tb-replay"),
        ),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"replayed {events} events" in out
    replayed = scalars(next((tmp_path / "tb-replay").glob(f"grpo/gemma-{run.run_id}")))
    assert replayed == live

    # the same from the events topic itself
    subprocess.run(
        cli(
            settings,
            "replay",
            "--run",
            run.run_id,
            "--from",
            "kafka",
            "--to",
            "tensorboard",
            "--out",
            str(tmp_path / "tb-kafka"),
        ),
        capture_output=True,
        text=True,
        check=True,
    )
    assert scalars(next((tmp_path / "tb-kafka").glob(f"grpo/gemma-{run.run_id}"))) == live

    # and the archive gives back the very events that were logged
    rebuilt = read_events(settings.archive_dir, run.run_id)
    assert [e.seq for e in rebuilt] == list(range(events))
    assert rebuilt[5].body["scalars"] == {
        "Train/Loss": 1.0 / 5,
        "rewards/total_mean": 4 / 300,
        "weird name!": 4.0,
    }


def test_backtest_prints_what_new_rules_would_have_fired(settings, sink, tmp_path):
    sink()
    run = Run("p", settings=settings, system_metrics=False)
    for step in range(50):
        run.log(
            {
                "Train/Loss": float("nan") if step == 30 else 1.0,
                "System/Memory_Percent": 95.0 if step > 40 else 50.0,
            },
            step=step,
        )
    assert run.finish(timeout=20)
    events = run.stats()["events"]
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and len(read_table(settings.archive_dir, run.run_id)) < 2 * (
        events - 2
    ):
        time.sleep(0.3)
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n  - {name: nan_loss, kind: nonfinite, metric: '*Loss*'}\n"
        "  - {name: mem, kind: threshold, metric: System/Memory_Percent, op: '>', value: 90, for: 3}\n"
    )
    out = subprocess.run(
        cli(settings, "backtest", "--rules", str(rules), "--run", run.run_id),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    fired = [line for line in out if "firing" in line]
    assert "step       30" in fired[0] and "nan_loss" in fired[0]
    assert "step       43" in fired[1] and "mem" in fired[1]
    # at the run's end: memory still above 90 % (ended), the loss finite again for the run's
    # last 19 evaluations (resolved: the run recovered, too quickly for the rule's seconds)
    ended = [line for line in out if " ended " in line]
    assert len(ended) == 1 and "mem" in ended[0] and "step       49" in ended[0], out
    resolved = [line for line in out if " resolved " in line]
    assert len(resolved) == 1 and "nan_loss" in resolved[0] and "step       49" in resolved[0], out
    assert out[-1] == f"2 alert(s) would have fired on run {run.run_id} (4 transitions)"
    seed = subprocess.run(  # no --rules: the seed rule pack, as `metricbus up` runs it
        cli(settings, "backtest", "--run", run.run_id), capture_output=True, text=True, check=True
    ).stdout
    assert "step       30  firing   nan_loss [critical] Train/Loss:" in seed, seed


def test_live_wandb_history_equals_a_replay_from_the_archive(settings, tmp_path, monkeypatch):
    from tests.wandb_reader import read_run

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    env_settings = settings
    live_root = tmp_path / "wb-live"
    procs = [start_sink(env_settings, "parquet"), start_sink(env_settings, "wandb", live_root)]
    try:
        run = Run("grpo", name="gemma", settings=settings, system_metrics=False, config={"beta": 0.04})
        for step in range(40):
            run.log({"Train/Loss": 1.0 / (step + 1)}, step=step, epoch=step // 10)
        assert run.finish(summary={"final/x_mean": 0.5}, timeout=20)
        events = run.stats()["events"]
        deadline = time.monotonic() + 90
        live = None
        while time.monotonic() < deadline:
            try:
                live = read_run(live_root, run.run_id)
                held = len(read_table(settings.archive_dir, run.run_id))
                # every step and the summary written; the live run stays open (no stream worker
                # here says its derived series are complete, so the sink finishes it only after
                # its grace), and the replay's run is finished: their histories are compared
                if len(live["history"]) >= 40 and "final/x_mean" in live["summary"] and held >= events - 1:
                    break
            except ValueError:
                pass  # the run file is not there yet
            time.sleep(0.5)
    finally:
        for proc, out in procs:
            proc.terminate()
            proc.wait(30)
            out.close()
    system_tmp = tmp_path / "system-tmp"  # the replay's system temp dir: wandb's would go there
    system_tmp.mkdir()
    done = subprocess.run(
        cli(settings, "replay", "--run", run.run_id, "--to", "wandb", "--out", str(tmp_path / "wb-replay")),
        check=True,
        capture_output=True,
        env={**os.environ, "WANDB_MODE": "offline", "TMPDIR": str(system_tmp)},
    )
    replayed = read_run(tmp_path / "wb-replay", run.run_id)
    # wandb's temporary files were the replay's own, under its output, and went with it (quietly)
    assert list(system_tmp.iterdir()) == []
    assert list((tmp_path / "wb-replay" / ".metricbus-tmp").iterdir()) == []
    assert b"Exception ignored" not in done.stderr, done.stderr[-2000:]

    def history(r):
        return [
            (row["metricbus/step"], row.get("metricbus/epoch"), row["Train/Loss"]) for row in r["history"]
        ]

    assert history(live) == [(s, s // 10, 1.0 / (s + 1)) for s in range(40)]  # exact doubles, every step
    assert history(replayed) == history(live)
    assert live["summary"]["final/x_mean"] == replayed["summary"]["final/x_mean"] == 0.5
