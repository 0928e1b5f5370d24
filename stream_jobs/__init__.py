"""Stream jobs: rolling statistics, epochs, trends, convergence and alerts.

The statistics and rules are plain Python objects; ``build_app`` wraps them in a Faust app
(imported only when called, so importing this package never imports Faust).
"""

from ._alerts import AlertEngine
from ._app import build_app, group_id, settle_heap
from ._checkpoint import checkpoint_dir, offsets, rebase, retire_single_file
from ._config import METRIC_STATS, StreamConfig, load_config, parse_config
from ._derive import Point, RunDeriver, derive_all
from ._partitions import PartitionedState
from ._processor import Output, StreamProcessor
from ._rebuild import committed_offsets
from ._rules import DEFAULT_RULES, Rule, load_rules, parse_rules
from ._stats import EMA, Convergence, Welford, Window, trend_class

__all__ = [
    "DEFAULT_RULES",
    "METRIC_STATS",
    "EMA",
    "AlertEngine",
    "Convergence",
    "Output",
    "Point",
    "Rule",
    "RunDeriver",
    "StreamConfig",
    "StreamProcessor",
    "Welford",
    "Window",
    "build_app",
    "checkpoint_dir",
    "rebase",
    "offsets",
    "retire_single_file",
    "settle_heap",
    "PartitionedState",
    "committed_offsets",
    "group_id",
    "derive_all",
    "load_config",
    "load_rules",
    "parse_config",
    "parse_rules",
    "trend_class",
]
