"""Sink consumers: a small runtime and one module per sink (parquet here; more to come)."""

from ._archive import SCHEMA as ARCHIVE_SCHEMA
from ._archive import read_table, run_dir, summary, tidy
from ._protocol import Sink
from ._runtime import SinkRunner, SinkStats
from .parquet import ParquetArchive

__all__ = [
    "ARCHIVE_SCHEMA",
    "ParquetArchive",
    "Sink",
    "SinkRunner",
    "SinkStats",
    "read_table",
    "run_dir",
    "summary",
    "tidy",
]
