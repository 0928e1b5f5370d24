"""Which epoch a step belongs to, for every framework: the one home of those rules.

Ours (an event's ``epoch``): the index of the pass over the data, or the rollout, that the
step ran in; every step of it carries it, its last step included. The stream worker averages
an epoch's values over the steps that carry it and closes the epoch when a step of the next
one arrives (``Epoch/*``), so a framework's counter that already reads the next epoch on an
epoch's last step moves that step into the next epoch, and its end-of-training log into an
epoch that never ran. Each framework counts its own way; each adapter asks here:

================  =========================================  ===================================
framework         what it gives                              ours
================  =========================================  ===================================
HF Trainer, TRL   ``state.epoch`` = epoch + (step + 1) / N   ``trainer_epoch``: ceil(x) - 1
Lightning         ``epoch`` key: the running epoch, 0-based  ``counted_epoch``: as given
SB3 (on-policy)   ``num_timesteps``, rollouts of N = n_steps  ``rollout_epoch``: 1-based rollout
                  × n_envs                                    ((k-1)·N, k·N] -> k
a loop of yours   ``run.log(..., epoch=k)``                   as given
================  =========================================  ===================================

Each is tested against the framework's own log of a real run (tests/integration/
test_frameworks.py: per epoch, Epoch/AvgLoss equals the mean of the losses the framework logged
in it, and no extra epoch).
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def _finite(value: Any) -> float | None:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def trainer_epoch(state_epoch: Any) -> int | None:
    """The epoch of an HF Trainer (or TRL) log, from the unrounded ``state.epoch``; None if none.

    ``state.epoch`` is ``epoch + (step + 1) / steps_per_epoch``: an epoch's last step already
    reads 1.0, 2.0, ..., so the epoch is the ceiling minus one (0 until the first step), not the
    integer part. ``logs["epoch"]`` is rounded to two decimals (1.0033 reads 1.0): not used.
    """
    number = _finite(state_epoch)
    return None if number is None else max(0, math.ceil(number) - 1)


def counted_epoch(epoch: Any) -> int | None:
    """A framework's own 0-based count of the running epoch (Lightning's ``epoch`` key)."""
    number = _finite(epoch)
    return None if number is None else int(number)


def rollout_epoch(num_timesteps: int, rollout_size: int | None) -> int | None:
    """The 1-based rollout that timestep ``num_timesteps`` belongs to (None without a size).

    Rollout k holds timesteps ((k-1)·N, k·N]: a second ``learn()`` keeps counting.
    """
    if not rollout_size:
        return None
    return max(1, -(-int(num_timesteps) // rollout_size))
