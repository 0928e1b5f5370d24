"""Experiments: the demo's PPO, three learning rates × three seeds, through the real stack, then
`metricbus compare --project --group-by` and `metricbus.runs()` read back against numpy and scipy."""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest
from scipy import stats

from metricbus.producers import Run
from metricbus.sinks import read_table

from .conftest import cli

pytestmark = pytest.mark.integration

RATES = (2.5e-3, 1e-3, 1e-1)  # the demo's default, another, and one too large to learn with
SEEDS = (1, 2, 3)
REWARD = "Train/AvgReward"


class Logged:
    """The run, and every reward it was given (an update with no finished episode logs none)."""

    def __init__(self, run: Run) -> None:
        self.run, self.rewards = run, 0

    def log(self, data, **kw) -> None:
        self.rewards += REWARD in data
        self.run.log(data, **kw)

    def __getattr__(self, name):
        return getattr(self.run, name)


def train_grid(settings) -> tuple[dict[str, tuple[float, int]], dict[str, int]]:
    """run id -> (learning rate, seed), and how many rewards each logged; every run finished."""
    from metricbus.demo._ppo import PPOConfig, train

    runs, logged = {}, {}
    for lr in RATES:
        for seed in SEEDS:
            cfg = PPOConfig(updates=20, learning_rate=lr, seed=seed)
            run = Logged(
                Run("sweep", name=f"lr{lr:g}-s{seed}", config=cfg, settings=settings, system_metrics=False)
            )
            train(run, cfg)
            assert run.finish(timeout=30)
            runs[run.run_id], logged[run.run_id] = (lr, seed), run.rewards
    return runs, logged


def archived_rewards(settings, logged, timeout=60.0) -> dict[str, tuple[list[int], list[float]]]:
    """Each run's (steps, Train/AvgReward values), read with pyarrow once the archive holds them all."""
    deadline = time.monotonic() + timeout
    while True:
        table = read_table(settings.archive_dir, project="sweep", columns=["run_id", "name", "step", "value"])
        rows = sorted((r["run_id"], r["step"], r["value"]) for r in table.to_pylist() if r["name"] == REWARD)
        out = {
            run: ([s for r, s, _ in rows if r == run], [v for r, _, v in rows if r == run]) for run in logged
        }
        if all(len(out[r][0]) == n for r, n in logged.items()) or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def test_compare_groups_a_sweep_by_learning_rate_names_the_best_and_flags_the_broken_one(settings, sink):
    pytest.importorskip("gymnasium", reason="the demo's PPO needs the demo extra; `make test` installs it")
    sink(flush_interval=0.3)
    runs, logged = train_grid(settings)
    archived = archived_rewards(settings, logged)
    assert {r: len(steps) for r, (steps, _) in archived.items()} == logged
    rewards = {r: values for r, (_, values) in archived.items()}

    result = subprocess.run(
        cli(
            settings,
            "compare",
            "--project",
            "sweep",
            "--group-by",
            "learning_rate",
            "--metric",
            REWARD,
            "--json",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr  # exit 1: a regression
    got = json.loads(result.stdout)
    # independently: each run's final window (the last 5: the last tenth of at most 20, at least 5)
    finals = {run: float(np.mean(values[-5:])) for run, values in rewards.items()}
    groups = {f"learning_rate={lr!r}": [r for r, (rate, _) in runs.items() if rate == lr] for lr in RATES}
    assert {g: sorted(m) for g, m in got["groups"].items()} == {g: sorted(m) for g, m in groups.items()}
    assert got["baseline_group"] == "learning_rate=0.0025"  # the first run's group
    scores = {s["group"]: s for s in got["group_scores"]}
    iqms = {}
    for group, members in groups.items():
        mine = np.array([finals[r] for r in members])
        iqms[group] = stats.trim_mean(mine, 0.25)
        assert scores[group]["iqm"] == pytest.approx(iqms[group])
        assert scores[group]["std"] == pytest.approx(np.std(mine, ddof=1))
        want = stats.bootstrap(
            (mine,),
            lambda x, axis: stats.trim_mean(x, 0.25, axis=axis),
            n_resamples=2000,
            method="percentile",
            rng=np.random.default_rng(0),
        ).confidence_interval
        assert scores[group]["interval"] == pytest.approx([want.low, want.high])
    best = max(iqms, key=iqms.get)
    assert [g for g, s in scores.items() if s["best"]] == [best]  # reward: higher is better
    assert best == "learning_rate=0.0025"  # the demo's default learns; 20 updates tell it apart

    verdicts = {c["group"]: c for c in got["group_metrics"]}
    base = [finals[r] for r in groups["learning_rate=0.0025"]]
    for group, c in verdicts.items():
        mine = [finals[r] for r in groups[group]]
        assert c["p_value"] == pytest.approx(stats.ttest_ind(mine, base, equal_var=False).pvalue)
    broken = verdicts["learning_rate=0.1"]
    assert broken["verdict"] == "worse" and broken["difference_interval"][1] < 0
    assert [r["group"] for r in (c for c in got["group_metrics"] if c["verdict"] == "worse")]

    text = subprocess.run(
        cli(settings, "compare", "--project", "sweep", "--group-by", "learning_rate", "--metric", REWARD),
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "learning_rate=0.1" in text and "REGRESSION" in text and "<- best" in text
    best_line = next(line for line in text.splitlines() if "<- best" in line)
    assert "learning_rate=0.0025" in best_line and f"IQM {iqms[best]:.4g}" in best_line

    import metricbus

    frame = metricbus.runs("sweep", settings=settings)
    assert sorted(frame["run_id"]) == sorted(runs)
    assert {(r["config/learning_rate"], r["config/seed"]) for _, r in frame.iterrows()} == set(runs.values())
    curves = metricbus.curves("sweep", REWARD, group_by=["learning_rate"], settings=settings)
    assert set(curves["group"]) == set(groups)
    for group, members in groups.items():
        mine = curves[curves["group"] == group].sort_values("step")
        # runs that logged at other steps: each interpolated onto the steps all of them cover
        lo = max(archived[r][0][0] for r in members)
        hi = min(archived[r][0][-1] for r in members)
        grid = sorted({s for r in members for s in archived[r][0] if lo <= s <= hi})
        lines = np.array([np.interp(grid, *archived[r]) for r in members])
        assert mine["step"].tolist() == grid
        assert mine["mean"].to_numpy() == pytest.approx(lines.mean(axis=0))
        assert mine["upper"].to_numpy() == pytest.approx(lines.mean(axis=0) + lines.std(axis=0, ddof=1))
        assert (mine["runs"] == 3).all()
