"""What an epoch derives when it closes: its means, variance, spread, trends and convergence.

The run's deriver (``_derive.RunDeriver``) gathers an :class:`Epoch` as the steps of one epoch
arrive and hands it to :func:`epoch_points`, with the run's reward and loss series, when the
next epoch begins or the run ends.
"""

from __future__ import annotations

from collections.abc import Callable

from ._config import StreamConfig
from ._points import Point
from ._roles import RoleBinding
from ._statistics import Series
from ._stats import Blocks, Welford, trend_class

#: Epoch/RewardCV is emitted only when the epoch's mean reward is at least this share of the
#: size of its largest per-step average (else the mean is near 0 and the ratio means nothing)
CV_MIN_MEAN_SHARE = 0.1


class Epoch:
    """What the steps of one epoch logged so far."""

    __slots__ = (
        "reward",
        "reward_samples",
        "loss",
        "samples",
        "counted",
        "steps",
        "sums",
        "last_step",
    )

    def __init__(self) -> None:
        # Epoch/AvgReward and RewardVariance are over the epoch's per-step average rewards,
        # however the user logs them: the logged average, or the mean of the step's samples
        self.reward = Blocks()  # the logged per-step average
        self.reward_samples = Welford()  # the means of per-sample rewards, preferred when logged
        self.loss = Blocks()
        self.samples = 0  # the sizes of the logged per-sample arrays
        self.counted: float | None = None  # the explicit sample counts logged (cfg.sample_count_metric)
        self.steps = 0
        self.sums: dict[str, float] = {}
        self.last_step = 0


class Roles:
    """The run's reward and loss, as its deriver bound them, and their series."""

    def __init__(
        self,
        reward: RoleBinding,
        reward_samples: RoleBinding,
        reward_steps: Series,
        loss: RoleBinding,
        series: Callable[[str], Series | None],
    ) -> None:
        self.reward, self.reward_samples, self.reward_steps = reward, reward_samples, reward_steps
        self.loss, self.series = loss, series


def epoch_points(
    ep: Epoch, number: int, ts: int, cfg: StreamConfig, roles: Roles, previous: dict[str, float]
) -> list[Point]:
    """The points of epoch ``number``, closed at ``ts``.

    ``previous``: the mean reward and loss of the epoch before, for the trends; updated.
    """
    out: list[Point] = []

    def point(name: str, source: str, kind: str, value: float) -> None:
        out.append(Point(name, source, kind, ep.last_step, number, value, ts))

    samples = ep.reward_samples.count > 0
    reward = ep.reward_samples if samples else ep.reward.total()
    if reward.count:
        avg = reward.mean
        source = (roles.reward_samples.name if samples else roles.reward.name) or "?"
        point("Epoch/AvgReward", source, "epoch_mean", avg)
        point("Epoch/RewardVariance", source, "epoch_variance", reward.variance)
        # scale-free spread, for rules that must fit any reward scale; undefined (no point)
        # where the mean is near 0 beside the epoch's own values, where std / |mean| says how
        # close to 0 the mean is rather than how spread the rewards are
        if avg != 0 and abs(avg) >= CV_MIN_MEAN_SHARE * max(abs(reward.min), abs(reward.max)):
            point("Epoch/RewardCV", source, "epoch_cv", reward.std / abs(avg))
        if "reward" in previous:
            point("Epoch/RewardTrend", source, "epoch_trend", avg - previous["reward"])
        previous["reward"] = avg
    if (losses := ep.loss.total()).count:
        loss = losses.mean
        source = roles.loss.name or "?"
        point("Epoch/AvgLoss", source, "epoch_mean", loss)
        if "loss" in previous:
            # positive = improving, as loss should decrease (seed 004)
            point("Epoch/LossTrend", source, "epoch_trend", previous["loss"] - loss)
        previous["loss"] = loss
    if ep.counted is not None:  # what the user counted wins over the arrays it logged
        point("Epoch/NumSamples", cfg.sample_count_metric, "count", ep.counted)
    elif ep.samples:
        point("Epoch/NumSamples", "*", "count", float(ep.samples))
    for suffix, total in sorted(ep.sums.items()):
        point(f"Epoch/{suffix}", f"*{suffix}", "epoch_sum", total)
    # the reward's per-step values: its samples' step means when it logs samples (as above)
    rewards = (roles.reward_samples.name, roles.reward_steps) if samples else (roles.reward.name, None)
    bound: tuple[tuple[str, str | None, Series | None], ...] = (
        ("Reward", *rewards),
        ("Loss", roles.loss.name, None),
    )
    for role, name, steps in bound:
        series = steps or (roles.series(name) if name is not None else None)
        if name is None or series is None or len(series.trend) < 2:
            continue
        scale = series.trend.std() or abs(series.trend.mean())
        up = cfg.higher_is_better(name) if role == "Loss" else True
        slope_class = float(trend_class(series.trend.slope(), scale, up))
        point(f"Epoch/{role}TrendClass", name, "trend", slope_class)
        point(f"Epoch/{role}Converged", name, "converged", float(series.convergence.update(series.trend)))
    return out
