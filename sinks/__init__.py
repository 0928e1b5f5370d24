"""Sink consumers: a small runtime and one module per sink (parquet, tensorboard, alerts)."""

from ._archive import SCHEMA as ARCHIVE_SCHEMA
from ._archive import read_events, read_table, run_dir, summary, tidy
from ._protocol import Sink
from ._runtime import SinkRunner, SinkStats
from .parquet import ParquetArchive
from .tensorboard import TensorBoardSink

__all__ = [
    "ARCHIVE_SCHEMA",
    "ParquetArchive",
    "Sink",
    "SinkRunner",
    "SinkStats",
    "TensorBoardSink",
    "read_events",
    "read_table",
    "run_dir",
    "summary",
    "tidy",
]
