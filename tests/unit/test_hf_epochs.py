"""Each framework's epoch as ours (producers/_epochs.py); the HF Trainer's state.epoch is
epoch + (step + 1) / steps_per_epoch: its last step already reads 1.0."""

import math

import pytest

from metricbus.producers._epochs import counted_epoch, rollout_epoch, trainer_epoch


@pytest.mark.parametrize(
    ("state_epoch", "epoch"),
    [(0.0, 0), (1 / 15, 0), (14 / 15, 0), (1.0, 0), (1 + 1 / 300, 1), (2.0, 1), (2 + 1 / 15, 2)],
)
def test_each_log_belongs_to_the_epoch_its_step_ran_in(state_epoch, epoch):
    assert trainer_epoch(state_epoch) == epoch


def test_an_absent_or_unusable_epoch_is_none():
    assert trainer_epoch(None) is None and trainer_epoch(math.nan) is None and trainer_epoch(True) is None


def test_lightnings_running_epoch_is_ours_and_sb3s_rollouts_count_from_one():
    assert [counted_epoch(x) for x in (0, 0.0, 3, math.inf, None, "1")] == [0, 0, 3, None, None, None]
    # rollout k holds timesteps ((k-1)N, kN]; no size (off-policy): no epoch
    assert [rollout_epoch(t, 2048) for t in (0, 1, 2048, 2049, 4096)] == [1, 1, 1, 2, 2]
    assert rollout_epoch(100, None) is None
