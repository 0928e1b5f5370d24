"""TensorBoard's custom-scalars layout for one run, built from the series the run logs.

A chart appears once one of the run's series matches it, and lists exactly the tags that did:
no empty chart, and each chart holds one kind of quantity (a variance and a standard deviation
never share an axis; a series and its ``_recent_mean`` / ``_ema`` do). The template covers
seed 004's groups and the names of the alias catalog (SB3, Hugging Face, TRL, Lightning,
CleanRL); users add charts with a YAML file of the same shape (category -> chart -> regexes
over tags, i.e. metric names), and a chart of theirs replaces the template's of the same title.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from metricbus.schemas import LOSS_ALIASES, REWARD_ALIASES, THROUGHPUT_ALIASES, ConfigError, read_yaml

_SMOOTHED = r"(?:_recent_mean|_ema)?"  # the stream's rolling statistics sit beside their series
#: tags a run's layout remembers having looked at (then it starts again; placed ones stay)
TAGS_KEPT = 65_536


def _with_smoothed(*names: str) -> list[str]:
    return [re.escape(n) + _SMOOTHED for n in names]


#: category -> chart -> regexes over metric names (full match).
TEMPLATE: dict[str, dict[str, list[str]]] = {
    "Reward": {
        "Epoch reward": [r"Epoch/AvgReward", r"Epoch/RewardTrend"],
        "Reward": _with_smoothed(*REWARD_ALIASES),  # the alias catalog (samples: their rolling mean)
        "Episode return (per episode)": [
            r"rollout/episode_return_(?:mean|min|max|recent_mean)",
            r"episode/reward_(?:mean|min|max|recent_mean)",
        ],
        "Reward variance": [r"Epoch/RewardVariance", r"Train/RewardVariance", r"rewards/.*_variance"],
        "Reward std": [r"Train/RewardStd", r"reward_std", r"rewards/.*_std", r"rewards/.*/std"],
        "Reward CV": [r"Epoch/RewardCV"],
        "Rewards": [r"rewards/.*_mean", r"rewards/[^/]+/mean"],
        "Episode length": [r"rollout/ep_len_mean", r"rollout/episode_length_mean", r"charts/episodic_length"],
        "Success rate": [r"rollout/success_rate", r"rollout/episode_success_(?:mean|recent_mean)"],
    },
    "Loss": {
        "Epoch loss": [r"Epoch/AvgLoss", r"Epoch/LossTrend"],
        "Training loss": _with_smoothed(*LOSS_ALIASES),
        "Loss parts": [
            r"Train/PolicyLoss",
            r"Train/ValueLoss",
            r"train/policy_gradient_loss",
            r"train/value_loss",
            r"losses/policy_loss",
            r"losses/value_loss",
        ],
        "Entropy": [r"Train/Entropy", r"train/entropy_loss", r"losses/entropy", r"entropy"],
        "KL": [r"Train/KLPenalty", r"Train/ApproxKL", r"train/approx_kl", r"losses/approx_kl", r"kl"],
        "Evaluation loss": [r"eval_loss", r"eval/loss", r"val_loss"],
    },
    "Optimisation": {
        "Gradient norm": [r"grad/total_norm", r"grad_norm", r"train/grad_norm"],
        "Learning rate": [r"learning_rate", r"train/learning_rate", r"charts/learning_rate", r"lr/.*"],
        "Clip fraction": [r"train/clip_fraction", r"losses/clipfrac"],
    },
    "Performance": {
        "Generation": [r"Performance/Generation_.*"],
        "Backprop": [r"Performance/Backprop_.*"],
        "Throughput": [
            *_with_smoothed(*THROUGHPUT_ALIASES),
            "(?:" + "|".join(map(re.escape, THROUGHPUT_ALIASES)) + ")_(?:avg|p99)",
        ],
    },
    "System": {
        "CPU and memory": [r"System/CPU_Percent", r"System/Memory_Percent"],
        "GPU": [r"System/GPU_Utilization", r"System/GPU_Memory_Percent"],
    },
}


def load_layout(path: Path | str) -> dict[str, dict[str, list[str]]]:
    """A user's charts from YAML (category -> chart -> list of regexes); ConfigError on anything else."""
    doc = read_yaml(path, "layout")
    usage = f"{path}: expected category -> chart -> list of regexes, e.g. {{Mine: {{Accuracy: ['acc.*']}}}}"
    if not isinstance(doc, dict):
        raise ConfigError(usage)
    out: dict[str, dict[str, list[str]]] = {}
    for category, charts in doc.items():
        if not isinstance(charts, dict):
            raise ConfigError(usage)
        for chart, patterns in charts.items():
            if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
                raise ConfigError(usage)
            for p in patterns:
                try:
                    re.compile(p)
                except re.error as exc:
                    raise ConfigError(f"{path}: {category}/{chart}: {p!r} is not a regex ({exc})") from None
            out.setdefault(str(category), {})[str(chart)] = list(patterns)
    return out


def merged(user: Mapping[str, Mapping[str, list[str]]] | None) -> dict[str, dict[str, list[str]]]:
    """The template with the user's charts added (theirs win on the same category and title)."""
    out = {c: dict(charts) for c, charts in TEMPLATE.items()}
    for category, charts in (user or {}).items():
        out.setdefault(category, {}).update(charts)
    return out


class RunLayout:
    """The layout of one run: the charts that match a tag it writes, with the patterns that did.

    A chart lists the template's patterns that matched (not the tags themselves), so runs that
    log the same names have equal charts, which TensorBoard merges across runs. ``held`` are the
    tags an earlier process had placed (what :meth:`held` returned), so a restarted sink keeps them.
    """

    def __init__(self, charts: Mapping[str, Mapping[str, list[str]]], held: Iterable[str] = ()) -> None:
        self._charts = [
            (category, title, [re.compile(p) for p in patterns])
            for category, titles in charts.items()
            for title, patterns in titles.items()
        ]
        self._matched: set[tuple[int, int]] = set()  # (chart, pattern) that matched a tag
        self._placed: set[str] = set()
        self.seen: set[str] = set()
        for name in held:
            self.add(name)

    def add(self, tag: str) -> bool:
        """Note a tag the run writes; True if the layout changed (it must be written again)."""
        if tag in self.seen:
            return False
        if len(self.seen) >= TAGS_KEPT:  # what has been looked at, to skip it: a run may log
            self.seen.clear()  # a new name every step; what was placed is kept apart
        self.seen.add(tag)
        changed = False
        for c, (_, _, patterns) in enumerate(self._charts):
            for i, pattern in enumerate(patterns):
                if pattern.fullmatch(tag) and (c, i) not in self._matched:
                    self._matched.add((c, i))
                    changed = True
        if changed:
            self._placed.add(tag)
        return changed

    def held(self) -> list[str]:
        """The tags that first matched each pattern: what rebuilds this layout after a restart.

        One a pattern, not every tag placed: a run logging a new name every step kept them all,
        in memory and in the file rewritten at each flush that changed the layout.
        """
        return sorted(self._placed)

    def charts(self) -> dict[str, dict[str, list[str]]]:
        """The charts with a match (category -> chart -> patterns), in the template's order."""
        out: dict[str, dict[str, list[str]]] = {}
        for c, (category, title, patterns) in enumerate(self._charts):
            matched = [p.pattern for i, p in enumerate(patterns) if (c, i) in self._matched]
            if matched:
                out.setdefault(category, {})[title] = matched
        return out

    def summary_value(self) -> Any:
        """The ``custom_scalars__config__`` Summary.Value (what the plugin's summary.pb writes)."""
        from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2
        from tensorboard.plugins.custom_scalar import layout_pb2

        layout = layout_pb2.Layout(
            category=[
                layout_pb2.Category(
                    title=category,
                    chart=[
                        layout_pb2.Chart(
                            title=title, multiline=layout_pb2.MultilineChartContent(tag=patterns)
                        )
                        for title, patterns in charts.items()
                    ],
                )
                for category, charts in self.charts().items()
            ]
        )
        return summary_pb2.Summary.Value(
            tag="custom_scalars__config__",
            metadata=summary_pb2.SummaryMetadata(
                plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="custom_scalars")
            ),
            tensor=tensor_pb2.TensorProto(
                dtype="DT_STRING",
                string_val=[layout.SerializeToString()],
                tensor_shape=tensor_shape_pb2.TensorShapeProto(),
            ),
        )
