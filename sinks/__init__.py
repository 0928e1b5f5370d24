"""Sink consumers: a small runtime and one module per sink (parquet, tensorboard, wandb, alerts).

The runtime: the consumer loop (``_loop``: poll, flush, commit, rebalance), the sink runner
(``_runtime``: decode, deduplicate, write), the records held for runs not seen yet (``_held``)
and the catch-up from the archive of a group a planned broker restart left behind
(``_catchup``).
"""

from ._archive import SCHEMA as ARCHIVE_SCHEMA
from ._archive import iter_events, read_events, read_table, run_dir, run_extent, run_projects, summary, tidy
from ._factory import KINDS as SINK_KINDS
from ._factory import make_sink
from ._loop import SinkStats
from ._process_tmp import take_temp_dir
from ._protocol import Sink
from ._runtime import Feeder, SinkRunner
from .parquet import ParquetArchive
from .tensorboard import TensorBoardSink

__all__ = [
    "ARCHIVE_SCHEMA",
    "SINK_KINDS",
    "Feeder",
    "ParquetArchive",
    "Sink",
    "SinkRunner",
    "SinkStats",
    "TensorBoardSink",
    "iter_events",
    "make_sink",
    "read_events",
    "read_table",
    "run_dir",
    "run_extent",
    "run_projects",
    "summary",
    "take_temp_dir",
    "tidy",
]
