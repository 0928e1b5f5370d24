"""The HF Trainer's state.epoch is epoch + (step + 1) / steps_per_epoch: its last step already reads 1.0."""

import math

import pytest

from metricbus.producers.hf import epoch_index


@pytest.mark.parametrize(
    ("state_epoch", "epoch"),
    [(0.0, 0), (1 / 15, 0), (14 / 15, 0), (1.0, 0), (1 + 1 / 300, 1), (2.0, 1), (2 + 1 / 15, 2)],
)
def test_each_log_belongs_to_the_epoch_its_step_ran_in(state_epoch, epoch):
    assert epoch_index(state_epoch) == epoch


def test_an_absent_or_unusable_epoch_is_none():
    assert epoch_index(None) is None and epoch_index(math.nan) is None and epoch_index(True) is None
