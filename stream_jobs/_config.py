"""What the stream job derives, with defaults from the user's seeds (002, 004)."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from metricbus.schemas import (
    LOSS_ALIASES,
    REWARD_ALIASES,
    THROUGHPUT_ALIASES,
    UNSMOOTHED,
    ConfigError,
    read_yaml,
)

from ._statistics import STATISTICS

#: The TensorBoard PPO metric set: the batch's per-sample rewards logged as samples under this name become
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


#: the ``<M>_<stat>`` a catalog throughput M gets from its own definitions (``_derive``)
_THROUGHPUT_STATS = frozenset({"avg", "p99"})

#: The per-metric statistics ``metric_stats`` can name (``_statistics.STATISTICS``).
METRIC_STATS = tuple(STATISTICS)


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """Windows and names of the derived series; each field documents itself."""

    #: The GRPO reward metrics' ``_recent_mean``: the mean of the last N values.
    window: int = 10
    #: TensorBoard's smoothing weight for ``<metric>_ema``.
    ema_weight: float = 0.6
    #: Values in the window that trend slopes and convergence are computed over.
    trend_window: int = 20
    #: Values kept for the P99 of throughput series.
    p99_window: int = 1000
    #: The per-step average reward that Epoch/AvgReward, RewardVariance, RewardCV and
    #: RewardTrend are computed over (the mean and the population variance of the epoch's
    #: per-step averages). Logged as a scalar, or as per-sample rewards through an alias whose
    #: ``mean`` is this name (then each step's average is the mean of its finite samples):
    #: both ways give the same numbers.
    reward_metric: str = "Train/AvgReward"
    #: The logged scalar behind Epoch/AvgLoss and Epoch/LossTrend.
    loss_metric: str = "Train/Loss"
    #: The alias catalog (``schemas/_catalog.py``): other names that are a run's reward or loss
    #: (SB3, Hugging Face, TRL, Lightning, CleanRL). A run binds each role to the first of
    #: ``reward_metric`` + ``reward_aliases`` (``loss_metric`` + ``loss_aliases``) it logs, and its
    #: Epoch/* series, trends and the rules scoped to ``@reward`` follow that series. Replace
    #: or extend the lists in the config file; () leaves only ``reward_metric`` / ``loss_metric``.
    reward_aliases: tuple[str, ...] = REWARD_ALIASES
    loss_aliases: tuple[str, ...] = LOSS_ALIASES
    #: Throughput series by exact name (SB3's ``time/fps``, CleanRL's ``charts/SPS``); each gets
    #: ``<name>_avg`` and ``<name>_p99`` beside it.
    throughput_aliases: tuple[str, ...] = THROUGHPUT_ALIASES
    #: A scalar the user logs with the number of samples a step processed; summed per epoch
    #: into Epoch/NumSamples. Without it, Epoch/NumSamples is the total size of the per-sample
    #: arrays logged in the step (the largest one per step), and without either it is not emitted.
    sample_count_metric: str = "Train/NumSamples"
    #: Samples name -> {statistic: derived name}; statistics without an alias are named
    #: ``<samples name>_<statistic>`` (the GRPO reward metrics' ``rewards/{name}_mean`` and friends).
    sample_aliases: Mapping[str, Mapping[str, str]] = dataclasses.field(
        default_factory=lambda: dict(SEED_004_REWARD_SAMPLES)
    )
    #: Logged scalars whose name ends with one of these are summed per epoch into
    #: ``Epoch/<suffix>`` (the TensorBoard PPO metric set's Epoch/APITokens).
    epoch_sums: tuple[str, ...] = ("APITokens",)
    #: Scalars ending with this get a running ``..._Avg<suffix>`` and ``..._P99<suffix>``
    #: (the TensorBoard PPO metric set: Performance/Generation_TokensPerSec ->
    #: Generation_AvgTokensPerSec, ...P99...).
    throughput_suffix: str = "TokensPerSec"
    #: Cross-rank merge: a rank that stays silent counts as missing once another rank's events
    #: are this many seconds of event time past its last event (heartbeats included); the
    #: steps it did not report are then emitted without it, and its later values count as late.
    rank_timeout_s: float = 30.0
    #: The GRPO reward metrics' ``rewards/{name}_hist``: every samples series gets ``<name>_hist``,
    #: a histogram of its last ``hist_window`` scores in ``hist_bins`` bins, every ``hist_every`` steps once
    #: it holds ``hist_min_samples`` scores.
    hist_every: int = 10
    hist_window: int = 1000
    hist_bins: int = 20
    hist_min_samples: int = 10
    #: The GRPO metrics' rubric summary: at the end of the run, samples series under this prefix
    #: (``criteria/{rubric}/{criterion}``) become rows of the table ``summary_table``
    #: (criterion, mean, std, min, max, samples).
    summary_prefix: str = "criteria/"
    summary_table: str = "rubric_criteria_summary"
    #: What every logged scalar M gets as ``M_<stat>`` (beside M in TensorBoard's and W&B's
    #: sections, the GRPO metrics' suffix pattern), at every ``smooth_every``-th value of M: any of
    #: recent_mean, ema, std, min, max, median, p99 (over the last ``window`` values), count
    #: (finite values so far), nonfinite (NaN and inf values so far), slope and trend
    #: (+1 improving, 0 stable, -1 declining, with the metric's direction; over the last
    #: ``trend_window`` values). () for none.
    metric_stats: tuple[str, ...] = ("recent_mean", "ema")
    #: A point of each ``metric_stats`` series at every this-many-th value of its metric (the
    #: 10th, 20th, ... value logged), at that value's step, and at the run's end for the last
    #: one: the resolution follows the steps, whatever the speed of the loop or the batching of
    #: the records. 1: a point at every step (each is another point per metric per step).
    smooth_every: int = 10
    #: Counters and schedules (globs over names: SB3's ``time/iterations`` and ``train/n_updates``,
    #: a learning-rate schedule, HF's ``epoch``): they get no ``metric_stats``, since a rolling
    #: mean or an EMA of a step count says nothing. The catalog's list (``schemas/_catalog.py``)
    #: by default; () smooths every scalar.
    unsmoothed: tuple[str, ...] = UNSMOOTHED
    #: Counters found by their values get none either: a series whose values so far are all
    #: whole numbers, none below the one before (a step or sample count, a constant), until a
    #: value is not (then it is smoothed from there on). False: only ``unsmoothed`` names.
    detect_counters: bool = True
    #: Per-label series (``run.log(..., labels={"task": "logo_a"})``, ``run.log_episode``):
    #: every labelled scalar M gets ``by_<key>/<value>/M_recent_mean`` over the last
    #: ``label_window`` values with that label (of a 0/1 success flag: the success rate), and
    #: each value its ``by_<key>/<value>/share`` of the last ``label_window`` events that carry
    #: the key. A run derives at most ``label_values`` values per key and ``label_keys`` keys;
    #: later ones are counted and logged, not derived (labels come from users and topics).
    label_window: int = 100
    label_values: int = 32
    label_keys: int = 8
    #: A run derives from at most this many logged names (scalars and samples series); later
    #: names reach every sink as logged but get no derived series and no alert, counted and
    #: said once per run. Each name holds ~2 kB of the worker's state: without the bound a run
    #: logging a new name every step (``f"loss_{step}"``) would grow the worker without end.
    max_series: int = 10_000
    #: The runs of one partition of the events topic derive from at most this many series
    #: (each ~1-2.5 kB: ~125 MB a partition, ~500 MB for the default 4); past it the least
    #: recently active runs' state is forgotten (they derive afresh if they log again), said in
    #: the log. Per partition, as a run's state is: a partition rebuilt from its records alone
    #: forgets the same runs. Label series count toward both bounds.
    max_partition_series: int = 50_000
    #: Words whose presence in a name (lowercased) makes higher values worse, for the trend's
    #: direction; throughputs always count higher as better, everything else too.
    lower_is_better: tuple[str, ...] = ("loss", "kl", "memory", "time", "variance", "std")

    def __post_init__(self) -> None:
        bad = sorted(set(self.metric_stats) - set(METRIC_STATS))
        if bad:
            raise ConfigError(f"metric_stats {bad} unknown; choose from {', '.join(METRIC_STATS)}")
        for name in (
            "window",
            "trend_window",
            "p99_window",
            "hist_every",
            "hist_window",
            "hist_bins",
            "label_window",
            "smooth_every",
            "max_series",
            "max_partition_series",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if not 0 <= self.ema_weight < 1:
            raise ConfigError(f"ema_weight must be in [0, 1) (got {self.ema_weight})")

    def reward_catalog(self) -> tuple[str, ...]:
        """Names a run's reward may have, best first: reward_metric, samples aliased to it, the catalog."""
        aliased = [s for s, a in self.sample_aliases.items() if a.get("mean") == self.reward_metric]
        return tuple(dict.fromkeys([self.reward_metric, *aliased, *self.reward_aliases]))

    def loss_catalog(self) -> tuple[str, ...]:
        """Names a run's loss may have, best first."""
        return tuple(dict.fromkeys([self.loss_metric, *self.loss_aliases]))

    def smoothed(self, name: str) -> bool:
        """Whether ``name`` gets the per-metric statistics (not a counter or a schedule)."""
        return not any(fnmatch.fnmatchcase(name, glob) for glob in self.unsmoothed)

    def stats_of(self, name: str) -> tuple[str, ...]:
        """The ``metric_stats`` series a :meth:`smoothed` ``name`` gets.

        No two definitions share a name: a catalog throughput's own ``<M>_p99`` (over
        ``p99_window``) is its only one, so ``metric_stats``' p99 (over ``window``) is not made
        for it.
        """
        if name in self.throughput_aliases:
            return tuple(s for s in self.metric_stats if s not in _THROUGHPUT_STATS)
        return self.metric_stats

    def higher_is_better(self, name: str) -> bool:
        """Direction of a metric: loss falling is improving, reward rising is improving."""
        if name in self.throughput_aliases or name.endswith(self.throughput_suffix):
            return True  # SB3's time/fps: "time" in the name, but more is better
        lowered = name.lower()
        return not any(word in lowered for word in self.lower_is_better)


def load_config(path: Path | str) -> StreamConfig:
    """A StreamConfig from a YAML mapping of its fields; ConfigError naming the file and the fix."""
    doc = read_yaml(path, "stream config")
    return parse_config(doc or {}, source=str(path))


def parse_config(doc: Any, source: str = "<config>") -> StreamConfig:
    """A StreamConfig from a mapping (see :func:`load_config`)."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping of StreamConfig fields")
    fields = {f.name for f in dataclasses.fields(StreamConfig)}
    unknown = sorted(set(doc) - fields)
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {unknown}; allowed: {sorted(fields)}")
    defaults = StreamConfig()
    values: dict[str, Any] = {}
    for name, raw in doc.items():
        default = getattr(defaults, name)
        number = isinstance(raw, (int, float)) and not isinstance(raw, bool)
        if isinstance(default, int):
            ok = number and float(raw).is_integer()
        elif isinstance(default, float):
            ok = number
        elif isinstance(default, tuple):
            ok = isinstance(raw, list) and all(isinstance(x, str) for x in raw)
        elif isinstance(default, Mapping):
            ok = isinstance(raw, dict) and all(
                isinstance(v, dict) and all(isinstance(x, str) for x in v.values()) for v in raw.values()
            )
        else:
            ok = isinstance(raw, str)
        if ok and not isinstance(default, (str, Mapping)):
            raw = type(default)(raw)
        if not ok:
            raise ConfigError(f"{source}: {name} must be like its default {default!r}, got {raw!r}")
        values[name] = raw
    try:
        return StreamConfig(**values)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
