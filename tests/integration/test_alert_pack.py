"""The default alert pack on the real worker: silent on a run that learns normally, and each
injected defect fires its rule at the step that shows it (or, for silence, within its seconds).

The healthy framework runs (SB3 PPO, the HF Trainer, TRL's GRPO) are checked in
test_frameworks.py beside what they log; the demo's PPO is checked here.
"""

from __future__ import annotations

import math
import os
import subprocess
import time

import numpy as np
import pytest

from metricbus.producers import Run
from metricbus.schemas import default_codec
from metricbus.stream_jobs._rules import DEFAULT_RULES

from .conftest import alerts_of_closed_run, cli, read_topic

pytestmark = pytest.mark.integration


def fired(alerts: list[dict]) -> dict[str, dict]:
    """rule -> its first firing alert."""
    out: dict[str, dict] = {}
    for a in alerts:
        if a["state"] == "firing":
            out.setdefault(a["rule"], a)
    return out


def test_the_demos_ppo_learning_normally_fires_nothing(settings, worker):
    pytest.importorskip("gymnasium", reason="the demo's PPO needs the demo extra; `make test` installs it")
    from metricbus.demo._ppo import PPOConfig, train

    cfg = PPOConfig()
    run = Run("demo-cartpole", name="ppo", config=cfg, settings=settings, system_metrics=False)
    final = train(run, cfg)
    assert run.finish(summary=final, timeout=30)
    assert final["final/episode_reward_mean"] > 100  # it learned: a random policy averages ~20
    assert alerts_of_closed_run(settings, run.run_id) == []


def test_the_quick_starts_example_learning_from_0_to_1_fires_nothing(settings, worker):
    """The README's loop: a loss that falls, a reward that rises from 0 to 1, epochs of 100 steps."""
    rng = np.random.default_rng(1)
    run = Run("cartpole", name="ppo-lr3e-4", config={"lr": 3e-4}, settings=settings, system_metrics=False)
    for step in range(1000):
        loss = 2.0 * math.exp(-step / 300) + 0.05 * rng.random()
        reward = min(1.0, max(0.0, step / 1000 + 0.05 * rng.standard_normal()))  # variance 0.0025
        run.log({"Train/Loss": loss, "Train/AvgReward": reward}, step=step, epoch=step // 100)
    assert run.finish(timeout=30)
    assert alerts_of_closed_run(settings, run.run_id) == []


def test_each_injected_defect_fires_its_rule_at_the_step_that_shows_it(settings, worker):
    """The change detectors judge a block of 20 values against the 60 blocks before them."""
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.01, 1400)

    nan = Run("defects", name="nan-loss", settings=settings, system_metrics=False)
    for step in range(20):
        nan.log({"Train/Loss": math.nan if step == 12 else 1.0 + noise[step]}, step=step)

    collapse = Run("defects", name="reward-collapse", settings=settings, system_metrics=False)
    for step in range(1360):  # rewards in [0, 1]: 0.8 for 1,305 steps, then 0.05
        collapse.log({"Train/AvgReward": 0.8 + noise[step] if step < 1305 else 0.05}, step=step)

    diverging = Run("defects", name="loss-diverging", settings=settings, system_metrics=False)
    for step in range(1340):  # SB3's loss name: the role, not the name, is watched
        loss = 1.0 + noise[step] if step < 1305 else 1.5 ** (step - 1304)
        diverging.log({"train/loss": loss}, step=step)

    frozen = Run("defects", name="loss-frozen", settings=settings, system_metrics=False)
    for step in range(400):  # a loss no update reaches any more: the same value from step 200
        frozen.log({"Train/Loss": 1.0 + noise[min(step, 200)]}, step=step)

    # two ranks of one run; rank 1 logs each step 20 steps after rank 0 did (in event time). The
    # lag is counted in rank 0's events that the worker has seen when rank 1 reports a step, so
    # rank 0's events still in flight then count less: a lag far past the rule's 5 is robust
    # to that, a lag of 6 would not be.
    ranks = [
        Run(
            "defects",
            "straggler",
            None,
            (),
            nan.run_id + "-ddp",
            rank=r,
            world_size=2,
            settings=settings,
            system_metrics=False,
        )
        for r in (0, 1)
    ]
    for step in range(50):
        ranks[0].log({"Train/Loss": 1.0}, step=step)
        if step >= 20:
            ranks[1].log({"Train/Loss": 1.0}, step=step - 20)
        time.sleep(0.01)
    for step in range(30, 50):
        ranks[1].log({"Train/Loss": 1.0}, step=step)

    for run in (nan, collapse, diverging, frozen, *ranks):
        assert run.finish(timeout=30)

    got = fired(alerts_of_closed_run(settings, nan.run_id))
    assert set(got) == {"nan_loss"} and got["nan_loss"]["step"] == 12
    got = fired(alerts_of_closed_run(settings, collapse.run_id))
    # the block of steps 1300-1319 has 15 collapsed values: its median shows it
    assert set(got) == {"reward_collapse"} and got["reward_collapse"]["step"] == 1319
    assert "of steps 1300-1319" in got["reward_collapse"]["message"]
    got = fired(alerts_of_closed_run(settings, diverging.run_id))
    assert set(got) == {"loss_diverging"} and got["loss_diverging"]["step"] == 1319
    assert got["loss_diverging"]["metric"] == "train/loss"
    got = fired(alerts_of_closed_run(settings, frozen.run_id))
    assert set(got) == {"loss_frozen"} and got["loss_frozen"]["step"] == 299  # 100 equal values
    alerts = alerts_of_closed_run(settings, ranks[0].run_id)
    got = fired(alerts)
    assert set(got) == {"straggler_rank"} and got["straggler_rank"]["value"] > 5
    # a finished run has nothing left firing: each firing alert resolved or ended
    for run_id in (nan.run_id, collapse.run_id, diverging.run_id, frozen.run_id, ranks[0].run_id):
        states: dict[str, str] = {}
        for a in alerts_of_closed_run(settings, run_id):
            states[a["rule"]] = a["state"]
        assert set(states.values()) <= {"resolved", "ended"}, states


def test_a_run_that_falls_silent_fires_run_stalled_within_its_seconds(settings, tmp_path):
    """The pack's own file with the stalled rule's 300 s cut to 3 (the delay is the rule's seconds)."""
    rules = tmp_path / "rules.yaml"
    text = DEFAULT_RULES.read_text()
    assert "    seconds: 300\n" in text
    rules.write_text(text.replace("    seconds: 300\n", "    seconds: 3\n"))
    log = open(tmp_path / "worker.log", "wb")
    env = {**os.environ, **settings.to_env()}
    proc = subprocess.Popen(
        cli(settings, "worker", "--rules", str(rules)), stdout=log, stderr=subprocess.STDOUT, env=env
    )
    try:
        run = Run("defects", name="stalls", settings=settings, system_metrics=False)
        for step in range(5):
            run.log({"Train/Loss": 1.0}, step=step)
        assert run.flush(timeout=30)
        silent_since = time.time()
        deadline = time.monotonic() + 90
        stalled: list[dict] = []
        while not stalled and time.monotonic() < deadline:
            time.sleep(1.0)
            records = read_topic(settings, settings.topics.alerts, 1, timeout=2)
            alerts = [default_codec().decode(r.value)[1] for r in records]
            stalled = [a for a in alerts if a["rule"] == "run_stalled" and a["run_id"] == run.run_id]
        assert stalled and stalled[0]["state"] == "firing"
        # the worker joins its group first (up to ~half a session timeout), then checks each second
        assert stalled[0]["ts_ms"] / 1000 - silent_since < 3 + 30
        run.finish(timeout=30)
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
