"""What the stream job derives, with defaults from the user's seeds (002, 004)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

#: Seed 004: the batch's per-sample rewards logged as samples under this name become
#: Train/AvgReward, Train/RewardStd, Train/RewardMin, Train/RewardMax, Train/RewardVariance.
SEED_004_REWARD_SAMPLES = {
    "Train/Reward": {
        "mean": "Train/AvgReward",
        "std": "Train/RewardStd",
        "min": "Train/RewardMin",
        "max": "Train/RewardMax",
        "variance": "Train/RewardVariance",
    }
}


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """Windows and names of the derived series; each field documents itself."""

    #: Seed 002's ``_recent_mean``: the mean of the last N values.
    window: int = 10
    #: TensorBoard's smoothing weight for ``stats/<metric>/ema``.
    ema_weight: float = 0.6
    #: Values in the window that trend slopes and convergence are computed over.
    trend_window: int = 20
    #: Values kept for the P99 of throughput series.
    p99_window: int = 1000
    #: The logged scalar that Epoch/AvgReward, RewardVariance and RewardTrend are computed from
    #: (if its samples are logged through an alias, those samples are used instead).
    reward_metric: str = "Train/AvgReward"
    #: The logged scalar behind Epoch/AvgLoss and Epoch/LossTrend.
    loss_metric: str = "Train/Loss"
    #: Samples name -> {statistic: derived name}; statistics without an alias are named
    #: ``<samples name>_<statistic>`` (seed 002's ``rewards/{name}_mean`` and friends).
    sample_aliases: Mapping[str, Mapping[str, str]] = dataclasses.field(
        default_factory=lambda: dict(SEED_004_REWARD_SAMPLES)
    )
    #: Logged scalars whose name ends with one of these are summed per epoch into
    #: ``Epoch/<suffix>`` (seed 004's Epoch/APITokens).
    epoch_sums: tuple[str, ...] = ("APITokens",)
    #: Scalars ending with this get a running ``..._Avg<suffix>`` and ``..._P99<suffix>``
    #: (seed 004: Performance/Generation_TokensPerSec -> Generation_AvgTokensPerSec, ...P99...).
    throughput_suffix: str = "TokensPerSec"
    #: Cross-rank merge: a step missing a rank is emitted without it once the leading rank is
    #: this many steps ahead (and the rank's later value for it counts as late).
    rank_timeout_steps: int = 10
    #: Seed 002's ``rewards/{name}_hist``: every samples series gets ``<name>_hist``, a histogram
    #: of its last ``hist_window`` scores in ``hist_bins`` bins, every ``hist_every`` steps once
    #: it holds ``hist_min_samples`` scores.
    hist_every: int = 10
    hist_window: int = 1000
    hist_bins: int = 20
    hist_min_samples: int = 10
    #: Seed 002's rubric summary: at the end of the run, samples series under this prefix
    #: (``criteria/{rubric}/{criterion}``) become rows of the table ``summary_table``
    #: (criterion, mean, std, min, max, samples).
    summary_prefix: str = "criteria/"
    summary_table: str = "rubric_criteria_summary"
    #: Emit ``stats/<metric>/recent_mean`` and ``stats/<metric>/ema`` for every logged scalar.
    per_metric_stats: bool = True
    #: Name prefixes whose higher values are worse (for trend direction); everything else
    #: counts higher as better unless its name contains "loss".
    lower_is_better: tuple[str, ...] = ("loss", "kl", "memory", "time", "variance", "std")

    def higher_is_better(self, name: str) -> bool:
        """Direction of a metric: loss falling is improving, reward rising is improving."""
        lowered = name.lower()
        return not any(word in lowered for word in self.lower_is_better)
