"""Diagnostics over real archived runs: two configs x three seeds of the demo's PPO, and labels."""

import json
import subprocess
import time

import numpy as np
import pytest
from scipy import stats

from metricbus.demo._ppo import PPOConfig, train
from metricbus.producers import Run
from metricbus.sinks import read_table

from .conftest import cli

pytestmark = pytest.mark.integration

LEARNING_RATES = (2.5e-3, 1e-5)  # the demo's, and one too small to learn in 15 updates
SEEDS = (1, 2, 3)


def archived(settings, run_id, events):
    """Wait until the sink has archived ``events`` events of the run."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            table = read_table(settings.archive_dir, run_id, columns=["producer_id", "seq"])
            if (
                len(set(zip(table["producer_id"].to_pylist(), table["seq"].to_pylist(), strict=True)))
                >= events
            ):
                return
        except FileNotFoundError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"run {run_id} not archived")


def final_mean(settings, run_id, metric):
    """The run's final-window mean of ``metric`` read back with pyarrow: the last tenth, at least 5."""
    table = read_table(settings.archive_dir, run_id, columns=["kind", "name", "step", "value", "producer_id"])
    rows = sorted(
        (s, v)
        for n, s, v in zip(*(table[c].to_pylist() for c in ("name", "step", "value")), strict=True)
        if n == metric
    )
    values = [v for _, v in rows if np.isfinite(v)]
    return float(np.mean(values[-max(5, len(values) // 10) :]))


def test_two_configs_three_seeds_of_the_demo_ppo_give_scipys_verdict(settings, sink):
    sink()
    runs = {}
    for lr in LEARNING_RATES:
        for seed in SEEDS:
            run = Run(
                "ppo-seeds",
                name=f"lr{lr}-seed{seed}",
                settings=settings,
                system_metrics=False,
                config={"learning_rate": lr, "seed": seed, "env": "CartPole-v1"},
            )
            train(run, PPOConfig(updates=10, learning_rate=lr, seed=seed))
            assert run.finish(timeout=30)
            runs[(lr, seed)] = (run.run_id, run.stats()["events"])
    for run_id, events in runs.values():
        archived(settings, run_id, events)
    ids = [run_id for run_id, _ in runs.values()]
    done = subprocess.run(
        cli(settings, "compare", *ids, "--metric", "Train/AvgReward", "--json"),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # the small learning rate is a regression
    out = json.loads(done.stdout, parse_constant=pytest.fail)  # strict JSON
    good = [runs[(LEARNING_RATES[0], s)][0] for s in SEEDS]
    bad = [runs[(LEARNING_RATES[1], s)][0] for s in SEEDS]
    assert out["groups"] == {"learning_rate=0.0025": good, "learning_rate=1e-05": bad}
    assert set(out["config_diff"]) == {"learning_rate", "seed"}
    (verdict,) = out["group_metrics"]
    # the same numbers, read back independently, through scipy
    base = [final_mean(settings, r, "Train/AvgReward") for r in good]
    other = [final_mean(settings, r, "Train/AvgReward") for r in bad]
    want = stats.ttest_ind(other, base, equal_var=False)
    assert verdict["means"] == pytest.approx(other) and verdict["baseline_means"] == pytest.approx(base)
    assert verdict["p_value"] == pytest.approx(want.pvalue)
    assert verdict["p_value"] < 0.05 and verdict["verdict"] == "worse" and verdict["effect_size"] < 0
    text = subprocess.run(
        cli(settings, "compare", *ids, "--metric", "Train/AvgReward"), capture_output=True, text=True
    )
    assert "groups (by learning_rate)" in text.stdout and "REGRESSION" in text.stdout
    # on the environment-steps axis (global_step) every run is cut at the same budget
    steps = subprocess.run(
        cli(settings, "compare", *ids, "--metric", "Train/AvgReward", "--x", "global_step", "--json"),
        capture_output=True,
        text=True,
    )
    assert json.loads(steps.stdout)["budget"] == 10 * 4 * 128


def test_health_of_a_labelled_run_breaks_it_down_per_label(settings, sink):
    sink()
    rng = np.random.default_rng(0)
    run = Run("labels", settings=settings, system_metrics=False)
    for i in range(300):
        task = ("logo_a", "logo_b", "logo_c")[i % 3]
        reward = 0.3 + 0.05 * rng.standard_normal() if task == "logo_c" else i / 300
        success = task != "logo_c" and i > 50
        run.log_episode(
            reward,
            length=20,
            success=success,
            reason="solved" if success else "timeout",
            labels={"task": task},
            step=i,
        )
    assert run.finish(timeout=30)
    archived(settings, run.run_id, run.stats()["events"])
    out = json.loads(
        subprocess.run(
            cli(settings, "health", run.run_id, "--json"), capture_output=True, text=True, check=True
        ).stdout
    )
    rows = {row["label"]: row for row in out["labels"]}
    assert rows["task=logo_c"]["episode/success"] == 0.0 and rows["task=logo_a"]["episode/success"] == 1.0
    assert rows["termination=timeout"]["events"] + rows["termination=solved"]["events"] == 300
    progress = next(p for p in out["parts"] if p["name"] == "progress")
    assert any("[task=logo_c] did not improve" in line for line in progress["evidence"])
    text = subprocess.run(
        cli(settings, "health", run.run_id), capture_output=True, text=True, check=True
    ).stdout
    assert "task=logo_c: 100 events" in text
